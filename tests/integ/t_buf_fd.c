// SPDX-License-Identifier: MIT
/*
 * t_buf_fd.c - kvb_buf_register_host_fd(): host memory the engine owns, registered by fd, as
 * SGLang's "allocator": "shm" host pool would be. The broker must never fault on it, so only a
 * tmpfs file sealed against shrinking is taken:
 *   - a memfd sealed F_SEAL_SHRINK registers; PUT and GET move bytes straight between it and
 *     the pool by buf+off (async ops), by pointer (kvb_put/kvb_get inside addr: no lease taken)
 *     and through a view over it; an unaligned offset maps the enclosing pages and lands bytes
 *     exactly at the offset;
 *   - an unsealed memfd is refused with -EPERM (whose text names F_SEAL_SHRINK), unless
 *     KVB_BUF_SEAL asks the library to seal it; after that nobody can truncate it (EPERM),
 *     while growing it stays allowed and harmless;
 *   - a memfd made without MFD_ALLOW_SEALING (what SGLang 0.5.23's alloc_shm creates) cannot
 *     be sealed: -EPERM with or without the flag; so is a /dev/shm file;
 *   - a file on disk (and a hugetlbfs memfd, when the kernel makes one) is -EMEDIUMTYPE;
 *   - ranges past the file, len 0, overflowing offsets, unknown flags, a pipe: refused;
 *   - unregistering leaves the caller's mapping alone.
 */
#include <fcntl.h>
#include <libgen.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "harness.h"

#define TPP 16
#define LAYERS 4
#define BPT 256
#define PB (TPP * LAYERS * BPT) /* 16 KiB */
#define FILE_LEN (1u << 20)
#define SEED 131

static uint32_t ns;

static int memfd(unsigned flags, size_t len, unsigned seals)
{
	int fd = memfd_create("t_buf_fd", MFD_CLOEXEC | flags);

	CHECK(fd >= 0);
	CHECK_OK(ftruncate(fd, (off_t)len));
	if (seals)
		CHECK_OK(fcntl(fd, F_ADD_SEALS, seals));
	return fd;
}

static uint8_t *map(int fd, size_t len)
{
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	CHECK(p != MAP_FAILED);
	return p;
}

/* One async op, waited for; returns its res. */
static int op1(kvb_client *c, uint32_t opcode, uint32_t flags, uint32_t buf, kvb_key key,
	       uint64_t off)
{
	struct kvb_op op = {.opcode = opcode,
			    .flags = flags,
			    .ns = ns,
			    .buf = buf,
			    .key = key,
			    .off = off,
			    .user_data = 77};
	struct kvb_completion cqe;

	CHECK_RC(kvb_submit(c, &op, 1), 1);
	CHECK_RC(kvb_reap(c, &cqe, 1, 1, 10000), 1);
	CHECK_EQ(cqe.user_data, 77);
	return cqe.res;
}

