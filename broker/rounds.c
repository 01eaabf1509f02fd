// SPDX-License-Identifier: MIT
/*
 * rounds.c - what the broker does in each loop round and around each sleep: the hooks main.c
 * hands the loop (loop.h), so that loop.c stays a leaf that knows no subsystem.
 *
 * A round: completed copies (they complete ops), woken ops (the request engine's one resume
 * path), one turn of every session (fair rounds, ops.h), then the disk ring (submissions and
 * completions; they count as work: parked ops ran, new I/O may follow). Before a sleep: every
 * SQ announces it (NEED_WAKEUP) and busy copy engines arm their completion eventfds. After each
 * epoll batch: handshake and idle expiry, the graveyard, watermark eviction, the metrics
 * snapshot. Loop thread only.
 */
#include "broker.h"
#include "metrics_http.h"
#include "orphan.h"
#include "tenant.h"
#include "watch.h"

#define EVICT_BATCH 256	  /* pages per watermark round */
#define EXPIRE_EVERY 0.25 /* seconds between expiry checks while busy */

static uint32_t broker_poll(void *arg)
{
	struct broker *b = arg;
	uint32_t work;

	session_note_cpu(b); /* where we poll, for clients deciding whether to spin (wire.h) */
	work = xfer_poll(b);

	work += ops_poll(b);
	work += session_poll_all(b);
	work += tier_poll(b);
	if (!work) {
		store_evict_ahead(&b->store);	   /* [evict-ahead] */
		store_prefetch_victims(&b->store); /* [evict-prefetch] */
	}
	return work;
}

static int broker_prepare_sleep(void *arg)
{
	struct broker *b = arg;
	int timeout = session_prepare_sleep(b); /* microseconds */

	if (timeout > 0) {
		int rt = remote_sleep_ms(b);

		/* A remote deadline or a reconnect is due (its time in ms). */
		if (rt >= 0 && rt * 1000 < timeout)
			timeout = (rt ? rt : 1) * 1000;
		xfer_arm(b);
	}
	return timeout;
}

static void broker_wake(void *arg)
{
	session_wake_all(arg);
}

static int broker_share_cpu(void *arg, int busy)
{
	struct broker *b = arg;

	/* [busy-share] A client spinning on our CPU has completions to take. */
	if (busy)
		return session_cq_spun(b);
	/* A worker copies a page for us: let it have the CPU (xfer.c [copy-yield]). */
	if (b->copy_yield && b->copy_yield_on)
		return 1;
	return session_cpu_shared(b);
}

static void broker_tick(void *arg, int slept)
{
	struct broker *b = arg;
	double now = clock_now();

	b->store.now = now; /* [hist] the store's clock for page ages */
	/* [notes][hazard] within a tick: the expiry (leases released) and the LRU see them */
	(void)session_settle(b);
	if (slept || now - b->expired_at >= EXPIRE_EVERY) {
		session_expire(b, now);
		b->expired_at = now;
	}
	session_reap(b);
	ops_tick(b, now); /* [seg-list] idle segment lists go */
	remote_tick(b);	  /* deadlines: a fetch past its own misses, it never holds the loop */
	store_evict_watermark(&b->store, EVICT_BATCH);
	tenant_tick(&b->tt, &b->pool, &b->store, now); /* [tenant-lend] */
	watch_tick(b, now); /* the keeper, the socket and lock files: once a second */
	if (b->orphan_st.live)
		orphan_tick(b); /* [orphans] clients of the previous broker that let go */
	if (b->metrics)
		metrics_http_tick(b);
}

void rounds_hooks(struct broker *b, struct loop_hooks *h)
{
	*h = (struct loop_hooks){.poll = broker_poll,
				 .prepare_sleep = broker_prepare_sleep,
				 .wake = broker_wake,
				 .share_cpu = broker_share_cpu,
				 .tick = broker_tick,
				 .arg = b};
}
