// SPDX-License-Identifier: MIT
/*
 * t_vdir_fd.c - [vdir-fd] reads through the pool directory into a buffer registered by fd
 * (kvb_buf_register_host_fd: SGLang's host pool, vLLM's CPU KV tensors). The library copies a
 * listed page into the caller's mapping itself, as into a buffer of its own, only when that
 * mapping is checked to be the registered range of the file, shared and writable, and the file
 * is sealed against shrinking; otherwise the broker writes the file, as before. For each case a
 * sync view GET, an async view GET and a kvb_get() by pointer:
 *   - a shared mapping of a sealed memfd, at an offset, and one made of two VMAs side by side:
 *     three directory reads, no broker copy;
 *   - a hole in the range, a read-only page in it, a private (copy-on-write) mapping of the
 *     file, another file's mapping at addr, the file's mapping one page off, and an
 *     unsealable memfd with KVB_BUF_FDCOPY: no directory read, the broker copies.
 * Either way the file holds the pages afterwards (read back with pread, past every mapping)
 * and the range's last page, never read into, holds what it held.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"

#define TPP 16
#define BPT 2048
#define PB (TPP * BPT) /* one component of one layer: a page is its slots' bytes in a row */
#define NPAGES 4       /* of slots in a buffer; pages 0-2 are read into, page 3 is not */
#define LEN (NPAGES * PB)
#define OFF 8192 /* where the range starts in the file */
#define FILE_LEN (OFF + LEN + 4096)
#define SENTINEL 0x5c
#define SEED 401

static uint32_t ns;
static kvb_key k[3];

static int memfd(unsigned flags)
{
	int fd = memfd_create("t_vdir_fd", MFD_CLOEXEC | flags);

	CHECK(fd >= 0);
	CHECK_OK(ftruncate(fd, FILE_LEN));
	return fd;
}

static uint8_t *map(int fd, size_t len, off_t off, int flags, void *at)
{
	uint8_t *p = mmap(at, len, PROT_READ | PROT_WRITE, flags | (at ? MAP_FIXED : 0), fd, off);

	CHECK(p != MAP_FAILED);
	return p;
}

/* The VMAs of /proc/self/maps that overlap [p, p + len). */
static int vmas(const uint8_t *p, size_t len)
{
	unsigned long long lo, hi;
	char line[512];
	FILE *f = fopen("/proc/self/maps", "re");
	int n = 0;

	CHECK(f != NULL);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "%llx-%llx", &lo, &hi) == 2 && lo < (uintptr_t)p + len &&
		    hi > (uintptr_t)p)
			n++;
	fclose(f);
	return n;
}

static uint64_t broker_copies(kvb_client *c)
{
	return harness_stat(c, "copy.inline_jobs") + harness_stat(c, "copy.queued_jobs");
}