static void sealed_memfd(kvb_client *c)
{
	int fd = memfd(MFD_ALLOW_SEALING, FILE_LEN, F_SEAL_SHRINK);
	uint8_t *m = map(fd, FILE_LEN), *out = malloc(PB);
	kvb_key k1 = harness_key(SEED, 1), k2 = harness_key(SEED, 2);
	uint64_t acq;
	uint32_t buf;

	CHECK(out != NULL);
	CHECK_OK(kvb_buf_register_host_fd(c, fd, 0, FILE_LEN, m, 0, &buf));
	close(fd); /* the broker holds its own reference */

	/* buf+off: the broker reads the file at 4096 and writes it back at 65536. */
	harness_fill(m + 4096, PB, &k1, SEED);
	CHECK_RC(op1(c, KVB_OP_PUT, 0, buf, k1, 4096), 0);
	memset(m + 65536, 0, PB);
	CHECK_RC(op1(c, KVB_OP_GET, 0, buf, k1, 65536), PB);
	CHECK(harness_verify(m + 65536, PB, &k1, SEED, "async GET into the fd buffer") == 0);
	CHECK_RC(kvb_get(c, ns, k1, out, PB), PB);
	CHECK(harness_verify(out, PB, &k1, SEED, "page PUT from the fd buffer") == 0);

	/* Pointers inside addr: found by the library, copied by the broker, no lease. */
	harness_fill(m + 8192, PB, &k2, SEED);
	CHECK_RC(kvb_put(c, ns, k2, m + 8192, PB), 0);
	acq = harness_stat(c, "counters.acquires");
	memset(m + 200000, 0, PB);
	CHECK_RC(kvb_get(c, ns, k2, m + 200000, PB), PB);
	CHECK(harness_verify(m + 200000, PB, &k2, SEED, "kvb_get into the fd buffer") == 0);
	CHECK_EQ(harness_stat(c, "counters.acquires"), acq);

	/* Off the end of the registered range. */
	CHECK_RC(op1(c, KVB_OP_GET, 0, buf, k1, FILE_LEN - PB + 1), -EFAULT);

	/* A view over it: LAYERS parts, token-major records of LAYERS * BPT bytes. */
	{
		struct kvb_view_part parts[LAYERS];
		uint32_t view;
		uint8_t page[PB];

		for (uint32_t l = 0; l < LAYERS; l++)
			parts[l] = (struct kvb_view_part){
				.buf = buf, .stride = LAYERS * BPT, .base = 300000 + l * BPT};
		CHECK_OK(kvb_view_create(c, ns, parts, LAYERS, &view));
		memset(m + 300000, 0xee, 64 * LAYERS * BPT);
		CHECK_RC(kvb_view_get(c, view, k1, 32, 0, 0), PB);
		/* Slot 32 + t, layer l holds page bytes [l][t]. */
		for (uint32_t l = 0; l < LAYERS; l++)
			for (uint32_t t = 0; t < TPP; t++)
				memcpy(page + (l * TPP + t) * BPT,
				       m + 300000 + (32 + t) * LAYERS * BPT + l * BPT, BPT);
		CHECK(harness_verify(page, PB, &k1, SEED, "view GET over the fd buffer") == 0);
		CHECK_EQ(m[300000 + 31 * LAYERS * BPT], 0xee);
		CHECK_EQ(m[300000 + 48 * LAYERS * BPT], 0xee);
		CHECK_OK(kvb_view_destroy(c, view));
	}

	/* Unregistering leaves our mapping (the library never mapped it). */
	CHECK_OK(kvb_buf_unregister(c, buf));
	CHECK(harness_verify(m + 65536, PB, &k1, SEED, "caller's mapping after unregister") == 0);
	m[0] = 1;
	munmap(m, FILE_LEN);
	free(out);
	harness_log("sealed memfd: buf+off, pointers, views, unregister ok");
}

