// SPDX-License-Identifier: MIT
/*
 * session.c - one attached client: admission, its fds in the loop, its rings' turn in each
 * round (fair rounds: ops.h), its buffer slots, completion into its CQ, and teardown. The
 * control messages it receives are ctl.c's; its ops are the request engine's (ops.c).
 *
 * States:
 *
 *   accepted --SO_PEERCRED ok--> awaiting HELLO --HELLO ok--> ring client | control client
 *       |                            |                               |
 *       +--refused (closed, no fd)   +--bad version/msg: closed      +--hang-up, protocol
 *                                                                       violation, SIGTERM:
 *                                                                       session_destroy()
 *
 * The peer's identity is the kernel's (SO_PEERCRED at accept), never a message field. Its
 * process is pinned by a pidfd taken at accept (peer.c [pidfd]), which sits in the loop:
 * the connecting process's exit ends the session even when a child it forked still holds the
 * socket, and a recycled pid can never be mistaken for the client (the pidfd is in the loop).
 * Anything
 * the client controls (messages, fds, ring indices, SQE bytes) is validated before use, and a
 * violation that makes the channel untrustworthy (a malformed datagram, an impossible ring
 * index) ends only this session, with the reason logged.
 *
 * Limits, each answered -EUSERS at HELLO (a refusal the client can tell from a lost broker):
 * ring clients --max-clients, control-only connections --max-control, apart, so that idle
 * kvbctl-style connections never lock engines out. Control connections silent for
 * --control-idle seconds are closed. Handshakes (accepted, no HELLO yet) are at most CONN_SPARE:
 * a new one closes the oldest, so silent connects cannot lock anyone out; each has
 * SESSION_HELLO_TIMEOUT to say HELLO. Refusal and expiry log lines are throttled (LOG_GAP).
 *
 * Teardown releases, from broker-private bookkeeping alone, every lease, buffer mapping, view
 * and fd the session held.
 *
 * Loop thread only.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "orphan.h"
#include "broker.h"
#include "copy_cuda.h"
#include "log.h"
#include "proto.h"
#include "text.h"

static struct log_throttle tt_refused, tt_hello, tt_idle;

/* The loop's callbacks for a session's fds; a destroyed session waits for the batch's end. */
static void on_sock(void *arg)
{
	struct session *s = arg;

	if (!s->dead)
		ctl_on_msg(s->b, s);
}

static void on_pid(void *arg)
{
	struct session *s = arg;

	/* Its process is gone, even if the socket lives on in a child it forked. */
	if (!s->dead)
		session_destroy(s->b, s,
				s->control_only || !s->hello_done ? NULL : "process exited");
}

