// SPDX-License-Identifier: MIT
/*
 * loop.c - the broker's event loop: one thread that runs the broker's round while there is
 * work, dispatches readable fds to their callbacks, and sleeps when there is nothing to do.
 * It calls nothing but its hooks and callbacks (loop.h): which rings to poll and what to do
 * before a sleep is the broker's business (rounds.c).
 *
 * Busy-poll window (the io_uring SQPOLL pattern): after the last work the loop keeps running
 * rounds for the window (--poll-us), checking epoll without blocking every POLL_EPOLL_EVERY
 * rounds or every POLL_EPOLL_GAP, whichever comes first. A sleeping wake-up costs ~10 us across
 * CPUs on these machines, a polled ring round trip ~0.5 us, so the window is what makes small
 * ops cheap. Then prepare_sleep announces the sleep (NEED_WAKEUP on every SQ, ring.h [W1]) and
 * the loop blocks in epoll_wait on every registered fd (control sockets, SQ doorbells, pidfds,
 * the listening socket, a signalfd, the disk ring's eventfd, the copy engines' eventfds, so it
 * sleeps correctly while I/O and copies are in flight), for at most the timeout prepare_sleep
 * gave (a second, so that watermark eviction runs; less while clients' notes come, session.c
 * [note-nap]).
 *
 * The window follows the work (loop_hold): after a page op (inline or not: ops.c op_hold), or
 * while a copy runs on a worker, the loop stays awake for as long as that copy takes at
 * LOOP_HOLD_BPS, since the next op of a
 * stream arrives only after it (a client copying 4 MiB out of its lease for ~0.5 ms, a worker's
 * copy completing). A 200 us window ran out inside every large page, and each page paid a
 * sleep and a wake-up (20 us quiet, 50-100 us loaded). An idle round yields the CPU
 * (sched_yield) when a client spins on this same CPU, so that it runs
 * rather than waits for our time slice to end: with client and broker pinned to one CPU, both
 * spinning turned a 64 KiB GET into milliseconds. Only then (the share_cpu hook, the spinning
 * hints of wire.h), or while a worker copies a page for us on a machine short of CPUs
 * (xfer.c [copy-yield]): on a loaded machine a yield hands the CPU to unrelated tasks for a time
 * slice, which took t_fairness's p99 from ~5 to 20-40 ms. A busy round that posted completions
 * to a client spinning on this CPU yields too [busy-share]: beside a flood every round has
 * work, and the loop kept the CPU until its slice ran out while that client waited to take
 * them (64 KiB GETs beside a LOOKUP flood, all on one CPU: p50 1.2-1.4 ms, 58 us yielding).
 *
 * Whenever epoll returned events, one round runs before their callbacks [rings-first], so
 * that an SQE published before a control request was sent is done when it is answered.
 *
 * [stretch] What the loop did between two looks at epoll (rounds, callbacks, the tick) is
 * timed in this thread's CPU time, so that neither sleeps nor the time the scheduler gave the
 * CPU to others count: it is how long the broker's own work kept every other client's turn,
 * control request and hang-up waiting. Every session's turn falls inside it, so a round that
 * overran its budget shows (STATS loop_stretch_max_us, loop_stretches_over_ms). The clock is
 * a system call (0.9 us on these VMs, where the monotonic one is 30 ns), so it is read only
 * where epoll_wait is: at most every POLL_EPOLL_MIN_GAP while busy. A busy loop's stretch is
 * about POLL_EPOLL_GAP plus its longest round.
 */
#include <errno.h>
#include <sched.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "loop.h"

#define POLL_EPOLL_EVERY 32
/*
 * ... and at least this often (seconds) while busy: a round does up to a turn of work per
 * client, so 32 rounds with big pages took tens of ms, and control requests and hang-ups
 * waited that long (t_rel_ctl_latency).
 */
#define POLL_EPOLL_GAP 0.001
/*
 * ... but no more often than this: while a client streams page ops the loop mostly turns idle
 * rounds of ~0.1 us between its SQEs, and every 32nd of them was an epoll_wait (0.3 per 64 KiB
 * GET, a syscall the next SQE could arrive in). Rings, copy completions and the disk ring are
 * polled every round anyway; what only epoll sees (control requests, hang-ups, new clients)
 * waits at most this long more.
 */
#define POLL_EPOLL_MIN_GAP 50e-6

int loop_init(struct loop *l, double window, const struct loop_hooks *h)
{
	memset(l, 0, sizeof(*l));
	l->window = window;
	l->h = *h;
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	return l->epfd < 0 ? -errno : 0;
}

void loop_fini(struct loop *l)
{
	if (l->epfd >= 0)
		close(l->epfd);
	l->epfd = -1;
}

int loop_add(struct loop *l, int fd, struct loop_fd *h)
{
	return loop_add_events(l, fd, h, EPOLLIN);
}

