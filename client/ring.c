// SPDX-License-Identifier: MIT
/*
 * ring.c - the client's half of the rings: posting SQEs, waiting for and demultiplexing CQEs,
 * kvb_submit() and kvb_reap().
 *
 * Slots and tokens. Every op in flight owns a slot (internal.h). The SQE's user_data is the
 * slot's token, gen << 32 | index, never the caller's value: a CQE finds its slot in O(1), a
 * synchronous call can never be confused with an async op whatever user_data the caller picks,
 * and a token from a recycled slot (gen moved on) or a forged one is counted and ignored. There
 * are exactly cq_entries slots, so ops in flight plus completions not yet handed to the caller
 * never exceed the CQ: the broker never finds the CQ full because of us, and nothing we were
 * promised is ever dropped. Async ops may take all but one slot, so a synchronous call always
 * finds one free once any deferred RELEASE (a DISCARD slot) has completed.
 *
 * Demultiplexing. Whoever drains the CQ completes every CQE it finds: SYNC slots are marked done
 * for the call waiting on them, DISCARD slots are freed, ASYNC slots are appended to the done
 * queue, which kvb_reap() hands out in completion order. So a synchronous call that runs while
 * async ops are in flight stashes their completions, and kvb_reap() returns them later.
 *
 * Waiting (proto/ring.h, [W1]). A waiter spins on the CQ tail for spin_ns (30 us by default,
 * KVB_CLIENT_SPIN_US overrides), because a sleeping wake-up costs ~10 us on these machines
 * against ~0.5 us for a polled round trip, plus the time the broker's copy of the page takes
 * at SPIN_COPY_BPS when the op is a GET or PUT the broker copies (expect_bytes): a 30 us spin
 * ran out inside every 1 MiB copy, and each page paid a sleep and a wake-up. While the broker
 * polls on our own CPU (the spinning hints of wire.h) the spin yields at once and then every
 * SPIN_YIELD_NS, so that the broker runs instead of waiting for our time slice to end (the
 * broker notes its CPU every loop round, so the hint is at most a round old); it never yields
 * otherwise, because on a loaded machine a yield gives the CPU away to other tasks for a
 * slice (t_fairness). Then it sets KVB_CQ_NEED_WAKEUP, re-checks the tail
 * and poll()s the cq eventfd and the control socket together, so a broker that dies while we
 * sleep is seen as a hang-up (-ECONNRESET) rather than an endless wait. The flag is ours (the
 * client owns the cq flags word) and is cleared when the last sleeper wakes, so that a polling
 * client does not make the broker write the eventfd for every CQE. Synchronous calls sleep with
 * the lock held; kvb_reap() sleeps without it (internal.h), and whoever drains CQEs that a
 * sleeping reaper waits for writes the cq eventfd itself to wake it.
 *
 * The completion fd [CFD] (kvb_completion_fd) is an epoll instance over two eventfds: the cq
 * doorbell, which the broker writes after posting while KVB_CQ_NEED_WAKEUP is set, and a note
 * eventfd of our own, kept non-zero exactly while the done queue holds completions. Once it
 * exists the flag stays set for good, so every batch the broker posts makes the doorbell
 * readable; whoever takes CQEs off the ring puts async ones in the done queue and sets the
 * note. So at every moment one of the two is readable while a completion waits: it is either
 * still in the CQ (doorbell rung after it was published, [W1]) or in the done queue (note set),
 * and a thread that reads the doorbell's counter (cq_sleep) always drains the CQ after that
 * read, before it gives up the lock. kvb_reap() re-arms: when it leaves the done queue empty it
 * clears the note, reads the doorbell and drains the CQ once more, so the fd stops polling
 * readable only when nothing is left and the next CQE rings the doorbell again.
 *
 * Posting. SQEs are written into the slots past our private tail and published with one
 * store-release of the tail per batch [R1]; the sq eventfd is written only when the broker has
 * set KVB_SQ_NEED_WAKEUP [W1]. When the SQ is full we drain the CQ (the broker frees SQ slots
 * as it consumes them and every consumed SQE ends in a CQE) and try again.
 *
 * All functions here run with the client lock held; cq_sleep() drops it around its poll() when
 * kvb_reap() asks it to, and touches nothing of the client while it does not hold it.
 */
#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* The broker's copy rate a spin allows for (bytes per ns: 2 GB/s), and the most it adds. */
#define SPIN_COPY_BPS_PER_NS 2
#define SPIN_COPY_MAX_NS 5000000ull
#define SPIN_YIELD_NS 2000

static int set_fatal(struct kvb_client *c, int err)
{
	if (!c->fatal) {
		c->fatal = err;
		kvbc_pool_revoke(c);
		/* [RECONNECT] no CQE will come for what is in flight: it fails now. */
		kvbc_fail_inflight(c, err);
		pthread_cond_broadcast(&c->reaped); /* waiting reapers must see it */
	}
	return c->fatal;
}

int kvbc_lost(struct kvb_client *c, int err)
{
	return set_fatal(c, err);
}

static kvb_atomic_u32 *region_word(struct kvb_client *c, uint32_t off)
{
	return (kvb_atomic_u32 *)(void *)((char *)c->region + off);
}