static void unaligned_offset(kvb_client *c)
{
	int fd = memfd(MFD_ALLOW_SEALING, FILE_LEN, F_SEAL_SHRINK | F_SEAL_GROW);
	uint8_t *m = map(fd, FILE_LEN), *out = malloc(PB);
	kvb_key k = harness_key(SEED, 3);
	uint32_t buf;

	CHECK(out != NULL);
	/* Registered from byte 4196 of the file (4096 + 100): buf offset 0 is that byte. */
	CHECK_OK(kvb_buf_register_host_fd(c, fd, 4196, 3 * PB, m + 4196, 0, &buf));
	memset(m, 0x5a, FILE_LEN);
	harness_fill(m + 4196 + PB, PB, &k, SEED);
	CHECK_RC(op1(c, KVB_OP_PUT, 0, buf, k, PB), 0);
	CHECK_RC(kvb_get(c, ns, k, out, PB), PB);
	CHECK(harness_verify(out, PB, &k, SEED, "PUT at an unaligned file offset") == 0);
	CHECK_RC(op1(c, KVB_OP_GET, 0, buf, k, 2 * PB), PB);
	CHECK(harness_verify(m + 4196 + 2 * PB, PB, &k, SEED, "GET at an unaligned offset") == 0);
	/* Nothing before or after the page moved. */
	CHECK_EQ(m[4196 + PB - 1], 0x5a);
	CHECK_EQ(m[4196 + 3 * PB], 0x5a);
	/* The range is len bytes from the offset, not from the page start. */
	CHECK_RC(op1(c, KVB_OP_GET, 0, buf, k, 2 * PB + 1), -EFAULT);
	CHECK_OK(kvb_buf_unregister(c, buf));
	/* Ranges reaching the file's end exactly, and one byte past it. */
	CHECK_OK(kvb_buf_register_host_fd(c, fd, FILE_LEN - PB - 7, PB + 7, NULL, 0, &buf));
	CHECK_OK(kvb_buf_unregister(c, buf));
	CHECK_RC(kvb_buf_register_host_fd(c, fd, FILE_LEN - PB, PB + 1, NULL, 0, &buf), -EFAULT);
	CHECK_RC(kvb_buf_register_host_fd(c, fd, FILE_LEN, 1, NULL, 0, &buf), -EFAULT);
	CHECK_RC(kvb_buf_register_host_fd(c, fd, UINT64_MAX - 10, 100, NULL, 0, &buf), -EINVAL);
	CHECK_RC(kvb_buf_register_host_fd(c, fd, 0, 0, NULL, 0, &buf), -EINVAL);
	CHECK_RC(kvb_buf_register_host_fd(c, fd, 0, PB, NULL, 1u << 7, &buf), -EINVAL);
	CHECK_RC(kvb_buf_register_host_fd(c, -1, 0, PB, NULL, 0, &buf), -EINVAL);
	munmap(m, FILE_LEN);
	close(fd);
	free(out);
	harness_log("unaligned offsets and bad ranges ok");
}

static void seals(kvb_client *c)
{
	int fd = memfd(MFD_ALLOW_SEALING, FILE_LEN, 0), sgl, pfd[2];
	const char *txt = kvb_strerror(-EPERM);
	uint8_t *m;
	uint32_t buf;
	kvb_key k = harness_key(SEED, 4);

	/* Unsealed: refused, and the error says which seal is missing. */
	CHECK_RC(kvb_buf_register_host_fd(c, fd, 0, FILE_LEN, NULL, 0, &buf), -EPERM);
	CHECKF(strstr(txt, "F_SEAL_SHRINK") != NULL, "kvb_strerror(-EPERM) = \"%s\"", txt);
	CHECK_EQ(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK, 0); /* refusing did not seal it */

	/* KVB_BUF_SEAL: sealed at registration, then no one can shrink it. */
	m = map(fd, FILE_LEN);
	CHECK_OK(kvb_buf_register_host_fd(c, fd, 0, FILE_LEN, m, KVB_BUF_SEAL, &buf));
	CHECK(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK);
	CHECK_EQ(ftruncate(fd, FILE_LEN / 2), -1);
	CHECK_EQ(errno, EPERM);
	CHECK_EQ(ftruncate(fd, 0), -1);
	CHECK_OK(ftruncate(fd, 2 * FILE_LEN)); /* growing is harmless, and allowed */
	harness_fill(m + FILE_LEN - PB, PB, &k, SEED);
	CHECK_RC(kvb_put(c, ns, k, m + FILE_LEN - PB, PB), 0);
	memset(m, 0, PB);
	CHECK_RC(kvb_get(c, ns, k, m, PB), PB);
	CHECK(harness_verify(m, PB, &k, SEED, "GET into a memfd sealed on request") == 0);
	CHECK_OK(kvb_buf_unregister(c, buf));
	/* Already sealed: the flag is a no-op. */
	CHECK_OK(kvb_buf_register_host_fd(c, fd, 0, FILE_LEN, NULL, KVB_BUF_SEAL, &buf));
	CHECK_OK(kvb_buf_unregister(c, buf));
	munmap(m, FILE_LEN);
	close(fd);

	/* SGLang 0.5.23's alloc_shm: memfd_create(name, MFD_CLOEXEC), no MFD_ALLOW_SEALING. */
	sgl = memfd(0, FILE_LEN, 0);
	CHECK_RC(kvb_buf_register_host_fd(c, sgl, 0, FILE_LEN, NULL, 0, &buf), -EPERM);
	CHECK_RC(kvb_buf_register_host_fd(c, sgl, 0, FILE_LEN, NULL, KVB_BUF_SEAL, &buf), -EPERM);
	CHECK_OK(ftruncate(sgl, FILE_LEN / 2)); /* which is why: it can still shrink */
	close(sgl);

	/* Its /dev/shm fallback: a tmpfs file, which can never be sealed either. */
	{
		char path[] = "/dev/shm/t_buf_fd_XXXXXX";
		int sh = mkstemp(path);

		if (sh >= 0) {
			unlink(path);
			CHECK_OK(ftruncate(sh, FILE_LEN));
			CHECK_RC(kvb_buf_register_host_fd(c, sh, 0, FILE_LEN, NULL, KVB_BUF_SEAL,
							  &buf),
				 -EPERM);
			close(sh);
		} else {
			harness_log("no /dev/shm here: that case skipped");
		}
	}

	/* Not a file at all. */
	CHECK_OK(pipe(pfd));
	CHECK_RC(kvb_buf_register_host_fd(c, pfd[0], 0, 1, NULL, 0, &buf), -EINVAL);
	close(pfd[0]);
	close(pfd[1]);
	harness_log("seals: refused, sealed on request, truncation refused, unsealable refused");
}

