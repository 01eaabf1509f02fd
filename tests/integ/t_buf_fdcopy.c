// SPDX-License-Identifier: MIT
/*
 * t_buf_fdcopy.c - KVB_BUF_FDCOPY: SGLang 0.5.23's "allocator": "shm" host pool, which can never
 * be sealed, registered zero-copy anyway. The broker copies with pread/pwrite on the file, so
 * nothing the engine does to its file can make the broker fault:
 *   - a memfd made exactly as alloc_shm makes it (memfd_create with MFD_CLOEXEC only, ftruncate
 *     to whole pages, mmap MAP_SHARED) registers with the flag (KVB_BUF_SEAL | KVB_BUF_FDCOPY
 *     too: the seal fails, the flag takes over) and is still -EPERM without it;
 *   - PUT and GET are byte-exact by pointer (kvb_put/kvb_get inside addr) and batched by
 *     buf+off (kvb_submit/kvb_reap), for pages the loop thread copies inline and pages larger
 *     than --copy-inline that the workers copy (the copy.queued_jobs counter proves it; GETs
 *     into the file always go to the workers: a write takes the file's inode lock);
 *   - through kvb_view_create2 views in SGLang's page_first_direct layouts (MLA
 *     [page][layer][ps][bytes]; MHA [2][page][layer][ps][bytes]), slots aligned and straddling
 *     two pages;
 *   - the engine truncates its memfd after registering: PUTs of bytes past the new end fail
 *     -EFAULT and store nothing (LOOKUP misses), GETs there fail -EFAULT without growing the
 *     file (st_size stays what the engine left), ops inside what is left work, and once the
 *     file is grown back everything works again; a second client is served throughout;
 *   - a child truncating and regrowing the file in a tight loop while PUTs and GETs run: every
 *     op ends 0/EXISTED, page bytes or -EFAULT, the broker lives, the file never grows past
 *     the size the engine gave it;
 *   - the /dev/shm fallback (an unlinked tmpfs file) works the same;
 *   - an fd opened read-only is -EBADF.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define TPP 16
#define LAYERS 4
#define BPT 256
#define PB (TPP * LAYERS * BPT) /* 16 KiB: inline (--copy-inline 64K) */
#define BIG_TPP 64
#define BIG_LAYERS 8
#define BIG_BPT 1152
#define BIG_PB (BIG_TPP * BIG_LAYERS * BIG_BPT) /* 576 KiB: on a worker */
#define T 128					/* MHA bytes per token per layer */
#define MHA_PB (2 * LAYERS * TPP * T)		/* 16 KiB */
#define NPAGES 16
#define SEED 977

static uint32_t ns_small, ns_big, ns_mha;

/* SGLang 0.5.23 mmap_allocator.py alloc_shm(): memfd_create(name, MFD_CLOEXEC), no sealing. */
static uint8_t *sgl_alloc(size_t n, int *fd)
{
	long pg = sysconf(_SC_PAGESIZE);
	size_t len = (n + (size_t)pg - 1) / (size_t)pg * (size_t)pg;
	uint8_t *m;

	*fd = memfd_create("sglang_host_pool_t_buf_fdcopy", MFD_CLOEXEC);
	CHECK(*fd >= 0);
	CHECK_OK(ftruncate(*fd, (off_t)len));
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, *fd, 0);
	CHECK(m != MAP_FAILED);
	return m;
}

/* Its fallback: an O_CREAT file in /dev/shm, unlinked at once. NULL when there is none. */
static uint8_t *shm_alloc(size_t n, int *fd)
{
	char path[] = "/dev/shm/t_buf_fdcopy_XXXXXX";
	uint8_t *m;

	*fd = mkstemp(path);
	if (*fd < 0)
		return NULL;
	unlink(path);
	CHECK_OK(ftruncate(*fd, (off_t)n));
	m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, *fd, 0);
	CHECK(m != MAP_FAILED);
	return m;
}