int kvbc_ring_setup(struct kvb_client *c)
{
	const struct kvb_region_hdr *h = &c->hdr;

	kvb_ring_init(&c->sq, region_word(c, h->sq_head_off), region_word(c, h->sq_tail_off),
		      region_word(c, h->sq_flags_off), (char *)c->region + h->sqes_off,
		      h->sq_entries, sizeof(struct kvb_sqe), 1);
	kvb_ring_init(&c->cq, region_word(c, h->cq_head_off), region_word(c, h->cq_tail_off),
		      region_word(c, h->cq_flags_off), (char *)c->region + h->cqes_off,
		      h->cq_entries, sizeof(struct kvb_cqe), 0);
	if (kvb_ring_space(&c->sq) < 0 || kvb_ring_avail(&c->cq) < 0)
		return -EPROTO;
	memset(&c->notes, 0, sizeof(c->notes));
	if (h->features & KVB_FEAT_NOTES) { /* kvb_region_check() placed it inside the region */
		char *nr = (char *)c->region + kvb_region_notes_off(h);

		kvb_ring_init(&c->notes, (kvb_atomic_u32 *)(void *)(nr + KVB_NOTES_HEAD),
			      (kvb_atomic_u32 *)(void *)(nr + KVB_NOTES_TAIL), NULL,
			      nr + KVB_NOTES_SQES, KVB_NOTES_ENTRIES, sizeof(struct kvb_sqe), 1);
		if (kvb_ring_space(&c->notes) < 0)
			return -EPROTO;
		c->notes_bell = c->notes.cached - 1; /* [note-early] not rung at this head */
	}
	/* [hazard] A fresh region: no lease of ours is in its table. */
	c->hz = NULL;
	c->hz_count = NULL;
	c->hz_used = c->hz_n = 0;
	if ((h->features & KVB_FEAT_HAZARDS) && c->notes.entries) {
		char *hz = (char *)c->region + kvb_region_hz_off(h);

		c->hz_count = (kvb_atomic_u32 *)(void *)(hz + KVB_HZ_COUNT);
		c->hz = (kvb_atomic_u64 *)(void *)(hz + KVB_HZ_TABLE);
		c->hz_budget = (const kvb_atomic_u64 *)(const void *)((char *)c->region +
								      kvb_region_notes_off(h) +
								      KVB_HZ_BUDGET);
		c->hz_max = region_word(c, kvb_region_notes_off(h) + KVB_HZ_MAX);
	}
	c->hz_held = 0;
	c->broker_cpu = region_word(c, h->sq_head_off + 8u); /* KVB_REGION_BROKER_CPU */
	c->spin_cpu = region_word(c, h->cq_head_off + 8u);   /* KVB_REGION_CLIENT_CPU */
	/* KVB_REGION_FILL and _FILL_STOP: a fresh region, so filled PUTs are numbered anew. */
	c->fill = region_word(c, h->cq_head_off + 16u);
	c->fill_stop = region_word(c, h->sq_head_off + 16u);
	c->fill_seq = 0;
	c->arg = (uint8_t *)c->region + h->arg_off;
	c->arg_size = h->arg_size;

	c->nslots = h->cq_entries; /* a power of two: the done queue masks with it */
	c->slots = calloc(c->nslots, sizeof(*c->slots));
	c->free_list = malloc(c->nslots * sizeof(*c->free_list));
	c->doneq = malloc(c->nslots * sizeof(*c->doneq));
	if (!c->slots || !c->free_list || !c->doneq)
		return -ENOMEM; /* kvbc_ring_teardown() frees what was allocated */
	for (uint32_t i = 0; i < c->nslots; i++)
		c->free_list[i] = c->nslots - 1 - i;
	c->nfree = c->nslots;
	return 0;
}

void kvbc_ring_teardown(struct kvb_client *c)
{
	if (c->cfd_on) {
		close(c->cfd);
		close(c->note_efd);
		c->cfd_on = 0;
	}
	free(c->slots);
	free(c->free_list);
	free(c->doneq);
	c->slots = NULL;
	c->free_list = NULL;
	c->doneq = NULL;
	c->nslots = c->nfree = 0;
}

/* ---- slots ---- */

static uint32_t slot_get(struct kvb_client *c, uint8_t kind, uint8_t opcode, uint32_t ns)
{
	uint32_t idx = c->free_list[--c->nfree];
	struct kvbc_slot *s = &c->slots[idx];

	s->gen++;
	s->kind = kind;
	s->opcode = opcode;
	s->ns = ns;
	s->done = 0;
	if (kind == KVBC_SLOT_ASYNC)
		c->nasync++;
	return idx;
}

static void slot_put(struct kvb_client *c, uint32_t idx)
{
	struct kvbc_slot *s = &c->slots[idx];

	if (s->kind == KVBC_SLOT_ASYNC)
		c->nasync--;
	s->kind = KVBC_SLOT_FREE;
	c->free_list[c->nfree++] = idx;
}

static uint64_t slot_token(const struct kvb_client *c, uint32_t idx)
{
	return (uint64_t)c->slots[idx].gen << 32 | idx;
}

/*
 * Completions were just queued for kvb_reap(). Reapers on the condition variable are told
 * directly; the one asleep in poll() waits for the broker's doorbell, which already rang for
 * CQEs we drained (and perhaps ate) or never rings for one we completed ourselves ([vdir]), so
 * it is kicked when we leave; a completion fd's poller sees note_efd.
 */
static void done_queued(struct kvb_client *c)
{
	pthread_cond_broadcast(&c->reaped);
	c->kick_poller |= c->poller;
	if (c->cfd_on && !c->note_set) {
		uint64_t one = 1;

		/* [CFD]: the done queue is not empty. A full counter is still non-zero. */
		(void)!write(c->note_efd, &one, sizeof(one));
		c->note_set = 1;
	}
}

/* [vdir] An async DELETE or PUT is done: directory reads may answer for the pages again. */
static void mut_done(struct kvb_client *c, const struct kvbc_slot *s)
{
	if (s->opcode == KVB_OP_DELETE || s->opcode == KVB_OP_PUT) {
		assert(c->nmut_async > 0);
		c->nmut_async--;
	}
}

