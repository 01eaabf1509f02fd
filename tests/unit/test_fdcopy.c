// SPDX-License-Identifier: MIT
/*
 * test_fdcopy.c - KVB_BUF_FDCOPY buffers below the protocol (broker/fdcopy.c): a job's segments
 * that fall in a file buffer's placeholder range resolve to (fd, offset) and move with
 * preadv/pwritev, byte-exact, with memory segments in between and runs longer than one call's
 * iovecs; a file shrunk under the range fails -EFAULT both ways and a GET never grows it; the
 * client turning O_APPEND on changes nothing (the broker writes through its own reopen), and
 * where the broker has to share the client's description, O_APPEND fails a GET without
 * writing; an fd not open read-write is refused.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "broker.h"

#define FLEN (256u << 10)
#define OFF 100 /* the registered range starts here in the file: any alignment */

/* SGLang 0.5.23's alloc_shm memfd: MFD_CLOEXEC only, so it can never be sealed. */
static int sgl_memfd(void)
{
	int fd = memfd_create("sglang_host_pool_test", MFD_CLOEXEC);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, FLEN), 0);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), -1);
	return fd;
}

static uint8_t pat(uint64_t i)
{
	return (uint8_t)(i * 131 + 7);
}

static struct session *sess_with(int fd, uint32_t id)
{
	struct session *s = calloc(1, sizeof(*s));

	assert_non_null(s);
	assert_int_equal(fdcopy_buf_open(fd, OFF, FLEN - OFF, &s->bufs[id]), 0);
	s->nfdbufs = 1;
	return s;
}

static void sess_free(struct session *s, uint32_t id)
{
	fdcopy_buf_close(&s->bufs[id]);
	free(s);
}

static off_t fsize(int fd)
{
	struct stat st;

	assert_int_equal(fstat(fd, &st), 0);
	return st.st_size;
}

/*
 * Segments: file [0, 4096) <-> pool[0..], then a memory segment, then file [4096, 4096 + 8192)
 * <-> pool[20000..] (contiguous in the file, not in the pool: one pwritev/preadv of two
 * iovecs together with the first), then file [60000, +1000) <-> pool[40000..].
 */
static uint32_t make_segs(struct copy_seg *sg, uint8_t *base, uint8_t *pool, uint8_t *mem,
			  int to_pool)
{
	struct {
		uint8_t *cl, *pl;
		uint64_t len;
	} r[4] = {{base, pool, 4096},
		  {mem, pool + 10000, 512},
		  {base + 4096, pool + 20000, 8192},
		  {base + 60000, pool + 40000, 1000}};

	/* Order: file, file (contiguous with it), memory, file. */
	int order[4] = {0, 2, 1, 3};

	for (int i = 0; i < 4; i++) {
		int k = order[i];

		sg[i] = to_pool ? (struct copy_seg){r[k].pl, r[k].cl, r[k].len}
				: (struct copy_seg){r[k].cl, r[k].pl, r[k].len};
	}
	return 4;
}

