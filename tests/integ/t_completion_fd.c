// SPDX-License-Identifier: MIT
/*
 * t_completion_fd.c - kvb_completion_fd(): an fd an event loop polls instead of blocking in
 * kvb_reap(). Level-triggered, and no wake-up is ever lost:
 *   1. basics: one fd per client, not readable with nothing to reap, readable once a NOP
 *      completed and still readable while it is not reaped (level, not edge), re-armed by the
 *      kvb_reap() that finds nothing left;
 *   2. a waiter thread in epoll_wait() on a set that holds the fd (as asyncio's loop would),
 *      reaping with kvb_reap(timeout 0) on each wake-up, sees every one of 20,000 completions
 *      that the main thread submits in bursts, while the main thread also runs synchronous
 *      calls that take async completions off the ring (they must still wake the waiter);
 *   3. late completions: GETs whose copies run on the copy engine (--copy-inline 0, a delay per
 *      copy) and GETs of pages demoted to the disk tier (promoted first, when io_uring is
 *      available) complete long after submission, and each wakes the waiter;
 *   4. another process (a child that inherited the fd, as a supervisor would) sees it
 *      readable too, and the parent's reap re-arms it for both.
 * Every wait has a deadline: a lost wake-up fails the test instead of hanging it.
 */
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <liburing.h>

#include "harness.h"

#define TPP 16
#define LAYERS 16
#define BPT 4096
#define PB (TPP * LAYERS * BPT) /* 1 MiB */
#define NOPS 20000
#define NPAGES 40
#define SEED 313

static kvb_client *c;
static uint32_t ns;

static int readable(int fd, int timeout_ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	int n = poll(&p, 1, timeout_ms);

	CHECK(n >= 0);
	return n == 1 && (p.revents & POLLIN);
}

/* Reaps everything there is now; the call that finds nothing re-arms the fd. */
static int drain(struct kvb_completion *out, size_t max, int *bad)
{
	int total = 0, n;

	while ((n = kvb_reap(c, out, max, 0, 0)) > 0) {
		for (int i = 0; i < n; i++)
			*bad += out[i].res < 0;
		total += n;
	}
	CHECK_RC(n, 0);
	return total;
}

static void basics(int cfd)
{
	struct kvb_op op = {.opcode = KVB_OP_NOP, .user_data = 5};
	struct kvb_completion out[4];
	int bad = 0;

	CHECK_EQ(kvb_completion_fd(c), cfd);
	CHECK(!readable(cfd, 0));
	CHECK_RC(kvb_submit(c, &op, 1), 1);
	CHECK(readable(cfd, 5000));
	CHECK(readable(cfd, 0)); /* level-triggered: still there until reaped */
	CHECK(readable(cfd, 0));
	CHECK_EQ(drain(out, 4, &bad), 1);
	CHECK_EQ(bad, 0);
	CHECK(!readable(cfd, 0));
	/*
	 * A synchronous call's own completion may leave one spurious wake-up: the broker rings
	 * the doorbell after publishing, and a client spinning on its CQ can take the completion,
	 * return and reap before that write lands. A reap after it landed clears it.
	 */
	CHECK_OK(kvb_nop(c));
	usleep(20 * 1000);
	CHECK_EQ(drain(out, 4, &bad), 0);
	CHECK(!readable(cfd, 0));
	/* Two completions (one batch, one doorbell), reaped one at a time: readable until the
	 * second is gone. */
	CHECK_RC(kvb_submit(c, (struct kvb_op[]){op, op}, 2), 2);
	CHECK(readable(cfd, 5000)); /* the doorbell landed: no late one to come */
	CHECK_RC(kvb_reap(c, out, 1, 1, 5000), 1);
	CHECK(readable(cfd, 5000));
	CHECK_EQ(drain(out, 4, &bad), 1);
	CHECK(!readable(cfd, 0));
	harness_log("basics: level-triggered, re-armed by the empty reap");
}

struct waiter {
	int cfd;
	int want;     /* completions to see */
	int got, bad; /* what it saw */
	int timeouts; /* epoll_wait() deadlines missed: lost wake-ups */
	uint64_t wakeups;
};