void kvbc_fail_inflight(struct kvb_client *c, int err)
{
	int queued = 0;

	for (uint32_t i = 0; i < c->nslots; i++) {
		struct kvbc_slot *s = &c->slots[i];

		if (s->kind == KVBC_SLOT_DISCARD) {
			slot_put(c, i);
		} else if (s->kind == KVBC_SLOT_ASYNC && !s->done) {
			memset(&s->cqe, 0, sizeof(s->cqe));
			s->cqe.res = err;
			s->done = 1;
			mut_done(c, s);
			/*
			 * A RELEASE that fails leaves the lease the caller's: noted again, so that
			 * a reconnect keeps its id (conn.c old_ids_keep) and a RELEASE sent again
			 * is answered here.
			 */
			if (s->opcode == KVB_OP_RELEASE)
				kvbc_lease_note(c, s->lease, s->lease_data, s->lease_len);
			c->doneq[c->doneq_tail++ & (c->nslots - 1)] = i;
			queued = 1;
		}
	}
	if (queued)
		done_queued(c);
}

/* ---- completions ---- */

/* Completes one CQE; returns 1 when it queued an async completion for kvb_reap(). */
static int complete(struct kvb_client *c, const struct kvb_cqe *cqe)
{
	uint32_t idx = (uint32_t)cqe->user_data;
	struct kvbc_slot *s;

	if (idx >= c->nslots)
		goto bogus;
	s = &c->slots[idx];
	if (s->kind == KVBC_SLOT_FREE || s->done || s->gen != (uint32_t)(cqe->user_data >> 32))
		goto bogus;
	s->cqe = *cqe;
	switch (s->kind) {
	case KVBC_SLOT_DISCARD:
		slot_put(c, idx);
		return 0;
	case KVBC_SLOT_ASYNC:
		/* At most nslots ASYNC slots exist, so the queue cannot overflow. */
		c->doneq[c->doneq_tail++ & (c->nslots - 1)] = idx;
		s->done = 1;
		mut_done(c, s);
		return 1;
	default:
		s->done = 1;
		return 0;
	}
bogus:
	/* Not ours (a broker bug): nothing waits on it, so count it and carry on. */
	c->bogus_cqes++;
	return 0;
}

/* Wakes reapers sleeping in kvb_reap(): the cq eventfd is ours to write as well. */
static void wake_sleepers(struct kvb_client *c)
{
	uint64_t one = 1;

	(void)!write(c->cq_efd, &one, sizeof(one));
}

/* Completes every CQE present. Returns how many, or a fatal -EPROTO for an impossible tail. */
static int cq_drain(struct kvb_client *c)
{
	int64_t avail = kvb_ring_avail(&c->cq); /* [R1] acquire: the entries are readable */
	struct kvb_cqe cqe;
	int queued = 0;

	if (avail < 0)
		return set_fatal(c, -EPROTO);
	for (uint32_t i = 0; i < (uint32_t)avail; i++) {
		/* Copy out once: the slot is shared memory and is reused after consume. */
		memcpy(&cqe, kvb_ring_cons_slot(&c->cq, i), sizeof(cqe));
		queued |= complete(c, &cqe);
	}
	if (avail) {
		/* [R2] release: the slots go back to the broker only after our reads. */
		kvb_ring_consume(&c->cq, (uint32_t)avail);
		c->broker_waking = 0;
	}
	if (queued)
		done_queued(c);
	return (int)avail;
}

/*
 * The control socket became readable or hung up while we slept. A reply to another thread's
 * control call is read by that thread under the lock, so by the time we hold the lock what is
 * left is EOF, a stray datagram, or nothing at all.
 */
static int check_socket(struct kvb_client *c, short revents)
{
	char b;
	ssize_t n;

	if (revents & (POLLHUP | POLLERR | POLLNVAL))
		return set_fatal(c, -ECONNRESET);
	n = recv(c->sock, &b, 1, MSG_PEEK | MSG_DONTWAIT);
	if (n == 0 || (n < 0 && errno == ECONNRESET))
		return set_fatal(c, -ECONNRESET);
	if (n > 0)
		(void)recv(c->sock, &b, 1, MSG_DONTWAIT); /* drop it; the kernel closes its fds */
	return 0;
}

/* Reads the cq eventfd's counter if it is set, so that the next poll() sleeps. */
static void efd_drain(struct kvb_client *c)
{
	struct pollfd p = {.fd = c->cq_efd, .events = POLLIN};
	uint64_t v;

	/* Another waiter may have read it since our poll() returned: read only what is there. */
	if (poll(&p, 1, 0) == 1 && (p.revents & POLLIN))
		(void)!read(c->cq_efd, &v, sizeof(v));
}

static int cq_nonempty(const struct kvb_client *c)
{
	return kvb_load_acquire(c->cq.tail) != c->cq.local;
}

/*
 * Spins on the CQ tail for spin_ns (or to the deadline); 1 when a CQE arrived. Not at all while
 * the broker is waking up from our doorbell: that takes 10 us or more, and on a machine with
 * two or four CPUs our spinning would take the very CPU the broker needs to wake on (measured:
 * 25 us per op straight to sleep, 80-1000 us spinning 30 us, on a loaded 2-vCPU machine).
 */
static int cq_spin_on(const struct kvb_client *c, uint64_t deadline)
{
	uint64_t now = clock_ns(), copy = c->expect_bytes / SPIN_COPY_BPS_PER_NS;
	uint64_t spin_end = now + c->spin_ns + (copy < SPIN_COPY_MAX_NS ? copy : SPIN_COPY_MAX_NS);
	uint64_t next_check = now + SPIN_YIELD_NS;
	uint32_t cpu = (uint32_t)sched_getcpu() + 1u;

	if (deadline && spin_end > deadline)
		spin_end = deadline;
	kvb_store_relaxed(c->spin_cpu, cpu);
	/*
	 * The broker's loop last ran a round on our CPU: while we run it does not, so our op
	 * waits for us to leave. Yield at once rather than after a first spin (10 us before:
	 * each 64 KiB GET of a client and broker sharing a CPU paid it, 3 GB/s against 5-5.7).
	 */
	if (kvb_load_relaxed(c->broker_cpu) == cpu && !cq_nonempty(c))
		sched_yield();
	for (uint32_t i = 1;; i++) {
		if (cq_nonempty(c))
			return 1;
		kvb_cpu_relax();
		/* Reading the clock costs ~20 ns: every 16th turn keeps the loop tight. */
		if (i & 15)
			continue;
		now = clock_ns();
		if (now >= spin_end)
			return 0;
		if (now < next_check)
			continue;
		/* The broker polls on our CPU: let it run (wire.h, spinning hints). */
		if (kvb_load_relaxed(c->broker_cpu) == cpu)
			sched_yield();
		cpu = (uint32_t)sched_getcpu() + 1u;
		kvb_store_relaxed(c->spin_cpu, cpu);
		next_check = clock_ns() + SPIN_YIELD_NS;
	}
}