static off_t fsize(int fd)
{
	struct stat st;

	CHECK_OK(fstat(fd, &st));
	return st.st_size;
}

static void reap_all(kvb_client *c, struct kvb_completion *cq, int n)
{
	for (int got = 0; got < n;) {
		int r = kvb_reap(c, cq + got, (size_t)(n - got), 1, 10000);

		CHECK_GT(r, 0);
		got += r;
	}
}

/* Pointer and batched PUT/GET of pages of pb bytes in [m, m + NPAGES * pb) (buffer buf). */
static void putget(kvb_client *c, uint32_t ns, size_t pb, uint8_t *m, uint32_t buf,
		   const char *what, uint64_t seed)
{
	struct kvb_op ops[6];
	struct kvb_completion cq[6];
	uint8_t *out = malloc(pb);
	kvb_key k = harness_key(seed, 0);

	CHECK(out != NULL);
	/* By pointer: found inside addr, copied by the broker through the file. */
	harness_fill(m + pb, pb, &k, seed);
	CHECK_RC(kvb_put(c, ns, k, m + pb, pb), 0);
	CHECK_RC(kvb_get(c, ns, k, out, pb), (long long)pb);
	CHECK(harness_verify(out, pb, &k, seed, what) == 0);
	memset(m + 3 * pb, 0, pb);
	CHECK_RC(kvb_get(c, ns, k, m + 3 * pb, pb), (long long)pb);
	CHECK(harness_verify(m + 3 * pb, pb, &k, seed, what) == 0);
	CHECK_EQ(m[4 * pb], 0); /* nothing after it */

	/* Batched by buf+off: six PUTs from pages 4..9, six GETs into pages 10..15. */
	for (int i = 0; i < 6; i++) {
		kvb_key ki = harness_key(seed, 1 + (uint64_t)i);

		harness_fill(m + (4 + i) * pb, pb, &ki, seed);
		ops[i] = (struct kvb_op){.opcode = KVB_OP_PUT,
					 .ns = ns,
					 .buf = buf,
					 .key = ki,
					 .off = (4 + i) * pb,
					 .user_data = (uint64_t)i};
	}
	CHECK_RC(kvb_submit(c, ops, 6), 6);
	reap_all(c, cq, 6);
	for (int i = 0; i < 6; i++)
		CHECK_RC(cq[i].res, 0);
	memset(m + 10 * pb, 0, 6 * pb);
	for (int i = 0; i < 6; i++) {
		ops[i].opcode = KVB_OP_GET;
		ops[i].off = (10 + i) * pb;
	}
	CHECK_RC(kvb_submit(c, ops, 6), 6);
	reap_all(c, cq, 6);
	for (int i = 0; i < 6; i++) {
		uint64_t u = cq[i].user_data;
		kvb_key ki = harness_key(seed, 1 + u);

		CHECK_RC(cq[i].res, (long long)pb);
		CHECK(harness_verify(m + (10 + u) * pb, pb, &ki, seed, what) == 0);
	}
	free(out);
}