int loop_add_events(struct loop *l, int fd, struct loop_fd *h, uint32_t events)
{
	struct epoll_event ev = {.events = events, .data.ptr = h};

	return epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

int loop_mod(struct loop *l, int fd, struct loop_fd *h, uint32_t events)
{
	struct epoll_event ev = {.events = events, .data.ptr = h};

	return epoll_ctl(l->epfd, EPOLL_CTL_MOD, fd, &ev) < 0 ? -errno : 0;
}

void loop_del(struct loop *l, int fd)
{
	epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL);
}

/* A busy round checks epoll without blocking: every POLL_EPOLL_EVERY rounds, within the gaps. */
static int epoll_due(uint32_t round, double since)
{
	return since >= POLL_EPOLL_GAP ||
	       (!(round % POLL_EPOLL_EVERY) && since >= POLL_EPOLL_MIN_GAP);
}

static double thread_cpu(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const unsigned loop_stretch_ms[LOOP_NSTRETCH] = {1, 4, 16, 64};

/* [stretch] At each look at epoll: the CPU time since the previous one. */
static void loop_stretch(struct loop *l)
{
	double now = thread_cpu(), d = now - l->stretch_at;

	l->stretch_at = now;
	if (d > l->stretch_max)
		l->stretch_max = d;
	for (unsigned i = 0; i < LOOP_NSTRETCH; i++)
		l->stretches[i] += d > loop_stretch_ms[i] * 1e-3;
}

void loop_hold(struct loop *l, double secs)
{
	double until = clock_now() + (secs < LOOP_HOLD_MAX ? secs : LOOP_HOLD_MAX);

	if (until > l->hold_until)
		l->hold_until = until;
}

/*
 * epoll_wait with a timeout in microseconds (prepare_sleep's): epoll_pwait2 (Linux 5.11), or
 * epoll_wait's milliseconds, rounded up, on a kernel without it. Naps shorter than a
 * millisecond are the broker's own wake-ups for the note rings (session.c [note-nap]).
 */
static int loop_wait(struct loop *l, struct epoll_event *evs, int n, int timeout_us)
{
	static int no_pwait2;

	if (!no_pwait2) {
		struct timespec ts = {timeout_us / 1000000, (long)(timeout_us % 1000000) * 1000};
		int r = epoll_pwait2(l->epfd, evs, n, &ts, NULL);

		if (r >= 0 || errno != ENOSYS)
			return r;
		no_pwait2 = 1;
	}
	return epoll_wait(l->epfd, evs, n, (timeout_us + 999) / 1000);
}

int loop_run(struct loop *l)
{
	struct epoll_event evs[64];
	double last = clock_now(), last_ep = last, now;
	uint32_t round = 0;

	l->stretch_at = thread_cpu();
	while (!l->stop) {
		int timeout = 0, n, sleeping = 0, share = 0;

		if (l->h.poll(l->h.arg)) {
			last = now = clock_now();
			/* [busy-share] */
			if (l->h.share_cpu && l->h.share_cpu(l->h.arg, 1))
				sched_yield();
			if (!epoll_due(++round, now - last_ep))
				continue;
		} else if (((now = clock_now()) - last < l->window || now < l->hold_until) &&
			   (share = l->h.share_cpu ? l->h.share_cpu(l->h.arg, 0) : 0) < 2) {
			if (share)
				sched_yield();
			if (!epoll_due(++round, now - last_ep))
				continue;
		} else if ((timeout = l->h.prepare_sleep(l->h.arg)) > 0) {
			sleeping = 1;
			l->sleeps++;
		} else {
			l->h.wake(l->h.arg);
			continue;
		}
		n = loop_wait(l, evs, 64, timeout);
		last_ep = clock_now();
		loop_stretch(l);
		if (sleeping) {
			l->h.wake(l->h.arg);
			/*
			 * Only a real event restarts the poll window: not a nap's timeout, nor
			 * a doorbell alone, whose work the round below finds (or, notes only
			 * [told], does not).
			 */
			for (int i = 0; i < n; i++) {
				if (!((const struct loop_fd *)evs[i].data.ptr)->polled) {
					last = last_ep;
					break;
				}
			}
		}
		if (n < 0 && errno != EINTR) {
			log_error("epoll_wait: %d", errno);
			return -errno;
		}
		/*
		 * Rings before fds [rings-first]: whatever a client published before some client
		 * sent a control request (a kvb_release() that did not wait for its RELEASE, then a
		 * stats request of another client that must see the page unpinned) runs before that
		 * request is answered. A doorbell and a request that woke us together, or a request
		 * seen between two busy rounds, would otherwise be answered first.
		 */
		if (n > 0 && l->h.poll(l->h.arg))
			last = clock_now();
		for (int i = 0; i < n; i++) {
			struct loop_fd *h = evs[i].data.ptr;

			l->revents = evs[i].events;
			h->fn(h->arg);
		}
		l->h.tick(l->h.arg, sleeping);
	}
	return 0;
}