static void test_fdcopy_put_get(void **state)
{
	int fd = sgl_memfd();
	struct session *s = sess_with(fd, 3);
	uint8_t *base = s->bufs[3].base, *pool = calloc(1, 65536), *mem = malloc(512);
	uint8_t *file = malloc(FLEN);
	struct copy_seg sg[4];
	struct copy_fdseg room[4];
	struct copy_job j = {.dir = COPY_TO_POOL, .segs = sg};

	(void)state;
	assert_non_null(pool);
	assert_non_null(mem);
	assert_non_null(file);
	for (uint64_t i = 0; i < FLEN; i++)
		file[i] = pat(i);
	assert_int_equal(pwrite(fd, file, FLEN, 0), FLEN);
	memset(mem, 0x42, 512);

	/* PUT: file -> pool. */
	j.nsegs = make_segs(sg, base, pool, mem, 1);
	fdcopy_resolve(s, &j, room);
	assert_ptr_equal(j.fds, room);
	assert_int_equal(room[0].off, OFF);
	assert_int_equal(room[1].off, OFF + 4096);
	assert_int_equal(room[2].fd, -1);
	assert_int_equal(room[3].off, OFF + 60000);
	assert_int_equal(fdcopy_run(&j), 0);
	assert_memory_equal(pool, file + OFF, 4096);
	assert_memory_equal(pool + 20000, file + OFF + 4096, 8192);
	assert_memory_equal(pool + 40000, file + OFF + 60000, 1000);
	assert_int_equal(pool[10000], 0x42);

	/* GET: pool -> file, elsewhere in the pool's content, then read the file back. */
	for (uint32_t i = 0; i < 65536; i++)
		pool[i] = (uint8_t)~pat(i);
	j = (struct copy_job){.dir = COPY_FROM_POOL, .segs = sg};
	j.nsegs = make_segs(sg, base, pool, mem, 0);
	fdcopy_resolve(s, &j, room);
	assert_int_equal(fdcopy_run(&j), 0);
	assert_int_equal(pread(fd, file, FLEN, 0), FLEN);
	assert_memory_equal(file + OFF, pool, 4096);
	assert_memory_equal(file + OFF + 4096, pool + 20000, 8192);
	assert_memory_equal(file + OFF + 60000, pool + 40000, 1000);
	assert_int_equal(file[OFF + 4096 + 8192], pat(OFF + 4096 + 8192)); /* untouched */
	assert_memory_equal(mem, pool + 10000, 512);
	assert_int_equal(fsize(fd), FLEN);

	/* A job that touches no file buffer gets no fds. */
	j = (struct copy_job){.dir = COPY_TO_POOL, .segs = sg, .nsegs = 1};
	sg[0] = (struct copy_seg){pool, mem, 512};
	fdcopy_resolve(s, &j, room);
	assert_null(j.fds);

	sess_free(s, 3);
	close(fd);
	free(pool);
	free(mem);
	free(file);
}

/* 300 segments, each 16 bytes of the file apart in the pool: several calls of FDCOPY_IOV. */
static void test_fdcopy_long_run(void **state)
{
	int fd = sgl_memfd();
	struct session *s = sess_with(fd, 0);
	uint8_t *base = s->bufs[0].base, *pool = calloc(300, 32), *file = malloc(300 * 16);
	struct copy_seg sg[300];
	struct copy_fdseg room[300];
	struct copy_job j = {.dir = COPY_FROM_POOL, .segs = sg, .nsegs = 300};

	(void)state;
	assert_non_null(pool);
	assert_non_null(file);
	for (uint32_t i = 0; i < 300 * 32; i++)
		pool[i] = pat(i);
	for (uint32_t i = 0; i < 300; i++)
		sg[i] = (struct copy_seg){base + 1000 + i * 16, pool + i * 32, 16};
	fdcopy_resolve(s, &j, room);
	assert_int_equal(fdcopy_run(&j), 0);
	assert_int_equal(pread(fd, file, 300 * 16, OFF + 1000), 300 * 16);
	for (uint32_t i = 0; i < 300; i++)
		assert_memory_equal(file + i * 16, pool + i * 32, 16);

	memset(pool, 0, 300 * 32);
	j.dir = COPY_TO_POOL;
	for (uint32_t i = 0; i < 300; i++)
		sg[i] = (struct copy_seg){pool + i * 32, base + 1000 + i * 16, 16};
	fdcopy_resolve(s, &j, room);
	assert_int_equal(fdcopy_run(&j), 0);
	for (uint32_t i = 0; i < 300; i++)
		assert_memory_equal(file + i * 16, pool + i * 32, 16);
	sess_free(s, 0);
	close(fd);
	free(pool);
	free(file);
}