static void basic(kvb_client *c, int shm)
{
	int fd;
	uint8_t *m = shm ? shm_alloc(NPAGES * BIG_PB, &fd) : sgl_alloc(NPAGES * BIG_PB, &fd);
	uint64_t q0 = harness_stat(c, "copy.queued_jobs");
	off_t size;
	uint32_t buf;

	if (!m) {
		harness_log("no /dev/shm here: the fallback case is skipped");
		return;
	}
	size = fsize(fd);
	/* Unsealable: refused without the flag, with or without KVB_BUF_SEAL. */
	CHECK_RC(kvb_buf_register_host_fd(c, fd, 0, (size_t)size, m, 0, &buf), -EPERM);
	CHECK_RC(kvb_buf_register_host_fd(c, fd, 0, (size_t)size, m, KVB_BUF_SEAL, &buf), -EPERM);
	CHECK_OK(kvb_buf_register_host_fd(c, fd, 0, (size_t)size, m, KVB_BUF_SEAL | KVB_BUF_FDCOPY,
					  &buf));
	CHECK_EQ(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK, 0);

	putget(c, ns_small, PB, m, buf, shm ? "shm small page" : "memfd small page",
	       SEED + 2 * (uint64_t)shm);
	/*
	 * GETs into the file never run on the loop thread (a write takes the file's inode lock,
	 * which its owner can hold): the 7 small ones into m went to the workers too.
	 */
	CHECK_GE(harness_stat(c, "copy.queued_jobs"), q0 + 7);
	q0 = harness_stat(c, "copy.queued_jobs");
	putget(c, ns_big, BIG_PB, m, buf, shm ? "shm large page" : "memfd large page",
	       SEED + 1 + 2 * (uint64_t)shm);
	/* The large pages went to the copy workers (> --copy-inline): 7 PUTs, 7 GETs into m. */
	CHECK_GE(harness_stat(c, "copy.queued_jobs"), q0 + 14);
	CHECK_EQ(fsize(fd), size);
	CHECK_OK(kvb_buf_unregister(c, buf));
	munmap(m, (size_t)size);
	close(fd);
	harness_log("%s: pointer and batched PUT/GET, inline and on workers, byte-exact",
		    shm ? "/dev/shm fallback" : "SGLang memfd");
}

/* page_first_direct: MLA [page][layer][ps][BPT], MHA [2][page][layer][ps][T]. */
static uint8_t *pfd_at(uint8_t *m, int mha, uint32_t c, uint32_t l, uint64_t s)
{
	uint64_t p = s / TPP, i = s % TPP;

	if (!mha)
		return m + ((p * LAYERS + l) * TPP + i) * BPT;
	return m + ((((uint64_t)c * NPAGES + p) * LAYERS + l) * TPP + i) * T;
}

static void views(kvb_client *c, int mha)
{
	uint32_t ns = mha ? ns_mha : ns_small, bpt = mha ? T : BPT,
		 nparts = mha ? 2 * LAYERS : LAYERS;
	size_t pb = mha ? MHA_PB : PB, len = NPAGES * pb;
	struct kvb_view_part2 parts[2 * LAYERS];
	uint8_t *page = malloc(pb), *out = malloc(pb);
	uint64_t slots[2] = {3 * TPP, 7 * TPP + 5}; /* aligned; straddling pages 7 and 8 */
	uint32_t buf, view;
	int fd;
	uint8_t *m = sgl_alloc(len, &fd);

	CHECK(page != NULL && out != NULL);
	CHECK_OK(kvb_buf_register_host_fd(c, fd, 0, len, m, KVB_BUF_FDCOPY, &buf));
	memset(parts, 0, sizeof(parts));
	for (uint32_t p = 0; p < nparts; p++) {
		uint32_t cc = p / LAYERS, l = p % LAYERS;

		parts[p].buf = buf;
		parts[p].stride = bpt;
		parts[p].base = (uint64_t)(pfd_at(m, mha, cc, l, 0) - m);
		parts[p].page_stride = (uint64_t)LAYERS * TPP * bpt;
	}
	CHECK_OK(kvb_view_create2(c, ns, parts, nparts, 0, &view));
	for (int si = 0; si < 2; si++) {
		uint64_t s = slots[si];
		kvb_key k = harness_key(SEED + 10 + (uint64_t)mha, (uint64_t)si);

		/* The engine writes the page into its layout; a view PUT stores canonical bytes. */
		memset(m, 0xee, len);
		harness_fill(page, pb, &k, SEED);
		for (uint32_t p = 0; p < nparts; p++)
			for (uint32_t t = 0; t < TPP; t++)
				memcpy(pfd_at(m, mha, p / LAYERS, p % LAYERS, s + t),
				       page + ((uint64_t)p * TPP + t) * bpt, bpt);
		CHECK_RC(kvb_view_put(c, view, k, s), 0);
		CHECK_RC(kvb_get(c, ns, k, out, pb), (long long)pb);
		CHECK(harness_verify(out, pb, &k, SEED, "canonical page of a view PUT") == 0);
		/* A view GET scatters it back, into slots 4 pages further on, and nothing else. */
		memset(m, 0xee, len);
		CHECK_RC(kvb_view_get(c, view, k, s + 4 * TPP, 0, 0), (long long)pb);
		for (uint32_t p = 0; p < nparts; p++)
			for (uint32_t t = 0; t < TPP; t++) {
				uint8_t *at = pfd_at(m, mha, p / LAYERS, p % LAYERS,
						     s + 4 * TPP + t);

				CHECK(memcmp(at, page + ((uint64_t)p * TPP + t) * bpt, bpt) == 0);
				memset(at, 0xee, bpt);
			}
		for (size_t i = 0; i < len; i++)
			CHECKF(m[i] == 0xee, "byte %zu outside the page written", i);
	}
	CHECK_OK(kvb_view_destroy(c, view));
	CHECK_OK(kvb_buf_unregister(c, buf));
	munmap(m, len);
	close(fd);
	free(page);
	free(out);
	harness_log("page_first_direct %s views over an unsealed memfd ok", mha ? "MHA" : "MLA");
}