/* An event loop: epoll on the fd (level-triggered, as asyncio), reap with timeout 0. */
static void *waiter_main(void *arg)
{
	struct waiter *w = arg;
	struct epoll_event ev = {.events = EPOLLIN}, got;
	struct kvb_completion out[64];
	int ep = epoll_create1(EPOLL_CLOEXEC);

	CHECK(ep >= 0);
	CHECK_OK(epoll_ctl(ep, EPOLL_CTL_ADD, w->cfd, &ev));
	while (__atomic_load_n(&w->got, __ATOMIC_ACQUIRE) < w->want) {
		int n = epoll_wait(ep, &got, 1, 10000);

		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0) {
			__atomic_store_n(&w->timeouts, 1, __ATOMIC_RELEASE);
			break;
		}
		w->wakeups++;
		/* The main thread watches got: atomics keep that exchange race-free. */
		__atomic_add_fetch(&w->got, drain(out, 64, &w->bad), __ATOMIC_RELEASE);
	}
	close(ep);
	return NULL;
}

static void start_waiter(pthread_t *t, struct waiter *w, int cfd, int want)
{
	memset(w, 0, sizeof(*w));
	w->cfd = cfd;
	w->want = want;
	CHECK_OK(pthread_create(t, NULL, waiter_main, w));
}

static void join_waiter(pthread_t t, struct waiter *w, const char *what)
{
	CHECK_OK(pthread_join(t, NULL));
	CHECKF(!w->timeouts && w->got == w->want,
	       "%s: the waiter saw %d of %d completions (%d deadline(s) missed: a lost wake-up)",
	       what, w->got, w->want, w->timeouts);
	CHECK_EQ(w->bad, 0);
	harness_log("%s: %d completions in %llu wake-ups", what, w->got,
		    (unsigned long long)w->wakeups);
}

/* Submits ops, retrying while the ring is full (the waiter is reaping meanwhile). */
static void submit_all(const struct kvb_op *ops, int n)
{
	for (int done = 0; done < n;) {
		int k = kvb_submit(c, ops + done, (size_t)(n - done));

		CHECK(k >= 0);
		done += k;
		if (!k)
			usleep(50);
	}
}

static void many(int cfd, uint8_t *page)
{
	static struct kvb_op ops[NOPS];
	struct waiter w;
	pthread_t t;
	kvb_key k = harness_key(SEED, 1000);

	for (int i = 0; i < NOPS; i++)
		ops[i] = (struct kvb_op){.opcode = KVB_OP_NOP, .user_data = (uint64_t)i};
	harness_fill(page, PB, &k, SEED);
	CHECK_RC(kvb_put(c, ns, k, page, PB), 0);
	start_waiter(&t, &w, cfd, NOPS);
	for (int i = 0; i < NOPS; i += 500) {
		submit_all(ops + i, 500);
		/* Synchronous calls drain the CQ too: they take async completions with them. */
		if (i % 2000 == 0) {
			CHECK_OK(kvb_nop(c));
			CHECK_RC(kvb_get(c, ns, k, page, PB), PB);
		}
		if (i % 5000 == 0)
			usleep(2000); /* let the waiter go idle, so that it must be woken */
	}
	join_waiter(t, &w, "20,000 NOPs in bursts, sync calls interleaved");
	CHECK(!readable(cfd, 0));
}

/* GETs into a registered buffer, each of which completes late. */
static void late(int cfd, uint8_t *hbuf, uint32_t hid, const kvb_key *keys, int n, const char *what)
{
	struct kvb_op *ops = calloc((size_t)n, sizeof(*ops));
	struct waiter w;
	pthread_t t;

	CHECK(ops != NULL);
	for (int i = 0; i < n; i++)
		ops[i] = (struct kvb_op){.opcode = KVB_OP_GET,
					 .ns = ns,
					 .buf = hid,
					 .key = keys[i],
					 .off = (uint64_t)(i % 8) * PB,
					 .user_data = (uint64_t)i};
	start_waiter(&t, &w, cfd, n);
	/* Eight at a time: the buffer holds eight pages. */
	for (int i = 0; i < n; i += 8) {
		int m = n - i < 8 ? n - i : 8, target = i + m;

		submit_all(ops + i, m);
		while (__atomic_load_n(&w.got, __ATOMIC_ACQUIRE) < target &&
		       !__atomic_load_n(&w.timeouts, __ATOMIC_ACQUIRE))
			usleep(200);
		for (int j = 0; j < m; j++)
			CHECK(harness_verify(hbuf + (uint64_t)((i + j) % 8) * PB, PB, &keys[i + j],
					     SEED, what) == 0);
	}
	join_waiter(t, &w, what);
	free(ops);
}