static void test_fdcopy_truncated(void **state)
{
	int fd = sgl_memfd();
	struct session *s = sess_with(fd, 1);
	uint8_t *base = s->bufs[1].base, *pool = calloc(1, 65536);
	struct copy_seg sg[1];
	struct copy_fdseg room[1];
	struct copy_job j = {.dir = COPY_TO_POOL, .segs = sg, .nsegs = 1};

	(void)state;
	assert_non_null(pool);
	/* The engine cuts its file to 32 KiB: a 64 KiB page from the start no longer fits. */
	assert_int_equal(ftruncate(fd, 32768), 0);
	sg[0] = (struct copy_seg){pool, base, 65536};
	fdcopy_resolve(s, &j, room);
	assert_int_equal(fdcopy_run(&j), -EFAULT);
	/* Wholly past the end: EOF at once. */
	sg[0] = (struct copy_seg){pool, base + 100000, 4096};
	fdcopy_resolve(s, &j, room);
	assert_int_equal(fdcopy_run(&j), -EFAULT);
	/* Inside what is left: fine. */
	sg[0] = (struct copy_seg){pool, base, 1000};
	fdcopy_resolve(s, &j, room);
	assert_int_equal(fdcopy_run(&j), 0);

	/* GETs past the end fail without writing: the file does not grow. */
	j.dir = COPY_FROM_POOL;
	sg[0] = (struct copy_seg){base, pool, 65536};
	fdcopy_resolve(s, &j, room);
	assert_int_equal(fdcopy_run(&j), -EFAULT);
	sg[0] = (struct copy_seg){base + 100000, pool, 4096};
	fdcopy_resolve(s, &j, room);
	assert_int_equal(fdcopy_run(&j), -EFAULT);
	assert_int_equal(fsize(fd), 32768);
	sg[0] = (struct copy_seg){base, pool, 1000};
	fdcopy_resolve(s, &j, room);
	assert_int_equal(fdcopy_run(&j), 0);
	assert_int_equal(fsize(fd), 32768);

	/* Truncated to nothing, grown back: served again. */
	assert_int_equal(ftruncate(fd, 0), 0);
	assert_int_equal(fdcopy_run(&j), -EFAULT);
	assert_int_equal(fsize(fd), 0);
	assert_int_equal(ftruncate(fd, FLEN), 0);
	assert_int_equal(fdcopy_run(&j), 0);
	sess_free(s, 1);
	close(fd);
	free(pool);
}

static void test_fdcopy_append_and_modes(void **state)
{
	int fd = sgl_memfd(), ro, fl;
	struct session *s = sess_with(fd, 2);
	uint8_t *base = s->bufs[2].base, pool[4096], back[4096];
	struct copy_seg sg[1] = {{base + 8192, pool, sizeof(pool)}};
	struct copy_fdseg room[1];
	struct copy_job j = {.dir = COPY_FROM_POOL, .segs = sg, .nsegs = 1};
	struct sbuf sb;
	char path[40];

	(void)state;
	for (uint32_t i = 0; i < sizeof(pool); i++)
		pool[i] = pat(i + 5);
	/* The client turns O_APPEND on after registering: we write through our own open. */
	fl = fcntl(fd, F_GETFL);
	assert_int_equal(fcntl(fd, F_SETFL, fl | O_APPEND), 0);
	fdcopy_resolve(s, &j, room);
	assert_int_equal(room[0].flags & COPY_FD_SHARED, 0);
	assert_int_equal(fdcopy_run(&j), 0);
	assert_int_equal(fsize(fd), FLEN);
	assert_int_equal(pread(fd, back, sizeof(back), OFF + 8192), sizeof(back));
	assert_memory_equal(back, pool, sizeof(pool));
	sess_free(s, 2);

	/* Read-only descriptions are refused; so is O_APPEND... only when we must share it. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ro = open(path, O_RDONLY);
	assert_true(ro >= 0);
	assert_int_equal(fdcopy_buf_open(ro, 0, 4096, &sb), -EBADF);
	close(ro);
	assert_int_equal(fdcopy_buf_open(fd, 0, 4096, &sb), 0); /* O_APPEND, but reopened */
	assert_int_equal(sb.fdb != NULL, 1);
	fdcopy_buf_close(&sb);

	/* Where the reopen was refused, the client's description: O_APPEND fails the GET. */
	{
		struct copy_fdseg shared = {.fd = fd, .flags = COPY_FD_SHARED, .off = 8192};

		j = (struct copy_job){
			.dir = COPY_FROM_POOL, .segs = sg, .nsegs = 1, .fds = &shared};
		assert_int_equal(fdcopy_run(&j), -EFAULT);
		assert_int_equal(fsize(fd), FLEN); /* nothing appended */
		assert_int_equal(fcntl(fd, F_SETFL, fl), 0);
		assert_int_equal(fdcopy_run(&j), 0);
		assert_int_equal(fsize(fd), FLEN);
		j.dir = COPY_TO_POOL; /* reads never cared */
		sg[0] = (struct copy_seg){back, base, sizeof(back)};
		memset(back, 0, sizeof(back));
		assert_int_equal(fdcopy_run(&j), 0);
		assert_memory_equal(back, pool, sizeof(pool));
	}
	close(fd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fdcopy_put_get),
		cmocka_unit_test(test_fdcopy_long_run),
		cmocka_unit_test(test_fdcopy_truncated),
		cmocka_unit_test(test_fdcopy_append_and_modes),
	};

	return cmocka_run_group_tests_name("fdcopy", tests, NULL, NULL);
}
