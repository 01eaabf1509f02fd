// SPDX-License-Identifier: MIT
/*
 * test_copy_host.c - the host copy engine's poll contract (copy.h): once poll() has completed
 * every queued job, the engine's eventfd is not readable. Regression: poll() drained the eventfd
 * before it took the done-queue lock, so a job that finished in between was completed by that
 * poll while its ring stayed: the level-triggered loop then woke at once, forever, with nothing
 * in flight (an idle broker at 100% CPU). read() is wrapped (--wrap=read) to hold that window
 * open: right after poll()'s read of the eventfd it waits (up to 300 ms) for the worker to ring
 * it. The broken engine then takes the job and leaves the ring; the fixed one reads under the
 * lock, so the worker cannot ring until poll() is past it, and the next poll() takes both.
 * Also: many jobs through two workers, every one completed exactly once, the eventfd quiet at
 * the end; and an engine destroyed with jobs queued completes its GETs uncopied (-ECANCELED:
 * their clients are gone) and still copies its PUTs.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "copy.h"
#include "slot.h"

static int window_fd = -1; /* read() of this fd holds the window open, once */

ssize_t __real_read(int fd, void *buf, size_t len);
ssize_t __wrap_read(int fd, void *buf, size_t len);
ssize_t __wrap_read(int fd, void *buf, size_t len)
{
	ssize_t n = __real_read(fd, buf, len);

	if (fd >= 0 && fd == window_fd) {
		struct pollfd p = {.fd = fd, .events = POLLIN};

		window_fd = -1;
		poll(&p, 1, 300); /* the worker rings meanwhile, unless poll() holds the lock */
	}
	return n;
}

static int ndone;

static void done(struct copy_job *j)
{
	(void)j;
	ndone++;
}

static int readable(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};

	return poll(&p, 1, 0) == 1;
}

/* Polls until every job completed (or 5 s); returns the polls it took. */
static int drain(struct copy_engine *e)
{
	int polls = 0;

	for (int i = 0; i < 5000 && e->inflight; i++, polls++) {
		struct pollfd p = {.fd = e->efd, .events = POLLIN};

		poll(&p, 1, 1);
		e->poll(e);
	}
	return polls;
}

static void test_copy_host_ring_taken_with_its_job(void **state)
{
	static uint8_t src[1 << 16], dst[1 << 16];
	struct copy_seg seg = {dst, src, sizeof(src)};
	struct copy_job j = {.done = done, .dev = COPY_HOST, .nsegs = 1, .bytes = sizeof(src)};
	struct copy_engine *e = copy_host_create(1, 0);

	(void)state;
	assert_non_null(e);
	j.segs = &seg;
	ndone = 0;
	/* The job sleeps 50 ms on its worker: poll()'s read comes first, the ring in the window. */
	copy_host_test(e, 50000, 0);
	memset(src, 0x5a, sizeof(src));
	assert_int_equal(e->submit(e, &j), COPY_QUEUED);
	window_fd = e->efd;
	e->poll(e);
	drain(e);
	assert_int_equal(ndone, 1);
	assert_int_equal(e->inflight, 0);
	assert_int_equal(dst[100], 0x5a);
	assert_false(readable(e->efd)); /* readable: the idle loop would spin */
	e->destroy(e);
}

static void test_copy_host_many_jobs_quiet_after(void **state)
{
	static uint8_t src[64][4096], dst[64][4096];
	static struct copy_seg segs[64];
	static struct copy_job jobs[64];
	struct copy_engine *e = copy_host_create(2, 0);

	(void)state;
	assert_non_null(e);
	for (int round = 0; round < 50; round++) {
		ndone = 0;
		for (int i = 0; i < 64; i++) {
			segs[i] = (struct copy_seg){dst[i], src[i], sizeof(src[i])};
			jobs[i] = (struct copy_job){.done = done,
						    .dev = COPY_HOST,
						    .nsegs = 1,
						    .bytes = sizeof(src[i]),
						    .segs = &segs[i]};
			memset(src[i], round + i, sizeof(src[i]));
			assert_int_equal(e->submit(e, &jobs[i]), COPY_QUEUED);
			if (i % 8 == 7)
				e->poll(e); /* polls race the workers' pushes */
		}
		drain(e);
		assert_int_equal(ndone, 64);
		assert_int_equal(e->inflight, 0);
		for (int i = 0; i < 64; i++)
			assert_int_equal(dst[i][4095], (uint8_t)(round + i));
		assert_false(readable(e->efd));
	}
	e->destroy(e);
}

/*
 * Fan-out: jobs of several MiB split into parts that four workers copy side by side. Segments
 * of odd lengths (parts begin and end inside them) and an empty one; every byte lands where it
 * belongs, each job completes once with the crc of all its bytes, and one that fails (every
 * 3rd) fails as a whole, with no crc.
 */
