// SPDX-License-Identifier: MIT
/*
 * loop.c - the broker's event loop: one thread that polls every client's submission ring,
 * serves control messages and new connections, and sleeps when there is nothing to do.
 *
 * Busy-poll window (the io_uring SQPOLL pattern): after the last SQE the loop keeps polling the
 * rings for --poll-us, checking epoll without blocking every POLL_EPOLL_EVERY rounds or every
 * POLL_EPOLL_GAP, whichever comes first. A sleeping wake-up costs ~10 us across CPUs on these
 * machines, a polled ring round trip ~0.5 us, so the window is what makes small ops cheap. Then
 * it sets NEED_WAKEUP on every SQ, re-checks them (ring.h [W1]) and blocks in epoll_wait on the
 * control sockets, the SQ doorbells, the pidfds, the listening socket, a signalfd, the disk
 * ring's eventfd and the copy engines' completion eventfds (so it sleeps correctly while I/O
 * and copies are in flight), waking at least once a second for watermark eviction.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "broker.h"
#include "log.h"
#include "metrics_http.h"

#define POLL_EPOLL_EVERY 32
/*
 * ... and at least this often (seconds) while busy: a round can copy ROUND_BYTES per client, so
 * 32 rounds with big pages took hundreds of ms, and control requests and hang-ups waited that
 * long (t_rel_ctl_latency).
 */
#define POLL_EPOLL_GAP 0.001
#define POLL_BATCH 64	/* SQEs per session per round: fairness between clients */
#define EVICT_BATCH 256 /* pages per watermark round */

double now_sec(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint32_t poll_sessions(struct broker *b)
{
	struct list *pos, *tmp;
	uint32_t work = xfer_poll(b); /* completed copies count as work: they post CQEs */

	list_for_each_safe (pos, tmp, &b->sessions) {
		struct session *s = list_entry(pos, struct session, link);
		struct session_counters before;
		int n;

		stats_snap(b, &before);
		n = session_poll(b, s, POLL_BATCH);
		if (n > 0) {
			work += (uint32_t)n;
			stats_account(b, s, &before); /* kvbctl clients/top */
		}
	}
	return work;
}

/*
 * Announces sleep on every SQ. Returns 0 when some SQ got entries meanwhile (don't sleep), else
 * the epoll timeout: a client whose full CQ stalls its SQ rings no doorbell when it reaps, so
 * while one is stalled the loop naps 1 ms at a time instead of a second.
 */
static int prepare_sleep(struct broker *b)
{
	struct list *pos;
	int timeout = 1000;

	list_for_each (pos, &b->sessions) {
		struct session *s = list_entry(pos, struct session, link);

		if (!s->region)
			continue;
		if (s->stalled)
			timeout = 1;
		else if (!kvb_ring_prepare_sleep(&s->sq, KVB_SQ_NEED_WAKEUP))
			return 0;
	}
	return timeout;
}

static void wake_all(struct broker *b)
{
	struct list *pos;

	list_for_each (pos, &b->sessions) {
		struct session *s = list_entry(pos, struct session, link);

		if (s->region)
			kvb_flag_clear(s->sq.flags, KVB_SQ_NEED_WAKEUP);
	}
}

static void on_signal(struct broker *b)
{
	struct signalfd_siginfo si;

	while (read(b->sigfd, &si, sizeof(si)) == sizeof(si)) {
		if (si.ssi_signo == SIGHUP) {
			log_info("SIGHUP: logs go to stderr, nothing to reopen");
			continue;
		}
		log_info("signal %u from pid %u: draining and exiting", si.ssi_signo, si.ssi_pid);
		b->stop = 1;
	}
}

static void on_event(struct broker *b, const struct epoll_event *ev)
{
	uint64_t tag = ev->data.u64 & TAG_MASK;
	struct session *s = (struct session *)(uintptr_t)(ev->data.u64 & ~(uint64_t)TAG_MASK);
	uint64_t v;

	if (ev->data.u64 == LOOP_LISTEN) {
		for (int i = 0; i < 64 && session_accept(b) > 0; i++)
			;
		return;
	}
	if (ev->data.u64 == LOOP_SIGNAL) {
		on_signal(b);
		return;
	}
	if (ev->data.u64 == LOOP_DISK) {
		tier_event(b); /* completions are reaped by tier_poll */
		return;
	}
	if (ev->data.u64 == LOOP_COPY) {
		xfer_event(b);
		return;
	}
	if (s->dead)
		return;
	if (tag == TAG_PID) {
		/* Its process is gone, even if the socket lives on in a child it forked. */
		session_destroy(b, s, s->control_only || !s->hello_done ? NULL : "process exited");
		return;
	}
	if (tag == TAG_SQ) {
		/* SQ doorbell: drain it; the rings are polled right after. */
		if (read(s->sq_efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
			log_debug("client %u: sq doorbell read: %d", s->id, errno);
		return;
	}
	session_on_msg(b, s);
}

int loop_run(struct broker *b)
{
	struct epoll_event evs[64];
	double last = now_sec(), window = b->cfg.poll_us * 1e-6, last_ep = last, now;
	uint32_t round = 0;

	while (!b->stop) {
		int timeout = 0, n, sleeping = 0;

		/* Disk completions count as activity: parked ops ran, new I/O may follow. */
		if (poll_sessions(b) + tier_poll(b)) {
			last = now = now_sec();
			if (++round % POLL_EPOLL_EVERY && now - last_ep < POLL_EPOLL_GAP)
				continue;
		} else if ((now = now_sec()) - last < window) {
			if (++round % POLL_EPOLL_EVERY && now - last_ep < POLL_EPOLL_GAP)
				continue;
		} else if ((timeout = prepare_sleep(b)) > 0) {
			sleeping = 1;
			xfer_arm(b);
		} else {
			wake_all(b);
			continue;
		}
		n = epoll_wait(b->epfd, evs, 64, timeout);
		last_ep = now_sec();
		if (sleeping) {
			wake_all(b);
			/* Only a real event restarts the poll window, not a nap's timeout. */
			if (n > 0)
				last = now_sec();
		}
		if (n < 0 && errno != EINTR) {
			log_error("epoll_wait: %d", errno);
			return -errno;
		}
		for (int i = 0; i < n; i++)
			on_event(b, &evs[i]);
		if (sleeping || !(round % (POLL_EPOLL_EVERY * 1024)))
			session_expire(b, now_sec());
		session_reap(b);
		store_evict_watermark(&b->store, EVICT_BATCH);
		if (b->metrics)
			metrics_http_tick(b);
	}
	return 0;
}