static void on_sq(void *arg)
{
	struct session *s = arg;
	uint64_t v;

	/* SQ doorbell: drain it; the rings are polled right after. */
	if (!s->dead && read(s->sq_efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_debug("client %u: sq doorbell read: %d", s->id, errno);
}

void session_on_listen(void *arg)
{
	for (int i = 0; i < 64 && session_accept(arg) > 0; i++)
		;
}

void session_region_init(struct broker *b, struct session *s, uint8_t *r, uint64_t size,
			 const struct kvb_region_hdr *h)
{
	uint8_t *notes = r + kvb_region_notes_off(h);
	uint32_t hz_max = b->cfg.max_leases < KVB_HZ_ENTRIES ? b->cfg.max_leases : KVB_HZ_ENTRIES;

	s->region = r;
	s->region_size = size;
	s->arg = r + h->arg_off;
	s->arg_size = h->arg_size;
	kvb_ring_init(&s->sq, (kvb_atomic_u32 *)(r + h->sq_head_off),
		      (kvb_atomic_u32 *)(r + h->sq_tail_off),
		      (kvb_atomic_u32 *)(r + h->sq_flags_off), r + h->sqes_off, h->sq_entries,
		      sizeof(struct kvb_sqe), 0);
	kvb_ring_init(&s->cq, (kvb_atomic_u32 *)(r + h->cq_head_off),
		      (kvb_atomic_u32 *)(r + h->cq_tail_off),
		      (kvb_atomic_u32 *)(r + h->cq_flags_off), r + h->cqes_off, h->cq_entries,
		      sizeof(struct kvb_cqe), 1);
	kvb_ring_init(&s->notes, (kvb_atomic_u32 *)(notes + KVB_NOTES_HEAD),
		      (kvb_atomic_u32 *)(notes + KVB_NOTES_TAIL), NULL, notes + KVB_NOTES_SQES,
		      KVB_NOTES_ENTRIES, sizeof(struct kvb_sqe), 0);
	/* [hazard] Without a directory no client can take such a lease: no table offered. */
	if (s->part < POOL_MAX_PARTS && b->store.dir[s->part].h) {
		s->hz_count = (kvb_atomic_u32 *)(r + kvb_region_hz_off(h) + KVB_HZ_COUNT);
		s->hz = (kvb_atomic_u64 *)(void *)(r + kvb_region_hz_off(h) + KVB_HZ_TABLE);
		s->hz_max = hz_max;
	} else {
		((struct kvb_region_hdr *)(void *)r)->features &= ~KVB_FEAT_HAZARDS;
	}
	s->hz_allow = (kvb_atomic_u32 *)(notes + KVB_HZ_MAX);
	s->hz_budget = (kvb_atomic_u64 *)(void *)(notes + KVB_HZ_BUDGET);
	session_hz_allow(b, s);
	s->loop_cpu = (kvb_atomic_u32 *)(r + KVB_REGION_BROKER_CPU);
	s->spin_cpu = (kvb_atomic_u32 *)(r + KVB_REGION_CLIENT_CPU);
	s->fill = (kvb_atomic_u32 *)(r + KVB_REGION_FILL);
	s->fill_stop = (kvb_atomic_u32 *)(r + KVB_REGION_FILL_STOP);
}

/*
 * [hazard] The limits hold for both kinds of lease together: a client's leases through us
 * shrink what it may take under its own table. The words were written once, and a client that
 * held 32 leases of ours could still take 32 more under its table (--max-leases 32: twice the
 * limit); t_rel_overload's 33rd lease got through when its first took our path (the page not
 * in the directory yet, [cqe-first]). A lease of ours granted while the client reads the words
 * can still slip past by the leases in flight, as before.
 */
void session_hz_allow(struct broker *b, struct session *s)
{
	uint64_t limit = ops_lease_limit(b, s->part), budget = limit;
	uint32_t left = b->cfg.max_leases > s->nleases ? b->cfg.max_leases - s->nleases : 0;

	if (!s->hz_allow)
		return;
	if (left > KVB_HZ_ENTRIES)
		left = KVB_HZ_ENTRIES;
	if (limit) /* 0 would be "no limit": 1 byte left is none */
		budget = limit > s->lease_bytes + 1 ? limit - s->lease_bytes : 1;
	kvb_store_relaxed(s->hz_allow, left);
	kvb_store64_relaxed(s->hz_budget, budget);
}

/*
 * [notes] Runs what s's note ring holds (wire.h KVB_FEAT_NOTES). Never ends the session, since
 * it runs in the middle of other work (a STATS request, an op, a teardown): an impossible tail
 * marks the ring for session_poll() to end the session, an entry that is not a directory read
 * or a RELEASE of ours is counted as a protocol error and skipped.
 */
void session_notes(struct broker *b, struct session *s)
{
	int64_t avail;

	if (!s->region || s->notes_bad)
		return;
	avail = kvb_ring_avail(&s->notes);
	if (avail < 0) {
		s->notes_bad = 1;
		return;
	}
	for (int64_t i = 0; i < avail; i++) {
		struct kvb_sqe sqe;
		int err;

		/* One copy out of shared memory, as for the SQ: only the copy is used. */
		memcpy(&sqe, kvb_ring_cons_slot(&s->notes, (uint32_t)i), sizeof(sqe));
		err = ops_note(b, s, &sqe);
		if (err == -ENOMEM) {
			b->ctr.errors++;
			avail = i; /* the rest stays for the next drain */
			break;
		}
		if (err)
			b->ctr.protocol_errors++;
	}
	if (avail)
		kvb_ring_consume(&s->notes, (uint32_t)avail);
	s->notes_read += (uint64_t)avail;
}

/* [hazard] The library's own lease ids lie above every page id (wire.h KVB_HZ_LEASE_MIN). */
static_assert(((uint64_t)STORE_MAX_SLABS << STORE_SLOT_BITS) <= KVB_HZ_LEASE_MIN,
	      "page ids stay below the library's lease ids");

/* [hazard] Entry i of s's table no longer holds the page we pinned for it. */
static void hz_drop(struct broker *b, struct session *s, uint32_t i)
{
	store_unpin(&b->store, s->hz_pin[i]);
	s->hz_pin[i] = NULL;
	s->hz_npins--;
}

/* [hazard] Entry i of s's table holds page pg (its value want) from now on: pinned for it. */
static void hz_hold(struct broker *b, struct session *s, uint32_t i, struct page *pg, uint64_t want)
{
	if (s->hz_pin[i])
		hz_drop(b, s, i); /* the entry moved on from the page we pinned for it */
	store_pin(&b->store, pg);
	s->hz_pin[i] = pg;
	s->hz_val[i] = want;
	s->hz_at[i] = clock_now();
	s->hz_npins++;
}

/*
 * [hazard] store.c's withdrawn hook: page pg left the directory (its entry is withdrawn) and is
 * about to be freed or rewritten. Every session whose hazard table names it gets a pin on it,
 * held until that entry changes (session_settle). The full fence pairs with the client's
 * [H1] (wire.h): it sees the withdrawal, or we see its entry.
 */
void session_hz_withdrawn(void *arg, struct page *pg)
{
	struct broker *b = arg;
	uint64_t want = store_loc(&b->store, pg) | 1;
	uint32_t part = store_part_of(&b->store, pg);
	struct list *pos;

	kvb_fence_full(); /* [H1] */
	list_for_each (pos, &b->sessions) {
		struct session *s = list_entry(pos, struct session, link);

		/* Only a reader of this partition's pool maps the page (a table naming others'
		 * pages is ignored); a count of 0 is a client reading nothing under it. */
		if (!s->hz || s->part != part || !kvb_load_relaxed(s->hz_count))
			continue;
		for (uint32_t i = 0; i < s->hz_max; i++) { /* it may use no more */
			if (kvb_load64_relaxed(&s->hz[i]) != want || s->hz_pin[i] == pg)
				continue;
			hz_hold(b, s, i, pg, want);
			b->ctr.hazard_pins++;
		}
	}
}

/* [hazard] Entry i no longer names the page we pinned for it (acquire: after its reads). */
static int hz_moved(const struct session *s, uint32_t i)
{
	return kvb_load64_acquire(&s->hz[i]) != s->hz_val[i];
}

void session_hz_told(struct broker *b, struct session *s, uint64_t id, struct page *pg,
		     uint64_t bytes)
{
	uint32_t i = (uint32_t)id - KVB_HZ_LEASE_MIN;
	uint64_t want;

	/* Its word only, checked only to stay in its table: it can misstate its own figures. */
	if ((uint32_t)id < KVB_HZ_LEASE_MIN || i >= s->hz_max || !s->hz)
		return;
	if (!bytes) { /* a RELEASE */
		if (!s->hz_bytes[i]) {
			s->hz_gone[i] = id; /* before its ACQUIRE: that one counts nothing */
			return;
		}
		s->hz_leases--;
		b->leases--;
		s->hz_held -= s->hz_bytes[i];
		b->leased_bytes[s->part] -= s->hz_bytes[i];
		s->hz_bytes[i] = 0;
		if (s->hz_pin[i] && hz_moved(s, i))
			hz_drop(b, s, i);
		return;
	}
	if (s->hz_bytes[i] || s->hz_gone[i] == id)
		return; /* an entry told twice, or a lease released already */
	s->hz_leases++;
	b->leases++;
	s->hz_held += bytes;
	b->leased_bytes[s->part] += bytes;
	s->hz_bytes[i] = bytes;
	if (!pg || store_part_of(&b->store, pg) != s->part)
		return;
	want = store_loc(&b->store, pg) | 1;
	if (kvb_load64_relaxed(&s->hz[i]) != want)
		return; /* released already (or the entry moved on): nothing to hold */
	if (s->hz_pin[i] == pg)
		s->hz_at[i] = clock_now(); /* the same page leased again: a lease of now */
	else
		hz_hold(b, s, i, pg, want);
}

/* [hazard] Drops the pins of entries that no longer name their page (all of them: all). */
static int hz_unpin(struct broker *b, struct session *s, int all)
{
	int n = 0;

	for (uint32_t i = 0; s->hz_npins && i < KVB_HZ_ENTRIES; i++) {
		if (s->hz_pin[i] && (all || hz_moved(s, i))) {
			hz_drop(b, s, i);
			n++;
		}
	}
	return n;
}

/* [notes] What s told us, then [hazard] the pins of its entries that moved on. */
static void settle_one(struct broker *b, struct session *s)
{
	session_notes(b, s);
	if (s->hz_npins)
		(void)hz_unpin(b, s, 0);
}

int session_settle(struct broker *b)
{
	uint64_t pinned = b->store.st.pinned;
	struct list *pos;

	list_for_each (pos, &b->sessions)
		settle_one(b, list_entry(pos, struct session, link));
	return b->store.st.pinned < pinned;
}

uint32_t session_poll_all(struct broker *b)
{
	struct list *pos, *tmp;
	uint32_t work = 0;

	list_for_each_safe (pos, tmp, &b->sessions) {
		uint32_t told;
		int n = session_poll(b, list_entry(pos, struct session, link), SESSION_POLL_BATCH,
				     &told);

		/*
		 * [told] Notes a full note ring sent to the SQ are no work: a client streaming
		 * reads through the directory or its hazard table rings the doorbell once per
		 * ring's worth of them, and a poll window after each wake-up kept our CPU busy a
		 * fifth of the time for nothing (64 KiB ACQUIREs).
		 */
		if (n > 0)
			work += (uint32_t)n - told;
	}
	return work;
}

/*
 * [note-nap] A client reading through the directory or its hazard table tells us of each read
 * in its note ring and rings our doorbell when the ring is three quarters full (client/ring.c
 * [note-early]). A write(2) that wakes a sleeping broker costs the writer about 12 us on these
 * VMs (docs/design.md [told]): one per 192 notes, and a 64 KiB ACQUIRE and RELEASE send two.
 * So while notes come we sleep only as long as half a ring of them took since the last sleep,
 * and drain them when our own timer wakes us: the client rings only when its rate jumps. The
 * naps cost us about the wake-ups its doorbells did; a client quiet since the last sleep, none.
 */
#define SLEEP_MAX_US 1000000 /* a second, so that watermark eviction runs */
#define NOTE_NAP_MIN_US 50
#define NOTE_NAP_NOTES (KVB_NOTES_ENTRIES / 2)

static int note_nap_us(struct session *s, double now)
{
	uint64_t n = s->notes_read - s->nap_read;
	double dt = now - s->nap_at, us;

	s->nap_read = s->notes_read;
	s->nap_at = now;
	if (!n || dt <= 0)
		return SLEEP_MAX_US;
	us = dt * 1e6 * NOTE_NAP_NOTES / (double)n;
	return us < NOTE_NAP_MIN_US ? NOTE_NAP_MIN_US : us > SLEEP_MAX_US ? SLEEP_MAX_US : (int)us;
}

/*
 * A client whose full CQ stalls its SQ rings no doorbell when it reaps, so while one is
 * stalled the loop naps 1 ms at a time instead of a second.
 */
int session_prepare_sleep(struct broker *b)
{
	struct list *pos;
	int timeout = SLEEP_MAX_US;
	double now = clock_now();

	list_for_each (pos, &b->sessions) {
		struct session *s = list_entry(pos, struct session, link);
		int nap;

		if (!s->region)
			continue;
		settle_one(b, s); /* counted and unpinned before a nap of up to a second */
		nap = note_nap_us(s, now);
		if (nap < timeout)
			timeout = nap;
		if (s->stalled) {
			if (timeout > 1000)
				timeout = 1000;
		} else if (!kvb_ring_prepare_sleep(&s->sq, KVB_SQ_NEED_WAKEUP)) {
			return 0;
		}
		/*
		 * A filled PUT waiting for its bytes (xfer.c [fill]): its client rings the SQ
		 * doorbell after publishing more while NEED_WAKEUP is set, so re-check the fill
		 * word after announcing the sleep ([W1], as for the SQ tail); the timeout bounds
		 * how late a stalled fill is given up.
		 */
		if (!list_empty(&s->yieldq.ops)) {
			if (kvb_load_acquire(s->fill) != s->fill_seen) {
				kvb_flag_clear(s->sq.flags, KVB_SQ_NEED_WAKEUP);
				return 0;
			}
			if (timeout > 20000)
				timeout = 20000;
		}
	}
	return timeout;
}

void session_note_cpu(struct broker *b)
{
	uint32_t cpu = (uint32_t)sched_getcpu() + 1u;
	struct list *pos;

	if (cpu == b->loop_cpu)
		return;
	b->loop_cpu = cpu;
	list_for_each (pos, &b->sessions) {
		struct session *s = list_entry(pos, struct session, link);

		if (s->region && s->loop_cpu)
			kvb_store_relaxed(s->loop_cpu, cpu);
	}
}

int session_cq_spun(struct broker *b)
{
	int r = b->cq_spun;

	b->cq_spun = 0;
	return r;
}

int session_cpu_shared(struct broker *b)
{
	struct list *pos;

	/* b->loop_cpu is this round's: broker_poll noted it (the loop polls before each idle
	 * round asks this). */
	list_for_each (pos, &b->sessions) {
		struct session *s = list_entry(pos, struct session, link);

		if (s->region && s->spin_cpu && kvb_load_relaxed(s->spin_cpu) == b->loop_cpu)
			/*
			 * [fill] It fills a PUT's source that we wait for on our CPU: a yield gives
			 * it the CPU only until the scheduler picks us again, so sleep until its
			 * next chunk rings (session_prepare_sleep, ring.h [W1]).
			 */
			return list_empty(&s->yieldq.ops) ? 1 : 2;
	}
	return 0;
}

void session_wake_all(struct broker *b)
{
	struct list *pos;

	list_for_each (pos, &b->sessions) {
		struct session *s = list_entry(pos, struct session, link);

		if (s->region)
			kvb_flag_clear(s->sq.flags, KVB_SQ_NEED_WAKEUP);
	}
}

/* May this peer attach? Same uid, root, or a member of the group named at start-up. */
static int peer_allowed(const struct broker *b, int fd, const struct ucred *cr)
{
	gid_t groups[256];
	socklen_t len = sizeof(groups);

	if (cr->uid == geteuid() || cr->uid == 0)
		return 1;
	if (!b->cfg.has_group)
		return 0;
	if (cr->gid == b->cfg.group)
		return 1;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
		return 0;
	for (size_t i = 0; i < len / sizeof(gid_t); i++)
		if (groups[i] == b->cfg.group)
			return 1;
	return 0;
}

void session_init(struct broker *b, struct session *s)
{
	s->b = b;
	s->on_sock = (struct loop_fd){.fn = on_sock, .arg = s};
	s->on_sq = (struct loop_fd){.fn = on_sq, .arg = s, .polled = 1};
	s->on_pid = (struct loop_fd){.fn = on_pid, .arg = s};
	list_init(&s->link);
	list_init(&s->live);
	waitq_init(&s->yieldq);
}

int session_buf_slot(const struct broker *b, const struct session *s, uint32_t *id)
{
	/* Host and GPU buffers alike: --max-bufs is the client's, whatever the memory. */
	for (*id = 0; *id < b->cfg.max_bufs && *id < SESSION_MAX_BUFS && s->bufs[*id].base; (*id)++)
		;
	return *id < b->cfg.max_bufs && *id < SESSION_MAX_BUFS ? 0 : -EMFILE;
}

int session_accept(struct broker *b)
{
	const char *how = NULL;
	struct ucred cr = {0};
	socklen_t len = sizeof(cr);
	struct session *s;
	int fd, err;

	fd = accept4(b->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd < 0 && (errno == EMFILE || errno == ENFILE) && b->spare_fd >= 0) {
		/*
		 * Out of fds: the pending connection would keep the level-triggered listening
		 * socket readable and the loop spinning. Use the spare fd to take it and close it.
		 */
		close(b->spare_fd);
		fd = accept4(b->listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (fd >= 0)
			close(fd);
		b->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		log_throttled(&tt_refused, "refused a connection: %s", "out of file descriptors");
		b->ctr.refused++;
		return fd >= 0 ? 1 : 0;
	}
	if (fd < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -errno;
	/*
	 * Refused peers still count as progress for the caller's accept loop. A backstop only:
	 * each kind of connection is bounded below (handshakes here, the rest at HELLO).
	 */
	if (b->nconns >= b->cfg.max_clients + b->cfg.max_control + CONN_SPARE) {
		log_throttled(&tt_refused, "refused a connection: %u connections open", b->nconns);
		b->ctr.refused++;
		close(fd);
		return 1;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0 || !peer_allowed(b, fd, &cr)) {
		log_throttled(&tt_refused, "refused pid %d uid %d: not the broker's uid or group",
			      (int)cr.pid, (int)cr.uid);
		b->ctr.refused++;
		close(fd);
		return 1;
	}
	/* Too many handshakes: the oldest silent one makes room (a client says HELLO at once). */
	if (b->npending >= CONN_SPARE) {
		struct list *pos;

		list_for_each (pos, &b->sessions) {
			struct session *o = list_entry(pos, struct session, link);

			if (!o->hello_done) {
				log_throttled(&tt_hello,
					      "client %u (pid %d): closed: no HELLO in time (%u "
					      "handshakes pending)",
					      o->id, (int)o->pid, b->npending);
				b->ctr.expired++;
				session_destroy(b, o, NULL);
				break;
			}
		}
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		close(fd);
		return -ENOMEM;
	}
	s->sock = fd;
	s->pid = cr.pid;
	s->uid = cr.uid;
	s->gid = cr.gid;
	s->id = ++b->next_id;
	s->accepted_at = s->active_at = clock_now();
	s->region_fd = s->sq_efd = s->cq_efd = -1;
	s->node = -1;
	s->pidfd = peer_pidfd(fd, cr.pid, &how);
	session_init(b, s);
	err = loop_add(&b->loop, fd, &s->on_sock);
	if (!err && s->pidfd >= 0)
		err = loop_add(&b->loop, s->pidfd, &s->on_pid);
	if (err) {
		if (s->pidfd >= 0)
			close(s->pidfd);
		close(fd);
		free(s);
		return err;
	}
	list_add_tail(&b->sessions, &s->link);
	b->nconns++;
	b->npending++;
	log_debug("client %u: connected, pid %d uid %d, pidfd %s", s->id, (int)s->pid, (int)s->uid,
		  s->pidfd >= 0 ? how : "none");
	return 1;
}

void session_revoke(struct session *s)
{
	/* The broker is the only writer of this word; a client's own writes do not matter. */
	if (s->region)
		kvb_store_release(s->sq.flags, kvb_load_relaxed(s->sq.flags) | KVB_SQ_REVOKED);
}

void session_destroy(struct broker *b, struct session *s, const char *why)
{
	if (why)
		log_info("client %u (%s, pid %d): disconnected: %s (released %u leases)", s->id,
			 s->name[0] ? s->name : "?", (int)s->pid, why, s->nleases);
	session_notes(b, s); /* [notes] its last reads count */
	ops_release_all(b, s);
	orphan_session_drop(b, s); /* [records] */
	(void)hz_unpin(b, s, 1);
	b->leases -= s->hz_leases; /* [hazard] its own, as told */
	b->leased_bytes[s->part] -= s->hz_held;
	s->hz_leases = 0;
	s->hz_held = 0;
	if (s->tenant_bound)
		tenant_detach(&b->tt, s->part);
	s->tenant_bound = 0;
	if (s->region)
		bg_unmap(b->bg, s->region, s->region_size);
	s->region = NULL;
	if (s->sq_efd >= 0) {
		/*
		 * The client holds a dup of this eventfd, so closing ours would not take it out of
		 * the epoll set: a later doorbell would name a freed session. Remove it first.
		 */
		loop_del(&b->loop, s->sq_efd);
		close(s->sq_efd);
	}
	if (s->cq_efd >= 0)
		close(s->cq_efd);
	if (s->pidfd >= 0) {
		/*
		 * The keeper holds a dup of it in the session's record (orphan.c) until it hears
		 * that the record is dropped, so closing ours would not take it out of the epoll
		 * set: the client's exit would then name a freed session, or a new one calloc gave
		 * the same memory, which was ended before its HELLO (t_pidfd_stale).
		 */
		loop_del(&b->loop, s->pidfd);
		close(s->pidfd);
	}
	close(s->sock); /* also leaves the epoll set */
	list_del(&s->link);
	if (!s->hello_done)
		b->npending--;
	else if (s->control_only)
		b->ncontrol--;
	else
		b->nsessions--;
	b->nconns--;
	b->ctr.disconnects++;
	/*
	 * Events for it may still sit in the current epoll batch: free after the batch. Ops in
	 * flight may still be copying to or from its buffers: those stay mapped until the last
	 * one completed (session_complete), so a dead client's memory is never touched after
	 * it was unmapped and never unmapped under a copy.
	 */
	s->dead = 1;
	s->dead_at = clock_now();
	list_add_tail(&b->graveyard, &s->link);
	/* Its parked ops complete now, unrun; those a copy engine or the disk holds finish. */
	ops_session_dead(b, s);
}

/* Unmaps a host buffer, or closes a GPU buffer's handle (copy_cuda.c); no op may use it. */
void session_buf_release(struct broker *b, struct session *s, struct sbuf *sb)
{
	if (sb->fdb) {
		fdcopy_buf_close(sb);
		s->buf_bytes -= sb->len;
		s->nfdbufs--;
	} else if (sb->dev == COPY_HOST) {
		/* Off the loop: GiBs of page tables (and perhaps the memory) take tens of ms. */
		bg_unmap(b->bg, (uint8_t *)sb->base - sb->lead, sb->lead + sb->len);
		s->buf_bytes -= sb->lead + sb->len;
	} else {
		copy_gpu_put(b->gpu, sb->gm);
	}
	*sb = (struct sbuf){0};
}

/* The last of a dead session: what in-flight ops may still have been using. */
static void session_free(struct broker *b, struct session *s)
{
	for (uint32_t i = 0; i < SESSION_MAX_BUFS; i++)
		if (s->bufs[i].base)
			session_buf_release(b, s, &s->bufs[i]);
	for (uint32_t i = 0; i < SESSION_MAX_VIEWS; i++)
		if (s->views[i])
			sview_put(s->views[i]);
	/* After its last op and view: nothing of it refers to its namespaces now [ns-free]. */
	for (uint32_t id = 0; s->nns && id < STORE_MAX_NS; id++)
		if (s->ns_opened[id / 8] & (1u << (id % 8)))
			ops_ns_close(b, id);
	free(s->stats_doc);
	free(s);
}

/* Wakes a client sleeping on its CQ (ring.h NEED_WAKEUP protocol). */
static void cq_doorbell(struct session *s)
{
	uint64_t one = 1;

	/* [busy-share] It spins for these on the loop's CPU: the round ends with a yield. */
	if (s->spin_cpu && kvb_load_relaxed(s->spin_cpu) == s->b->loop_cpu)
		s->b->cq_spun = 1;
	if (kvb_ring_needs_wakeup(&s->cq, KVB_CQ_NEED_WAKEUP) &&
	    write(s->cq_efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_warn("client %u: cq doorbell: %s", s->id, strerror(errno));
}

void session_expire(struct broker *b, double now)
{
	struct list *pos, *tmp;

	list_for_each_safe (pos, tmp, &b->sessions) {
		struct session *s = list_entry(pos, struct session, link);

		if (!s->hello_done && now - s->accepted_at > SESSION_HELLO_TIMEOUT) {
			b->ctr.protocol_errors++;
			b->ctr.expired++;
			log_throttled(&tt_hello, "client %u (pid %d): closed: no HELLO in time",
				      s->id, (int)s->pid);
			session_destroy(b, s, NULL);
		} else if (s->control_only && b->cfg.control_idle > 0 &&
			   now - s->active_at > b->cfg.control_idle) {
			b->ctr.expired++;
			log_throttled(&tt_idle,
				      "client %u (%s, pid %d): closed: control connection idle for "
				      "%.0f s (--control-idle)",
				      s->id, s->name[0] ? s->name : "?", (int)s->pid,
				      now - s->active_at);
			session_destroy(b, s, NULL);
		} else if ((s->nleases || s->hz_npins) && b->cfg.lease_lifetime > 0) {
			/* [lease-limits] A lease held this long is a client that stopped: its
			 * session ends, its leases go, and its library unmaps the pool. So does a
			 * page pinned for its hazard table ([hazard]). */
			double oldest = now;

			for (uint32_t i = 0; i < s->nleases; i++)
				if (s->lease_at[i] < oldest)
					oldest = s->lease_at[i];
			for (uint32_t i = 0; s->hz_npins && i < KVB_HZ_ENTRIES; i++)
				if (s->hz_pin[i] && s->hz_at[i] < oldest)
					oldest = s->hz_at[i];
			if (now - oldest > b->cfg.lease_lifetime) {
				b->ctr.expired++;
				log_warn("client %u (%s, pid %d): a lease held for %.0f s "
					 "(--lease-lifetime %.0f): disconnected",
					 s->id, s->name[0] ? s->name : "?", (int)s->pid,
					 now - oldest, b->cfg.lease_lifetime);
				session_revoke(s);
				session_destroy(b, s, "lease lifetime exceeded");
			}
		}
	}
}

/* A session draining too long: what its ops wait for, in the log (once). */
static void drain_log(struct session *s, double now)
{
	char what[512];
	size_t len = 0;
	uint32_t shown = 0;
	struct list *pos;

	what[0] = '\0';
	list_for_each (pos, &s->live) {
		const struct op *op = list_entry(pos, struct op, slink);
		int n;

		if (shown++ == 4)
			break;
		n = snprintf(what + len, sizeof(what) - len, "%sop %u (%s, %.1f s)",
			     shown > 1 ? "; " : "", op->sqe.opcode,
			     op->waits ? op->waits : "running", now - op->since);
		if (n < 0 || (size_t)n >= sizeof(what) - len)
			break;
		len += (size_t)n;
	}
	log_warn("client %u (%s, pid %d): gone %.1f s ago and still draining: %u ops in flight: "
		 "%s%s",
		 s->id, s->name[0] ? s->name : "?", (int)s->pid, now - s->dead_at, s->inflight,
		 what, s->nops > 4 ? "; ..." : "");
}

void session_reap(struct broker *b)
{
	struct list *pos, *tmp;
	double now = 0;

	list_for_each_safe (pos, tmp, &b->graveyard) {
		struct session *s = list_entry(pos, struct session, link);

		if (s->inflight) {
			if (!s->drain_logged &&
			    (now ? now : (now = clock_now())) - s->dead_at > SESSION_DRAIN_WARN) {
				s->drain_logged = 1;
				drain_log(s, now);
			}
			continue;
		}
		list_del(pos);
		session_free(b, s);
	}
}

void session_complete(struct broker *b, struct session *s, const struct kvb_cqe *cqe)
{
	s->inflight--;
	if (s->dead)
		return; /* its ring is gone; session_reap frees it once nothing is in flight */
	/* Buffers unregistered while copies were in flight go once the last op completed. */
	for (uint32_t i = 0; !s->inflight && s->nclosing && i < SESSION_MAX_BUFS; i++) {
		if (s->bufs[i].closing) {
			session_buf_release(b, s, &s->bufs[i]);
			s->nclosing--;
		}
	}
	/* session_poll reserved this CQ slot when it consumed the SQE. */
	memcpy(kvb_ring_prod_slot(&s->cq, 0), cqe, sizeof(*cqe));
	kvb_ring_publish(&s->cq, 1);
	cq_doorbell(s);
}

int session_poll(struct broker *b, struct session *s, uint32_t max, uint32_t *told)
{
	int64_t avail, space;
	uint64_t work = 0;
	uint32_t n, i, posted = 0, ran = 0;
	int r;

	*told = 0;
	if (!s->region)
		return 0;
	if (s->notes_bad) {
		b->ctr.protocol_errors++;
		session_destroy(b, s, "impossible note-ring tail");
		return -1;
	}
	s->stalled = 0;
	/* Its long ops' next steps first: they hold CQ slots already (fair rounds, ops.h). */
	if (!list_empty(&s->yieldq.ops)) {
		work = ops_run_yielded(b, s, OPS_ROUND_WORK);
		ran = work > 0; /* a filled PUT waiting for its bytes did none (xfer.c [fill]) */
		if (work >= OPS_ROUND_WORK)
			return 1;
	}
	avail = kvb_ring_avail(&s->sq);
	if (avail <= 0) {
		if (avail < 0) {
			b->ctr.protocol_errors++;
			session_destroy(b, s, "impossible submission-queue tail");
			return -1;
		}
		return (int)ran;
	}
	/*
	 * The room from the client's CQ head as last seen, when that is enough: re-reading it is
	 * a cache miss between this client's SQE and our work on it. It is read (and checked)
	 * again after the batch below, off that path.
	 */
	space = kvb_ring_space_min(&s->cq, (uint32_t)(avail < max ? avail : max) + s->inflight);
	if (space < 0) {
		b->ctr.protocol_errors++;
		session_destroy(b, s, "impossible completion-queue head");
		return -1;
	}
	/*
	 * Back-pressure: an SQE is consumed only when its CQE has a place to go, counting the
	 * places already promised to ops in flight, so a late completion always finds its slot.
	 */
	space -= s->inflight;
	/* --max-inflight: ops taken from the SQ whose CQE is not posted yet. */
	if (space > (int64_t)b->cfg.max_inflight - s->inflight)
		space = (int64_t)b->cfg.max_inflight - s->inflight;
	n = (uint32_t)(space <= 0 ? 0 : avail < space ? avail : space);
	s->stalled = !n;
	if (n > max)
		n = max;
	/*
	 * Fair rounds: the turn ends when its ops did about OPS_ROUND_WORK units of work (keys
	 * looked up, segments built, bytes copied inline), so no client's legal ops hold the
	 * others up for more than about 200 us per round (4096 units of ~50 ns; t_fairness
	 * sees a flooder's turn take ~130 us, docs/design.md "fair rounds").
	 */
	for (i = 0; i < n && work < OPS_ROUND_WORK; i++) {
		struct kvb_sqe sqe;
		struct kvb_cqe cqe;
		uint64_t w;

		/*
		 * One copy out of shared memory; only the copy is validated and used. The CQE
		 * is built privately too: the client can scribble on its slot at any time.
		 */
		memcpy(&sqe, kvb_ring_cons_slot(&s->sq, i), sizeof(sqe));
		s->batch_more = i + 1 < (uint32_t)avail;
		xfer_commit_late(b); /* [cqe-first] the op before it committed */
		b->late_ok = 1;
		r = ops_submit(b, s, &sqe, &cqe, &w);
		b->late_ok = 0;
		if (r == OPS_DEFERRED)
			s->inflight++;
		else
			memcpy(kvb_ring_prod_slot(&s->cq, posted++), &cqe, sizeof(cqe));
		work += w;
		*told += (uint32_t)ops_told(&sqe);
	}
	if (!i)
		return (int)ran;
	kvb_ring_consume(&s->sq, i);
	if (posted) {
		kvb_ring_publish(&s->cq, posted);
		cq_doorbell(s);
	}
	xfer_commit_late(b); /* [cqe-first] its CQE is out */
	/* An impossible CQ head ends the session as promptly as when it was read first. */
	if (kvb_ring_space(&s->cq) < 0) {
		b->ctr.protocol_errors++;
		session_destroy(b, s, "impossible completion-queue head");
		return -1;
	}
	return (int)(i + ran);
}