static int child_sees(int idx, void *arg)
{
	int cfd = *(int *)arg;

	(void)idx;
	/* Inherited across fork: the child only polls it (it must not touch the client). */
	return readable(cfd, 5000) ? 0 : 1;
}

static void other_process(int cfd)
{
	struct kvb_op op = {.opcode = KVB_OP_NOP, .user_data = 9};
	struct kvb_completion out[2];
	int bad = 0;
	pid_t pid;

	pid = harness_fork(child_sees, 0, &cfd);
	CHECK_RC(kvb_submit(c, &op, 1), 1);
	CHECK_EQ(harness_wait(&pid, 1, 10000, NULL), 0);
	CHECK_EQ(drain(out, 2, &bad), 1);
	CHECK(!readable(cfd, 0));
	harness_log("another process saw the fd readable");
}

static int have_io_uring(void)
{
	struct io_uring r;

	if (io_uring_queue_init(2, &r, 0))
		return 0;
	io_uring_queue_exit(&r);
	return 1;
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	kvb_key keys[NPAGES];
	char cache[4096], *dir;
	uint8_t *page, *hbuf;
	uint32_t hid;
	size_t pb;
	int cfd, disk;

	harness_init(argc, argv);
	disk = have_io_uring();
	dir = strdup(argv[0]);
	snprintf(cache, sizeof(cache), "%s/t_completion_fd.cache", dirname(dir));
	unlink(cache);
	/* 16 MiB of pool behind a 64 MiB disk; every copy queued to a thread and delayed. */
	if (disk)
		b = harness_broker_start("--pool", "16M", "--copy-inline", "0", "--copy-threads",
					 "1", "--copy-delay-us", "300", "--disk", cache,
					 "--disk-size", "64M");
	else
		b = harness_broker_start("--pool", "16M", "--copy-inline", "0", "--copy-threads",
					 "1", "--copy-delay-us", "300");
	c = harness_connect(b, "t_completion_fd", 0);
	harness_layout(&l, "test/completion-fd", KVB_LAYOUT_MLA, TPP, 1, 0, LAYERS, BPT);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK_EQ(pb, PB);
	page = malloc(PB);
	hbuf = kvb_buf_alloc_host(c, 8 * (size_t)PB, &hid);
	CHECK(page && hbuf);

	cfd = kvb_completion_fd(c);
	CHECK(cfd >= 0);
	basics(cfd);
	many(cfd, page);

	/* Pages a few at a time (the copies are delayed), then read back by async GETs. */
	harness_key_chain(keys, NPAGES, TPP, SEED);
	for (int i = 0; i < (disk ? NPAGES : 8); i++) {
		harness_fill(page, PB, &keys[i], SEED);
		CHECK(kvb_put(c, ns, keys[i], page, PB) >= 0);
	}
	late(cfd, hbuf, hid, keys + (disk ? NPAGES - 8 : 0), 8, "GETs copied late by the engine");
	if (disk) {
		kvb_key on_disk[8];
		uint8_t tiers[NPAGES];
		size_t hits;
		int n = 0;

		CHECK_OK(kvb_lookup_tiers(c, ns, keys, NPAGES, &hits, tiers));
		CHECK_EQ(hits, NPAGES);
		for (int i = 0; i < NPAGES && n < 8; i++)
			if (tiers[i] == KVB_TIER_DISK)
				on_disk[n++] = keys[i];
		CHECK_EQ(n, 8);
		late(cfd, hbuf, hid, on_disk, n, "GETs of pages on disk (promoted first)");
	} else {
		harness_log("io_uring unavailable: the disk-promotion case is skipped");
	}
	other_process(cfd);

	CHECK_EQ(kvb_completion_fd(c), cfd);
	kvb_close(c); /* closes the fd with the client */
	CHECK_EQ(fcntl(cfd, F_GETFD), -1);
	harness_broker_stop(b);
	unlink(cache);
	free(page);
	free(dir);
	return H_PASS;
}