static void not_tmpfs(kvb_client *c, const char *dir)
{
	char path[4096];
	struct statfs sfs;
	uint32_t buf;
	int fd;

	snprintf(path, sizeof(path), "%s/t_buf_fd.XXXXXX", dir);
	fd = mkstemp(path);
	CHECK(fd >= 0);
	unlink(path);
	CHECK_OK(ftruncate(fd, FILE_LEN));
	CHECK_OK(fstatfs(fd, &sfs));
	if (sfs.f_type == TMPFS_MAGIC)
		harness_log("%s is tmpfs: the disk-file case is skipped", dir);
	else
		CHECK_RC(kvb_buf_register_host_fd(c, fd, 0, FILE_LEN, NULL, KVB_BUF_SEAL, &buf),
			 -EMEDIUMTYPE);
	close(fd);

	fd = memfd_create("t_buf_fd_huge", MFD_CLOEXEC | MFD_HUGETLB | MFD_ALLOW_SEALING);
	if (fd >= 0 && ftruncate(fd, 2u << 20) == 0) {
		(void)fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK);
		CHECK_RC(kvb_buf_register_host_fd(c, fd, 0, 2u << 20, NULL, 0, &buf), -EMEDIUMTYPE);
	} else {
		harness_log("no hugetlbfs memfd here: that case skipped");
	}
	if (fd >= 0)
		close(fd);
	harness_log("non-tmpfs files refused with -EMEDIUMTYPE");
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	kvb_client *c;
	size_t pb;
	char *dir = strdup(argv[0]);

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M");
	c = harness_connect(b, "t_buf_fd", 0);
	harness_layout(&l, "test/buf-fd", KVB_LAYOUT_MLA, TPP, 1, 0, LAYERS, BPT);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK_EQ(pb, PB);

	sealed_memfd(c);
	unaligned_offset(c);
	seals(c);
	not_tmpfs(c, dirname(dir));

	/* The broker is fine and still serving. */
	CHECK_OK(kvb_nop(c));
	kvb_close(c);
	harness_broker_stop(b);
	free(dir);
	return H_PASS;
}