static int cq_spin(const struct kvb_client *c, uint64_t deadline)
{
	int r;

	if (c->broker_waking)
		return cq_nonempty(c);
	r = cq_spin_on(c, deadline);
	kvb_store_relaxed(c->spin_cpu, 0);
	return r;
}

/*
 * One sleep on the cq doorbell and the control socket ([W1] of proto/ring.h). With unlock set
 * the client lock is dropped for the poll() itself (kvb_reap(): a thread waiting for its
 * completions must not stall the other threads' calls); synchronous calls keep it. The flag is
 * cleared only when the last sleeper wakes, so a reaper asleep without the lock keeps receiving
 * doorbells while another thread's call comes and goes. Returns 0 (go and drain), -ETIMEDOUT,
 * or the fatal error when the broker is gone.
 */
static int cq_sleep(struct kvb_client *c, uint64_t deadline, int unlock)
{
	struct pollfd pfd[2] = {
		{.fd = c->cq_efd, .events = POLLIN},
		{.fd = c->sock, .events = POLLIN},
	};
	int timeout = -1, rc, err = 0;

	if (deadline) {
		uint64_t now = clock_ns();

		if (now >= deadline)
			return -ETIMEDOUT;
		timeout = (int)((deadline - now + 999999) / 1000000);
	}
	/*
	 * The sleep half of [W1], spelled out rather than kvb_ring_prepare_sleep(): when a CQE
	 * already landed we must not clear the flag while another thread sleeps on it (it would
	 * miss the broker's doorbell for every later CQE).
	 */
	kvb_flag_set(c->cq.flags, KVB_CQ_NEED_WAKEUP);
	kvb_fence_full();
	if (kvb_load_acquire(c->cq.tail) != c->cq.local) {
		if (!c->sleepers && !c->cfd_on)
			kvb_flag_clear(c->cq.flags, KVB_CQ_NEED_WAKEUP);
		return 0;
	}
	c->sleepers++;
	if (unlock)
		pthread_mutex_unlock(&c->lock);
	/*
	 * A failed poll (EINTR, a transient ENOMEM) is a spurious wake-up: every caller re-checks
	 * the CQ and its deadline, and giving up here would abandon an op still in flight.
	 */
	rc = poll(pfd, 2, timeout);
	if (unlock)
		pthread_mutex_lock(&c->lock);
	if (--c->sleepers == 0 && !c->cfd_on)
		kvb_flag_clear(c->cq.flags, KVB_CQ_NEED_WAKEUP); /* [CFD] keeps it set */
	if (c->fatal)
		return c->fatal; /* perhaps found by another thread while we slept */
	if (rc > 0 && pfd[1].revents) {
		err = check_socket(c, pfd[1].revents);
		if (err)
			return err;
	}
	if (rc > 0 && (pfd[0].revents & POLLIN)) {
		efd_drain(c);
		/*
		 * A synchronous waiter (it sleeps holding the lock) shares the doorbell with the
		 * poller and may just have eaten the poller's wake-up: ring it again once we
		 * leave, when the poller can take the lock.
		 */
		c->kick_poller |= !unlock && c->poller;
	}
	return 0;
}

/* Waits, lock held, until the CQ may hold entries: spin, then sleep. No deadline. */
static int cq_wait(struct kvb_client *c)
{
	if (cq_spin(c, 0))
		return 0;
	for (;;) {
		int err = cq_sleep(c, 0, 0);

		if (err)
			return err;
		if (cq_nonempty(c))
			return 0;
	}
}

/* Drains, or waits when there was nothing to drain: one step of every synchronous wait. */
static int cq_step(struct kvb_client *c)
{
	int n = cq_drain(c);

	if (n < 0)
		return n;
	return n ? 0 : cq_wait(c);
}

/* ---- submission ---- */

/* Wakes a broker asleep [W1] (checked after the publish); 1 when it rang. */
static int sq_ring_bell(struct kvb_client *c)
{
	uint64_t one = 1;
	ssize_t n;

	if (!kvb_ring_needs_wakeup(&c->sq, KVB_SQ_NEED_WAKEUP))
		return 0;
	do
		n = write(c->sq_efd, &one, sizeof(one));
	while (n < 0 && errno == EINTR);
	/* EAGAIN means the counter is saturated: the broker has a wake-up pending anyway. */
	return 1;
}

static void sq_doorbell(struct kvb_client *c)
{
	if (sq_ring_bell(c))
		c->broker_waking = 1;
}

/* Waits for a free slot and a free SQ entry (draining completions meanwhile). */
static int reserve_one(struct kvb_client *c)
{
	for (;;) {
		/* [R2] acquire of the broker's head, when the one seen last shows the SQ full. */
		int64_t space = kvb_ring_space_min(&c->sq, 1);
		int err;

		if (space < 0)
			return set_fatal(c, -EPROTO);
		if (space > 0 && c->nfree > 0)
			return 0;
		sq_doorbell(c); /* [dir-note] posted SQEs must not wait for a broker asleep */
		err = cq_step(c);
		if (err)
			return err;
	}
}