/* The engine truncates its file under registered pages; another client keeps being served. */
static void truncated(kvb_client *c, kvb_client *other, uint32_t ns, size_t pb)
{
	size_t len = NPAGES * pb;
	int fd;
	uint8_t *m = sgl_alloc(len, &fd), *out = malloc(pb), *obuf;
	kvb_key k0 = harness_key(SEED + 20, pb), k1 = harness_key(SEED + 21, pb),
		k2 = harness_key(SEED + 22, pb);
	uint32_t buf, obid;
	size_t hits;

	CHECK(out != NULL);
	obuf = kvb_buf_alloc_host(other, pb, &obid);
	CHECK(obuf != NULL);
	CHECK_OK(kvb_buf_register_host_fd(c, fd, 0, len, m, KVB_BUF_FDCOPY, &buf));
	harness_fill(m, pb, &k0, SEED);
	CHECK_RC(kvb_put(c, ns, k0, m, pb), 0);
	harness_fill(m + 4 * pb, pb, &k1, SEED);

	/* Cut to two and a half pages: pages 0 and 1 remain, page 2 is half there. */
	CHECK_OK(ftruncate(fd, (off_t)(5 * pb / 2)));
	CHECK_RC(kvb_put(c, ns, k1, m + 4 * pb, pb), -EFAULT);
	CHECK_RC(kvb_put(c, ns, k1, m + 2 * pb, pb), -EFAULT); /* straddles the new end */
	CHECK_OK(kvb_lookup(c, ns, &k1, 1, &hits));
	CHECK_EQ(hits, 0);
	CHECK_RC(kvb_get(c, ns, k1, out, pb), -ENOENT);
	CHECK_RC(kvb_get(c, ns, k0, m + 4 * pb, pb), -EFAULT);
	CHECK_RC(kvb_get(c, ns, k0, m + 2 * pb, pb), -EFAULT);
	CHECK_EQ(fsize(fd), (off_t)(5 * pb / 2)); /* not grown back by the broker */
	{
		struct kvb_op op = {
			.opcode = KVB_OP_GET, .ns = ns, .buf = buf, .key = k0, .off = 6 * pb};
		struct kvb_completion cq;

		CHECK_RC(kvb_submit(c, &op, 1), 1);
		reap_all(c, &cq, 1);
		CHECK_RC(cq.res, -EFAULT);
		op.opcode = KVB_OP_PUT;
		op.key = k2;
		CHECK_RC(kvb_submit(c, &op, 1), 1);
		reap_all(c, &cq, 1);
		CHECK_RC(cq.res, -EFAULT);
		CHECK_OK(kvb_lookup(c, ns, &k2, 1, &hits));
		CHECK_EQ(hits, 0);
	}
	CHECK_EQ(fsize(fd), (off_t)(5 * pb / 2));
	/* What is left still works, both ways. */
	memset(m + pb, 0, pb);
	CHECK_RC(kvb_get(c, ns, k0, m + pb, pb), (long long)pb);
	CHECK(harness_verify(m + pb, pb, &k0, SEED, "GET inside what is left") == 0);

	/* The other client never noticed. */
	harness_fill(obuf, pb, &k2, SEED);
	CHECK_RC(kvb_put(other, ns, k2, obuf, pb), 0);
	memset(obuf, 0, pb);
	CHECK_RC(kvb_get(other, ns, k2, obuf, pb), (long long)pb);
	CHECK(harness_verify(obuf, pb, &k2, SEED, "the other client's page") == 0);

	/* Grown back: the whole range works again (the mapping is valid again too). */
	CHECK_OK(ftruncate(fd, (off_t)len));
	harness_fill(m + 4 * pb, pb, &k1, SEED);
	CHECK_RC(kvb_put(c, ns, k1, m + 4 * pb, pb), 0);
	CHECK_RC(kvb_get(c, ns, k1, m + 12 * pb, pb), (long long)pb);
	CHECK(harness_verify(m + 12 * pb, pb, &k1, SEED, "GET after regrowing") == 0);

	CHECK_OK(kvb_buf_unregister(c, buf));
	CHECK_OK(kvb_buf_unregister(other, obid));
	munmap(m, len);
	close(fd);
	free(out);
	harness_log("truncated memfd (%zu-byte pages): -EFAULT, nothing stored, no growth", pb);
}