static void test_copy_host_split_jobs(void **state)
{
	enum { NJOBS = 6, NSEGS = 5, LEN = 9 << 20 };
	static const uint64_t seglen[NSEGS] = {1234567, 0, 3 << 20, 777,
					       LEN - 1234567 - (3 << 20) - 777};
	static struct copy_seg segs[NJOBS][NSEGS];
	static struct copy_job jobs[NJOBS];
	uint8_t *src = malloc(LEN), *dst = malloc((size_t)NJOBS * LEN);
	struct copy_engine *e = copy_host_create(4, 0);

	(void)state;
	assert_non_null(e);
	assert_non_null(src);
	assert_non_null(dst);
	for (size_t i = 0; i < LEN; i++)
		src[i] = (uint8_t)(i * 7 + i / 4099);
	memset(dst, 0, (size_t)NJOBS * LEN);
	copy_host_test(e, 0, 3);
	ndone = 0;
	for (int k = 0; k < NJOBS; k++) {
		uint64_t off = 0;

		/* Job k copies src into its own LEN bytes of dst, segment by segment. */
		for (int s = 0; s < NSEGS; s++) {
			segs[k][s] = (struct copy_seg){dst + (size_t)k * LEN + off, src + off,
						       seglen[s]};
			off += seglen[s];
		}
		/* A PUT's slot crc: computed once, by the last part's worker, over all of it. */
		jobs[k] = (struct copy_job){.done = done,
					    .dev = COPY_HOST,
					    .nsegs = NSEGS,
					    .bytes = LEN,
					    .segs = segs[k],
					    .crc_at = dst + (size_t)k * LEN,
					    .crc_len = LEN};
		assert_int_equal(e->submit(e, &jobs[k]), COPY_QUEUED);
	}
	drain(e);
	assert_int_equal(ndone, NJOBS);
	assert_int_equal(e->inflight, 0);
	for (int k = 0; k < NJOBS; k++) {
		if (k % 3 == 2) {
			assert_int_equal(jobs[k].res, -EIO);
			assert_int_equal(jobs[k].has_crc, 0);
			continue;
		}
		assert_int_equal(jobs[k].res, 0);
		assert_memory_equal(dst + (size_t)k * LEN, src, LEN);
		assert_int_equal(jobs[k].has_crc, 1);
		assert_int_equal(jobs[k].crc, slot_crc32c(src, LEN));
	}
	assert_false(readable(e->efd));
	e->destroy(e);
	free(src);
	free(dst);
}

/*
 * [crc-worker] Jobs of one segment at their slot's start (a PUT of a plain buffer), split into
 * parts: each part's worker folds its crc into its copy and the last combines them. A page
 * that fills its slot, one whose slot has bytes of its own past the page (they count, read
 * from the slot), one too short to split, and every 3rd failing: no crc.
 */
static void test_copy_host_split_fused(void **state)
{
	enum { NJOBS = 6, SLOT = 9 << 20 };
	static const uint64_t page[NJOBS] = {SLOT, SLOT - 3000, SLOT - 1, 200000, SLOT, 12345};
	static struct copy_seg segs[NJOBS];
	static struct copy_job jobs[NJOBS];
	uint8_t *src = malloc(SLOT), *dst = NULL;
	struct copy_engine *e = copy_host_create(4, 0);

	(void)state;
	assert_non_null(e);
	assert_non_null(src);
	assert_int_equal(posix_memalign((void **)&dst, 4096, (size_t)NJOBS * SLOT), 0);
	for (size_t i = 0; i < SLOT; i++)
		src[i] = (uint8_t)(i * 13 + i / 4093);
	memset(dst, 0x5c, (size_t)NJOBS * SLOT); /* the slots' own bytes past each page */
	copy_host_test(e, 0, 3);
	ndone = 0;
	for (int k = 0; k < NJOBS; k++) {
		segs[k].dst = dst + (size_t)k * SLOT;
		segs[k].src = src;
		segs[k].len = page[k];
		jobs[k] = (struct copy_job){.done = done,
					    .dev = COPY_HOST,
					    .nsegs = 1,
					    .bytes = page[k],
					    .segs = &segs[k],
					    .crc_at = dst + (size_t)k * SLOT,
					    .crc_len = SLOT};
		assert_int_equal(e->submit(e, &jobs[k]), COPY_QUEUED);
	}
	drain(e);
	assert_int_equal(ndone, NJOBS);
	for (int k = 0; k < NJOBS; k++) {
		if (k % 3 == 2) {
			assert_int_equal(jobs[k].res, -EIO);
			assert_int_equal(jobs[k].has_crc, 0);
			continue;
		}
		assert_int_equal(jobs[k].res, 0);
		assert_memory_equal(dst + (size_t)k * SLOT, src, page[k]);
		assert_int_equal(jobs[k].has_crc, 1);
		assert_int_equal(jobs[k].crc, slot_crc32c(dst + (size_t)k * SLOT, SLOT));
	}
	e->destroy(e);
	free(src);
	free(dst);
}