uint32_t kvbc_lookup_room(const struct kvb_client *c)
{
	uint64_t cells = (uint64_t)c->nslots * sizeof(kvb_key);

	/* [parent-cells] Only when that leaves LOOKUP at least half of the area. */
	if (c->broker_minor < 4 || (uint64_t)c->arg_size < 2 * cells)
		return c->arg_size;
	return (uint32_t)(c->arg_size - cells);
}

/*
 * [parent-cells] A PUT's parent key (ABI 1.4, wire.h KVB_OPF_PARENT) goes in its slot's own
 * 32 bytes at the top of the arg area: the slot is ours until its CQE, and the broker reads
 * the key when it takes the SQE, so no two ops in flight ever share a cell and LOOKUP (below
 * kvbc_lookup_room) never touches one. Without room, or with an older broker, the PUT goes
 * plain: the parent is a hint for eviction, never needed for correctness.
 */
static void sqe_parent(struct kvb_client *c, struct kvb_sqe *sqe, uint32_t idx,
		       const kvb_key *parent)
{
	uint32_t room = kvbc_lookup_room(c);

	/* parent_off overlays the layer fields: left alone unless this PUT names a parent. */
	sqe->flags &= (uint8_t)~KVB_OPF_PARENT;
	if (!parent || sqe->opcode != KVB_OP_PUT || room == c->arg_size)
		return;
	sqe->parent_off = room + idx * (uint32_t)sizeof(kvb_key);
	memcpy(c->arg + sqe->parent_off, parent->b, sizeof(parent->b));
	sqe->flags |= KVB_OPF_PARENT;
}

static uint32_t post_one(struct kvb_client *c, struct kvb_sqe *sqe, uint8_t kind,
			 const kvb_key *parent)
{
	uint32_t idx = slot_get(c, kind, sqe->opcode, sqe->ns);

	kvbc_sqe_ids(c, sqe); /* the slot keeps the caller's namespace id */
	sqe_parent(c, sqe, idx, parent);
	sqe->user_data = slot_token(c, idx);
	memcpy(kvb_ring_prod_slot(&c->sq, 0), sqe, sizeof(*sqe));
	kvb_ring_publish(&c->sq, 1); /* [R1] release: the SQE is visible before the tail */
	return idx;
}

/*
 * Runs one SQE to completion. Returns 0 with the CQE in *cqe (whose res may be negative), or a
 * transport error (-ECONNRESET, -EPROTO) when no CQE will ever come.
 */
int kvbc_sync_parent_locked(struct kvb_client *c, struct kvb_sqe *sqe, const kvb_key *parent,
			    struct kvb_cqe *cqe)
{
	int idx = kvbc_post_sync_locked(c, sqe, parent);

	if (idx < 0)
		return idx;
	return kvbc_wait_sync_locked(c, (uint32_t)idx, cqe);
}

int kvbc_post_sync_locked(struct kvb_client *c, struct kvb_sqe *sqe, const kvb_key *parent)
{
	int err = reserve_one(c);

	uint32_t idx;

	if (err)
		return err;
	idx = post_one(c, sqe, KVBC_SLOT_SYNC, parent);
	sq_doorbell(c);
	return (int)idx;
}

void kvbc_fill_publish_locked(struct kvb_client *c, uint32_t bytes)
{
	kvb_store_release(c->fill, bytes); /* [F1] release: the bytes before the word */
	sq_doorbell(c);			   /* [W1]: a broker asleep waits for them too */
}

int kvbc_sync_done_locked(struct kvb_client *c, uint32_t idx)
{
	if (!c->slots[idx].done && cq_nonempty(c))
		(void)cq_drain(c); /* a fatal error shows at the wait */
	return c->slots[idx].done;
}

int kvbc_wait_sync_locked(struct kvb_client *c, uint32_t idx, struct kvb_cqe *cqe)
{
	int err = 0;

	while (!c->slots[idx].done) {
		err = cq_step(c);
		if (err)
			break;
	}
	if (!err)
		*cqe = c->slots[idx].cqe;
	slot_put(c, idx);
	return err;
}

int kvbc_sync_locked(struct kvb_client *c, struct kvb_sqe *sqe, struct kvb_cqe *cqe)
{
	return kvbc_sync_parent_locked(c, sqe, NULL, cqe);
}

int kvbc_wait_discards_locked(struct kvb_client *c, uint32_t timeout_ms)
{
	uint64_t deadline = clock_ns() + (uint64_t)timeout_ms * 1000000ull;

	if (c->region)
		sq_doorbell(c); /* [dir-note] what was posted without one */
	for (;;) {
		uint32_t i = 0;
		int n, err;

		while (i < c->nslots && c->slots[i].kind != KVBC_SLOT_DISCARD)
			i++;
		if (i == c->nslots)
			return 0;
		n = cq_drain(c);
		if (n < 0)
			return n;
		if (n || cq_spin(c, deadline))
			continue;
		err = cq_sleep(c, deadline, 0);
		/* A broker that stopped answering: the request itself times out the same way. */
		if (err == -ETIMEDOUT)
			return 0;
		if (err)
			return err;
	}
}

/*
 * [dir-note] A read through the pool directory told to the broker (ops.c dir_get), or a RELEASE
 * nobody waits for ([release-post]), on the SQ (a broker without a note ring, or a full one):
 * posted with no doorbell. Checking for one is a full fence
 * and a load of the broker's flag line, and ringing one a syscall, on every 64 KiB read; a
 * broker asleep need not hear of either at once. It finds the SQE in the round it runs before it
 * answers any control request ([rings-first]: every STATS counts the read, sees the page
 * unpinned), before it sleeps (ring.h [W1]), at its next doorbell (ours run in ring order
 * after it), and at the latest after its one-second nap. Whatever waits for the broker rings
 * first (reserve_one, kvbc_wait_discards_locked).
 */
static int post_note_locked(struct kvb_client *c, struct kvb_sqe *sqe)
{
	int err = reserve_one(c);

	if (err)
		return err;
	post_one(c, sqe, KVBC_SLOT_DISCARD, NULL);
	return 0;
}