struct churn {
	int fd;
	size_t len;
	volatile int stop;
};

/* Child: shrinks and regrows the file as fast as it can until told to stop. */
static int churn_child(int idx, void *arg)
{
	struct churn *ch = arg;
	uint64_t n = 0;

	(void)idx;
	while (!ch->stop) {
		CHECK_OK(ftruncate(ch->fd, (off_t)((n++ % 7) * ch->len / 8)));
		CHECK_OK(ftruncate(ch->fd, (off_t)ch->len));
	}
	return 0;
}

static void churn(kvb_client *c, uint32_t ns, size_t pb)
{
	struct churn *ch = harness_shared(sizeof(*ch));
	size_t len = NPAGES * pb;
	struct kvb_op ops[NPAGES];
	struct kvb_completion cq[NPAGES];
	uint32_t buf, ok = 0, fault = 0;
	uint64_t t0;
	pid_t pid;
	int fd;
	uint8_t *m = sgl_alloc(len, &fd);

	(void)m; /* the engine's own mapping: we never touch it while the file churns */
	CHECK_OK(kvb_buf_register_host_fd(c, fd, 0, len, NULL, KVB_BUF_FDCOPY, &buf));
	ch->fd = fd;
	ch->len = len;
	pid = harness_fork(churn_child, 0, ch);
	t0 = harness_now_ms();
	for (uint32_t round = 0; harness_now_ms() - t0 < 400; round++) {
		for (uint32_t i = 0; i < NPAGES; i++)
			ops[i] = (struct kvb_op){.opcode = i % 2 ? KVB_OP_GET : KVB_OP_PUT,
						 .ns = ns,
						 .buf = buf,
						 .key = harness_key(SEED + 30 + round, i / 2),
						 .off = i * pb,
						 .user_data = i};
		CHECK_RC(kvb_submit(c, ops, NPAGES), NPAGES);
		reap_all(c, cq, NPAGES);
		for (uint32_t i = 0; i < NPAGES; i++) {
			int32_t want = cq[i].user_data % 2 ? (int32_t)pb : 0;

			/* A GET of a key whose PUT faulted misses: fine too. */
			CHECKF(cq[i].res == want || cq[i].res == -EFAULT || cq[i].res == -ENOENT,
			       "op %llu ended %d", (unsigned long long)cq[i].user_data, cq[i].res);
			ok += cq[i].res == want;
			fault += cq[i].res == -EFAULT;
		}
		CHECK_LE(fsize(fd), (off_t)len);
	}
	ch->stop = 1;
	CHECK_EQ(harness_wait(&pid, 1, 10000, NULL), 0);
	CHECK_LE(fsize(fd), (off_t)len);
	CHECK_OK(kvb_nop(c));
	CHECK_OK(kvb_buf_unregister(c, buf));
	munmap(m, len);
	close(fd);
	harness_log("churning file (%zu-byte pages): %u ops ok, %u -EFAULT, broker fine", pb, ok,
		    fault);
}