/*
 * [crc-fused] A view's PUT (segments from scattered sources filling the slot in order): inline,
 * copied and checksummed in one pass; queued, each part's worker folds its crc in. A view that
 * leaves a gap in its slot: inline, no crc (the loop reads the slot); queued, read back.
 */
static void test_copy_host_view_crc(void **state)
{
	enum { NSEGS = 61, PART = 73728, SLOT = NSEGS * PART + 4096 };
	static struct copy_seg segs[4][NSEGS];
	static struct copy_job jobs[4];
	uint8_t *src = malloc((size_t)NSEGS * PART * 2), *dst = NULL;
	struct copy_engine *e = copy_host_create(2, 1 << 20);

	(void)state;
	assert_non_null(e);
	assert_non_null(src);
	assert_int_equal(posix_memalign((void **)&dst, 4096, (size_t)4 * SLOT), 0);
	for (size_t i = 0; i < (size_t)NSEGS * PART * 2; i++)
		src[i] = (uint8_t)(i * 11 + i / 4091);
	memset(dst, 0x3a, (size_t)4 * SLOT);
	ndone = 0;
	/* Jobs 0 and 1: 1 and 61 parts (inline, queued); 2 and 3 the same with a gap. */
	for (int k = 0; k < 4; k++) {
		uint32_t n = k % 2 ? NSEGS : 8;
		uint8_t *slot = dst + (size_t)k * SLOT;

		for (uint32_t i = 0; i < n; i++)
			segs[k][i] = (struct copy_seg){slot + (size_t)i * PART + (k >= 2 && i == 5),
						       src + (size_t)i * 2 * PART, PART - (k >= 2)};
		jobs[k] = (struct copy_job){.done = done,
					    .dev = COPY_HOST,
					    .nsegs = n,
					    .bytes = (uint64_t)n * (PART - (k >= 2)),
					    .segs = segs[k],
					    .crc_at = slot,
					    .crc_len = SLOT};
		assert_int_equal(e->submit(e, &jobs[k]), k % 2 ? COPY_QUEUED : COPY_DONE);
	}
	drain(e);
	assert_int_equal(ndone, 2);
	for (int k = 0; k < 4; k++) {
		uint8_t *slot = dst + (size_t)k * SLOT;

		assert_int_equal(jobs[k].res, 0);
		assert_memory_equal(slot + 3 * PART, src + 6 * PART, PART - (k >= 2));
		assert_int_equal(jobs[k].has_crc, k != 2);
		if (k != 2)
			assert_int_equal(jobs[k].crc, slot_crc32c(slot, SLOT));
	}
	assert_int_equal(jobs[1].crc_fused, 1);
	assert_int_equal(jobs[3].crc_fused, 0);
	e->destroy(e);
	free(src);
	free(dst);
}

/*
 * Stopping with jobs queued behind a slow one (the delay knob, 50 ms on the only worker): the
 * GETs left in the queue complete -ECANCELED with their destinations untouched, the PUT between
 * them is copied. The first job was taken before the stop and finishes as usual.
 */
static void test_copy_host_stop_cancels_gets(void **state)
{
	static uint8_t src[4][1 << 16], dst[4][1 << 16];
	static const uint32_t dir[4] = {COPY_FROM_POOL, COPY_FROM_POOL, COPY_TO_POOL,
					COPY_FROM_POOL};
	static const int32_t want[4] = {0, -ECANCELED, 0, -ECANCELED};
	struct copy_seg segs[4];
	struct copy_job jobs[4];
	struct copy_engine *e = copy_host_create(1, 0);
	struct timespec ts = {0, 10 * 1000 * 1000};

	(void)state;
	assert_non_null(e);
	copy_host_test(e, 50000, 0);
	ndone = 0;
	for (int i = 0; i < 4; i++) {
		memset(src[i], 0x40 + i, sizeof(src[i]));
		memset(dst[i], 0, sizeof(dst[i]));
		segs[i] = (struct copy_seg){dst[i], src[i], sizeof(src[i])};
		jobs[i] = (struct copy_job){.done = done,
					    .dev = COPY_HOST,
					    .dir = dir[i],
					    .nsegs = 1,
					    .bytes = sizeof(src[i]),
					    .segs = &segs[i]};
		assert_int_equal(e->submit(e, &jobs[i]), COPY_QUEUED);
	}
	nanosleep(&ts, NULL); /* the worker took the first and sleeps in it */
	e->destroy(e);	      /* completes all four */
	assert_int_equal(ndone, 4);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(jobs[i].res, want[i]);
		assert_int_equal(dst[i][100], want[i] ? 0 : 0x40 + i);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_copy_host_ring_taken_with_its_job),
		cmocka_unit_test(test_copy_host_many_jobs_quiet_after),
		cmocka_unit_test(test_copy_host_split_jobs),
		cmocka_unit_test(test_copy_host_split_fused),
		cmocka_unit_test(test_copy_host_view_crc),
		cmocka_unit_test(test_copy_host_stop_cancels_gets),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