/*
 * [notes] A directory read or a held lease's RELEASE told through the note ring (wire.h
 * KVB_FEAT_NOTES): an SQE and a tail store into lines that stay in our cache between the
 * broker's drains, no CQE. A full ring means a broker asleep, or busy between two of its ticks:
 * the note goes on the SQ, with the doorbell, which wakes it to drain both.
 *
 * [note-early] A broker asleep is woken when the ring is three quarters full, not full: its
 * wake-up takes 10-50 us, and a client streaming 64 KiB reads found the ring still full on
 * each of its next 5-10 reads, each an SQE and a write(2) on the doorbell (one in 35-46 reads,
 * 1.4% of its time in the syscall, Intel Xeon model 207 VM). The quarter left holds what comes
 * while it wakes. No CQE follows that doorbell, so it does not stop our spinning
 * (broker_waking). The head is read afresh first, lest a stale one wake a broker that drained,
 * and once per head: a broker awake drains before it sleeps, one woken is draining.
 */
int kvbc_note_locked(struct kvb_client *c, struct kvb_sqe *sqe)
{
	int64_t room;
	int err;

	if (!c->notes.entries)
		return post_note_locked(c, sqe);
	room = kvb_ring_space_min(&c->notes, 1);
	if (room < 0)
		return set_fatal(c, -EPROTO);
	if (room > 0) {
		struct kvb_sqe *e = kvb_ring_prod_slot(&c->notes, 0);
		int64_t early = kvb_ring_entries(&c->notes) / 4, fresh;

		memcpy(e, sqe, sizeof(*sqe));
		kvbc_sqe_ids(c, e); /* the current broker's ids, as post_one() gives the SQ's */
		kvb_ring_publish(&c->notes, 1);
		if (room - 1 <= early && (fresh = kvb_ring_space(&c->notes)) >= 0 &&
		    fresh <= early && c->notes.cached != c->notes_bell) {
			c->notes_bell = c->notes.cached;
			(void)sq_ring_bell(c);
		}
		return 0;
	}
	err = post_note_locked(c, sqe);
	if (!err)
		sq_doorbell(c);
	return err;
}

int kvbc_lease_map(const struct kvb_client *c, uint64_t loc, uint64_t len, const void **data)
{
	uint32_t arena = KVB_LOC_ARENA(loc);
	uint64_t off = KVB_LOC_OFF(loc);
	const struct kvbc_arena *a;

	if (arena >= c->narenas)
		return -EPROTO;
	a = &c->arenas[arena];
	if (off > a->size || len > a->size - off)
		return -EPROTO;
	*data = (const char *)a->map + off;
	return 0;
}

static int op_to_sqe(const struct kvb_client *c, const struct kvb_op *op, const kvb_key *parent,
		     struct kvb_sqe *sqe)
{
	if (op->opcode >= KVB_OP__COUNT || op->opcode == KVB_OP_LOOKUP)
		return -EINVAL; /* LOOKUP needs the argument area: kvb_lookup() only */
	if (op->flags & ~(KVB_OPF_VIEW | KVB_OPF_PARENT | KVB_OPF_ASYNC) || op->resv)
		return -EINVAL;
	/* A parent is a PUT's, and needs its key (kvb_submit_parents()). */
	if ((op->flags & KVB_OPF_PARENT) && (op->opcode != KVB_OP_PUT || !parent))
		return -EINVAL;
	memset(sqe, 0, sizeof(*sqe));
	sqe->opcode = (uint8_t)op->opcode;
	/* KVB_OPF_PARENT is set by sqe_parent(); KVB_OPF_ASYNC is the library's alone. */
	sqe->flags = (uint8_t)(op->flags & KVB_OPF_VIEW);
	sqe->ns = op->ns;
	memcpy(sqe->key, op->key.b, sizeof(sqe->key));
	sqe->buf = op->buf;
	sqe->layer_first = op->layer_first;
	sqe->layer_count = op->layer_count;
	sqe->off = op->off;
	/* The broker runs the same check; doing it here gives -EINVAL before anything is queued. */
	return kvb_sqe_check(sqe, c->arg_size);
}

int kvb_submit(kvb_client *c, const struct kvb_op *ops, size_t n)
{
	return kvb_submit_parents(c, ops, NULL, n);
}

/* An op of kvb_submit() answered here, without the broker: its completion is queued now. */
static void complete_local(struct kvb_client *c, uint32_t idx, int32_t res)
{
	struct kvbc_slot *s = &c->slots[idx];

	memset(&s->cqe, 0, sizeof(s->cqe));
	s->cqe.res = res;
	s->done = 1;
	c->doneq[c->doneq_tail++ & (c->nslots - 1)] = idx;
}

/*
 * [vdir] A view GET of this batch served from the pool map by our own copy (vread.c): 1 with
 * its completion queued in slot idx. Not after a DELETE or PUT earlier in the batch (in flight
 * from an earlier one, vread.c checks): the broker runs SQEs in order, and a DELETE must make
 * the GET miss, a PUT must have read its source before the GET writes what may be the same
 * slots. Only with room in the note ring for the read's note: on the SQ it would take a slot
 * and a ring entry this batch counted on. What the batch posted before it goes first, so the
 * broker works on it while we copy. Not with KVB_OPF_ASYNC: the caller wants the copy off its
 * thread.
 */
static int submit_local(struct kvb_client *c, const struct kvb_op *op, uint32_t idx, int mut_seen,
			uint32_t *posted)
{
	struct kvbc_vread vr;
	int res;

	if (op->opcode != KVB_OP_GET ||
	    (op->flags & (KVB_OPF_VIEW | KVB_OPF_ASYNC)) != KVB_OPF_VIEW || mut_seen ||
	    !c->notes.entries || kvb_ring_space_min(&c->notes, 1) <= 0 ||
	    !kvbc_view_dir_find(c, op->buf, &op->key, op->off, op->layer_first, op->layer_count,
				&vr))
		return 0;
	if (*posted) {
		kvb_ring_publish(&c->sq, *posted); /* [R1] */
		sq_doorbell(c);
		*posted = 0;
	}
	res = kvbc_view_dir_copy(c, &op->key, &vr);
	if (res <= 0)
		return 0;
	complete_local(c, idx, res);
	return 1;
}