/* Registers [OFF, OFF + LEN) of fd with addr, reads k[0..2] into it three ways and checks. */
static void reads(kvb_client *c, int fd, uint8_t *addr, uint32_t flags, int direct,
		  const char *what)
{
	uint8_t page[PB];
	struct kvb_view_part part;
	struct kvb_completion comp;
	struct kvb_op op;
	uint64_t dir0, copies0;
	uint32_t buf, view;

	memset(page, SENTINEL, sizeof(page));
	for (uint32_t i = 0; i < NPAGES; i++)
		CHECK_RC(pwrite(fd, page, PB, OFF + (off_t)i * PB), PB);
	CHECK_OK(kvb_buf_register_host_fd(c, fd, OFF, LEN, addr, flags, &buf));
	part = (struct kvb_view_part){.buf = buf, .stride = BPT, .base = 0};
	CHECK_OK(kvb_view_create(c, ns, &part, 1, &view));
	dir0 = harness_stat(c, "counters.dir_gets");
	copies0 = broker_copies(c);

	CHECK_RC(kvb_view_get(c, view, k[0], 0, 0, 0), PB);
	op = (struct kvb_op){.opcode = KVB_OP_GET,
			     .flags = KVB_OPF_VIEW,
			     .buf = view,
			     .key = k[1],
			     .off = TPP,
			     .user_data = 1};
	CHECK_RC(kvb_submit(c, &op, 1), 1);
	harness_reap_n(c, &comp, 1);
	CHECKF(comp.res == PB, "%s: async view GET: %d", what, comp.res);
	CHECK_RC(kvb_get(c, ns, k[2], addr + 2 * PB, PB), PB);

	CHECKF(harness_stat(c, "counters.dir_gets") == dir0 + (direct ? 3 : 0),
	       "%s: %llu directory reads, want %d", what,
	       (unsigned long long)(harness_stat(c, "counters.dir_gets") - dir0), direct ? 3 : 0);
	if (direct)
		CHECKF(broker_copies(c) == copies0, "%s: the broker copied", what);
	else
		CHECKF(broker_copies(c) >= copies0 + 3, "%s: the broker did not copy", what);
	for (uint32_t i = 0; i < 3; i++) {
		CHECK_RC(pread(fd, page, PB, OFF + (off_t)i * PB), PB);
		CHECKF(harness_verify(page, PB, &k[i], SEED, what) == 0, "%s: page %u in the file",
		       what, i);
	}
	CHECK_RC(pread(fd, page, PB, OFF + 3 * PB), PB);
	for (size_t j = 0; j < PB; j++)
		CHECKF(page[j] == SENTINEL, "%s: byte %zu of the unread page changed", what, j);
	CHECK_OK(kvb_view_destroy(c, view));
	CHECK_OK(kvb_buf_unregister(c, buf));
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	uint8_t *page, *p, *other;
	char path[64];
	kvb_client *c;
	size_t pb;
	int fd, fd2;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M");
	c = harness_connect(b, "vdir-fd", 0);
	harness_layout(&l, "test/vdir-fd", KVB_LAYOUT_MLA, TPP, 1, 0, 1, BPT);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK_EQ(pb, PB);
	page = malloc(PB);
	CHECK(page != NULL);
	for (uint32_t i = 0; i < 3; i++) {
		k[i] = harness_key(SEED, i);
		harness_fill(page, PB, &k[i], SEED);
		CHECK_OK(kvb_put(c, ns, k[i], page, PB));
	}
	free(page);

	/* Sealed by the library (KVB_BUF_SEAL), mapped shared: ours to write. */
	fd = memfd(MFD_ALLOW_SEALING);
	p = map(fd, LEN, OFF, MAP_SHARED, NULL);
	reads(c, fd, p, KVB_BUF_SEAL, 1, "shared mapping");

	/*
	 * The same range in two mappings side by side, the second through another open of the
	 * file (the kernel merges two mmaps of one open file into one VMA): two VMAs whose
	 * offsets run on.
	 */
	CHECK_OK(munmap(p + LEN / 2, LEN / 2));
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	fd2 = open(path, O_RDWR | O_CLOEXEC);
	CHECK(fd2 >= 0);
	map(fd2, LEN / 2, OFF + LEN / 2, MAP_SHARED, p + LEN / 2);
	CHECK_OK(close(fd2));
	CHECKF(vmas(p, LEN) == 2, "%d VMAs over the range, want 2", vmas(p, LEN));
	reads(c, fd, p, KVB_BUF_SEAL, 1, "two mappings");

	/* A hole in it: the walk must not step over it. */
	CHECK_OK(munmap(p + PB, 4096));
	reads(c, fd, p, 0, 0, "a hole");
	map(fd, 4096, OFF + PB, MAP_SHARED, p + PB);

	/* One page of it read-only: the library must not write there, nor anywhere in it. */
	CHECK_OK(mprotect(p + PB, PB, PROT_READ));
	reads(c, fd, p, 0, 0, "a read-only page");
	CHECK_OK(munmap(p, LEN));

	/* Copy on write: what the library wrote would never reach the file. */
	p = map(fd, LEN, OFF, MAP_PRIVATE, NULL);
	reads(c, fd, p, 0, 0, "private mapping");
	CHECK_OK(munmap(p, LEN));

	/* addr maps another file; and the right file one page off. */
	fd2 = memfd(MFD_ALLOW_SEALING);
	other = map(fd2, LEN, OFF, MAP_SHARED, NULL);
	reads(c, fd, other, 0, 0, "another file");
	CHECK_OK(munmap(other, LEN));
	other = map(fd, LEN, OFF + 4096, MAP_SHARED, NULL);
	reads(c, fd, other, 0, 0, "an offset off by a page");
	CHECK_OK(munmap(other, LEN));
	CHECK_OK(close(fd2));
	CHECK_OK(close(fd));

	/* Unsealable (SGLang 0.5.23's alloc_shm memfd): the broker's pread/pwrite only. */
	fd = memfd(0);
	p = map(fd, LEN, OFF, MAP_SHARED, NULL);
	reads(c, fd, p, KVB_BUF_SEAL | KVB_BUF_FDCOPY, 0, "unsealable file");
	CHECK_OK(munmap(p, LEN));
	CHECK_OK(close(fd));

	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