static void modes(kvb_client *c)
{
	int fd, ro;
	uint8_t *m = sgl_alloc(PB, &fd);
	char path[40];
	uint32_t buf;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ro = open(path, O_RDONLY | O_CLOEXEC);
	CHECK(ro >= 0);
	CHECK_RC(kvb_buf_register_host_fd(c, ro, 0, PB, NULL, KVB_BUF_FDCOPY, &buf), -EBADF);
	CHECK_RC(kvb_buf_register_host_fd(c, fd, 0, 2 * PB, NULL, KVB_BUF_FDCOPY, &buf), -EFAULT);
	close(ro);
	munmap(m, PB);
	close(fd);

	/* A sealed memfd with the flag: mapped as ever. */
	fd = memfd_create("t_buf_fdcopy_sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	CHECK(fd >= 0);
	CHECK_OK(ftruncate(fd, PB));
	CHECK_OK(kvb_buf_register_host_fd(c, fd, 0, PB, NULL, KVB_BUF_SEAL | KVB_BUF_FDCOPY, &buf));
	CHECK(fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK);
	CHECK_OK(kvb_buf_unregister(c, buf));
	close(fd);
	harness_log("read-only fd -EBADF, range past the file -EFAULT, sealed file mapped");
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	kvb_client *c, *other;
	size_t pb;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M", "--copy-inline", "64K", "--copy-threads", "2");
	c = harness_connect(b, "t_buf_fdcopy", 0);
	other = harness_connect(b, "t_buf_fdcopy-other", 0);
	harness_layout(&l, "test/fdcopy", KVB_LAYOUT_MLA, TPP, 1, 0, LAYERS, BPT);
	CHECK_OK(kvb_ns_open(c, &l, &ns_small, &pb));
	CHECK_EQ(pb, PB);
	CHECK_OK(kvb_ns_open(other, &l, &ns_small, &pb));
	harness_layout(&l, "test/fdcopy-big", KVB_LAYOUT_MLA, BIG_TPP, 1, 0, BIG_LAYERS, BIG_BPT);
	CHECK_OK(kvb_ns_open(c, &l, &ns_big, &pb));
	CHECK_EQ(pb, BIG_PB);
	CHECK_OK(kvb_ns_open(other, &l, &ns_big, &pb));
	harness_layout(&l, "test/fdcopy-mha", KVB_LAYOUT_MHA, TPP, 1, 0, LAYERS, T);
	strcpy(l.comp[0].name, "k");
	harness_layout_add(&l, "v", LAYERS, T);
	CHECK_OK(kvb_ns_open(c, &l, &ns_mha, &pb));
	CHECK_EQ(pb, MHA_PB);

	basic(c, 0);
	basic(c, 1);
	views(c, 0);
	views(c, 1);
	truncated(c, other, ns_small, PB);
	truncated(c, other, ns_big, BIG_PB);
	churn(c, ns_small, PB);
	churn(c, ns_big, BIG_PB);
	modes(c);

	CHECK_OK(kvb_nop(c));
	CHECK(harness_broker_alive(b));
	kvb_close(other);
	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