int kvb_submit_parents(kvb_client *c, const struct kvb_op *ops, const kvb_key *parents, size_t n)
{
	struct kvb_sqe sqe;
	uint32_t posted = 0, local = 0;
	int64_t space;
	int mut_seen = 0;
	size_t m;
	int err;

	if (n && !ops)
		return -EINVAL;
	err = kvbc_enter_live(c);
	if (err)
		return err;
	/* Validate everything first: a batch is queued whole up to the room, or not at all. */
	for (size_t i = 0; i < n; i++) {
		err = op_to_sqe(c, &ops[i], parents ? &parents[i] : NULL, &sqe);
		if (err)
			goto out;
	}
	space = kvb_ring_space(&c->sq);
	if (space < 0) {
		err = set_fatal(c, -EPROTO);
		goto out;
	}
	m = n < (size_t)space ? n : (size_t)space;
	/* All slots but one may be async; the last is kept for synchronous calls. */
	if (m > c->nslots - 1 - c->nasync)
		m = c->nslots - 1 - c->nasync;
	if (m > c->nfree)
		m = c->nfree;
	for (size_t i = 0; i < m; i++) {
		uint64_t lease, llen = 0;
		const void *ldata = NULL;
		uint32_t idx;
		int old = 0, here = 0;

		op_to_sqe(c, &ops[i], parents ? &parents[i] : NULL, &sqe);
		lease = sqe.off;
		/*
		 * [RECONNECT] An old broker's lease is released here, in a NOP's slot: deliver()
		 * counts nothing more for it. [hazard] A lease of our table is released here too,
		 * and its CQE would say 0: answered here where the note ring has room for the
		 * broker's word of it ([told]: on the SQ it would wake a sleeping broker for
		 * nothing), else sent on.
		 */
		if (sqe.opcode == KVB_OP_RELEASE && kvbc_hz_release(c, sqe.off)) {
			sqe.flags = KVB_SQEF_HELD;
			here = c->notes.entries && kvb_ring_space_min(&c->notes, 1) > 0 &&
			       !kvbc_note_locked(c, &sqe);
		} else if (sqe.opcode == KVB_OP_RELEASE && (old = kvbc_old_release(c, sqe.off)))
			sqe.opcode = KVB_OP_NOP;
		else if (sqe.opcode == KVB_OP_RELEASE) {
			kvbc_lease_forget(c, lease, &ldata, &llen); /* [release-post] */
			sqe.off = kvbc_lease_wire(c, lease);	    /* [lease-alias] */
		}
		idx = slot_get(c, KVBC_SLOT_ASYNC, sqe.opcode, sqe.ns);
		c->slots[idx].user_data = ops[i].user_data;
		c->slots[idx].lease = lease; /* the caller's id: noted again if the RELEASE fails */
		c->slots[idx].lease_data = ldata;
		c->slots[idx].lease_len = llen;
		if (old || here) {
			complete_local(c, idx, 0);
			local++;
			continue;
		}
		if (submit_local(c, &ops[i], idx, mut_seen, &posted)) {
			local++;
			continue;
		}
		if (sqe.opcode == KVB_OP_DELETE || sqe.opcode == KVB_OP_PUT) {
			mut_seen = 1;
			c->nmut_async++;
		}
		kvbc_sqe_ids(c, &sqe);
		sqe_parent(c, &sqe, idx,
			   (ops[i].flags & KVB_OPF_PARENT) && parents ? &parents[i] : NULL);
		sqe.user_data = slot_token(c, idx);
		memcpy(kvb_ring_prod_slot(&c->sq, posted++), &sqe, sizeof(sqe));
	}
	if (posted) {
		kvb_ring_publish(&c->sq, posted); /* [R1] one release for the whole batch */
		sq_doorbell(c);
	}
	if (local)
		done_queued(c);
	err = (int)m;
out:
	kvbc_leave(c);
	return err;
}

static void deliver(struct kvb_client *c, uint32_t idx, struct kvb_completion *out)
{
	const struct kvbc_slot *s = &c->slots[idx];

	memset(out, 0, sizeof(*out));
	out->user_data = s->user_data;
	out->res = s->cqe.res;
	out->flags = s->cqe.flags;
	/* A lease released: the count a reconnect keeps the old broker's mappings by (conn.c). */
	if (s->opcode == KVB_OP_RELEASE && s->cqe.res >= 0) {
		kvbc_lease_unalias(c, s->lease); /* [lease-alias] */
		if (c->leases)
			c->leases--;
	}
	if (s->opcode == KVB_OP_ACQUIRE && s->cqe.res >= 0) {
		const struct kvbc_ns *ns = kvbc_ns_find(c, s->ns);
		uint64_t len = ns ? ns->page_bytes : 0;
		const void *data;

		if (kvbc_lease_map(c, s->cqe.loc, len, &data) == 0) {
			c->leases++;
			out->lease.id = kvbc_lease_issue(c, s->cqe.lease); /* [lease-alias] */
			kvbc_lease_note(c, out->lease.id, data, len);	   /* [release-post] */
			out->lease.data = data;
			out->lease.len = (size_t)len;
		} else {
			/* Outside our mapping: the lease is released when the client closes. */
			out->res = -EPROTO;
		}
	}
	slot_put(c, idx);
}

/*
 * One reaper at a time sleeps in poll() on the doorbell (the poller), without the lock; the
 * others wait on the condition variable, which every drain that queues completions and every
 * poller that wakes broadcasts. A shared eventfd cannot wake several sleepers reliably: the
 * first to wake drains the counter and the others sleep on.
 */
void kvbc_kick_poller(struct kvb_client *c)
{
	c->kick_poller = 0;
	if (c->poller)
		wake_sleepers(c);
}

static int reap_wait(struct kvb_client *c, uint64_t deadline)
{
	int err;

	if (!c->poller) {
		c->poller = 1;
		c->kick_poller = 0; /* that would be us */
		err = cq_sleep(c, deadline, 1);
		c->poller = 0;
		pthread_cond_broadcast(&c->reaped); /* someone else may poll now */
		return err;
	}
	if (c->kick_poller)
		kvbc_kick_poller(c);
	if (!deadline) {
		err = pthread_cond_wait(&c->reaped, &c->lock);
	} else {
		struct timespec ts = {.tv_sec = (time_t)(deadline / 1000000000ull),
				      .tv_nsec = (long)(deadline % 1000000000ull)};

		if (clock_ns() >= deadline)
			return -ETIMEDOUT;
		err = pthread_cond_timedwait(&c->reaped, &c->lock, &ts);
	}
	if (c->fatal)
		return c->fatal;
	return err && err != ETIMEDOUT ? -err : 0; /* the caller re-checks its deadline */
}

/*
 * [CFD] The done queue just became empty: clear the note, take the doorbell's counter, then
 * drain what the CQ holds, in that order: a CQE whose doorbell write we consumed was published
 * before that write, so this drain finds it (and sets the note again when it is async).
 */
static void cfd_rearm(struct kvb_client *c)
{
	uint64_t v;

	if (c->note_set) {
		(void)!read(c->note_efd, &v, sizeof(v));
		c->note_set = 0;
	}
	efd_drain(c);
	(void)cq_drain(c);
}

int kvb_completion_fd(kvb_client *c)
{
	struct epoll_event ev = {.events = EPOLLIN};
	int err, efd = -1, ep = -1;

	err = kvbc_enter(c);
	if (err)
		return err;
	if (c->cfd_on) {
		err = c->cfd;
		goto out;
	}
	efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ep = epoll_create1(EPOLL_CLOEXEC);
	if (efd < 0 || ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, c->cq_efd, &ev) < 0 ||
	    epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev) < 0) {
		err = kvbc_errno();
		if (efd >= 0)
			close(efd);
		if (ep >= 0)
			close(ep);
		goto out;
	}
	c->cfd = ep;
	c->note_efd = efd;
	c->note_set = 0;
	c->cfd_on = 1;
	/* [W1] as a sleeper: the flag, a full fence, then whatever was posted before it. */
	kvb_flag_set(c->cq.flags, KVB_CQ_NEED_WAKEUP);
	kvb_fence_full();
	err = cq_drain(c);
	if (err >= 0 && c->doneq_tail != c->doneq_head)
		done_queued(c);
	err = err < 0 ? err : c->cfd;
out:
	kvbc_leave(c);
	return err;
}

int kvb_reap(kvb_client *c, struct kvb_completion *out, size_t max, size_t min, int timeout_ms)
{
	uint64_t deadline = 0;
	uint32_t ready;
	int spun = 0, err;

	if ((max && !out) || min > max)
		return -EINVAL;
	if (!c)
		return -EINVAL;
	/*
	 * [RECONNECT] Ops that were in flight when the broker went are completed with
	 * -ECONNRESET: they are delivered before anything else, and the client reconnects only
	 * once they all were (kvbc_enter).
	 */
	pthread_mutex_lock(&c->lock);
	if (c->fatal == -ECONNRESET && c->doneq_tail != c->doneq_head) {
		ready = c->doneq_tail - c->doneq_head;
		if (ready > max)
			ready = (uint32_t)max;
		for (uint32_t i = 0; i < ready; i++)
			deliver(c, c->doneq[c->doneq_head++ & (c->nslots - 1)], &out[i]);
		if (c->doneq_tail == c->doneq_head && c->cfd_on && c->note_set) {
			uint64_t v;

			(void)!read(c->note_efd, &v, sizeof(v));
			c->note_set = 0;
		}
		pthread_mutex_unlock(&c->lock);
		return (int)ready;
	}
	pthread_mutex_unlock(&c->lock);
	err = kvbc_enter(c);
	if (err)
		return err;
	c->nreapers++; /* kvb_close() frees the client only once we left */
	if (timeout_ms >= 0)
		deadline = clock_ns() + (uint64_t)timeout_ms * 1000000ull;
	for (;;) {
		int n = cq_drain(c);

		if (n < 0) {
			err = n;
			goto out;
		}
		ready = c->doneq_tail - c->doneq_head;
		if (ready >= min)
			break;
		/*
		 * Completions already taken stay queued, so a timeout loses nothing. Spin once
		 * per call, with the lock: after a wake-up the CQEs were most likely another
		 * thread's, and spinning again would only stall that thread.
		 */
		if (!spun) {
			spun = 1;
			if (cq_spin(c, deadline))
				continue;
		}
		err = reap_wait(c, deadline);
		if (err)
			goto out;
	}
	if (ready > max)
		ready = (uint32_t)max;
	for (uint32_t i = 0; i < ready; i++)
		deliver(c, c->doneq[c->doneq_head++ & (c->nslots - 1)], &out[i]);
	/* Completions left behind may be what another reaper waits for. */
	if (c->doneq_tail != c->doneq_head)
		pthread_cond_broadcast(&c->reaped);
	else if (c->cfd_on)
		cfd_rearm(c);
	err = (int)ready;
out:
	/* Closed meanwhile: say so even with completions in hand, so the caller stops here. */
	if (c->fatal == -ESHUTDOWN)
		err = -ESHUTDOWN;
	if (--c->nreapers == 0 && c->fatal == -ESHUTDOWN)
		pthread_cond_broadcast(&c->reaped); /* kvb_close() waits for the last of us */
	kvbc_leave(c);
	return err;
}
