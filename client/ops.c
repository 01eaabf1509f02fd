// SPDX-License-Identifier: MIT
/*
 * ops.c - the synchronous page operations: namespaces, PUT, GET, LOOKUP, DELETE,
 * ACQUIRE/RELEASE, NOP and the page ops on views. Each builds one SQE (LOOKUP one per chunk of
 * keys) and runs it to completion through kvbc_sync_locked() under the client lock.
 *
 * Data paths (docs/protocol.md, "Client library"):
 *   - kvb_put(): src inside a buffer from kvb_buf_alloc_host() is copied by the broker straight
 *     into the pool; any other src is first copied into the library's staging buffer, a
 *     registered host buffer grown to the largest page put so far; from KVB_CLIENT_FILL_KB
 *     (64 KiB) up, to a broker of ABI 1.4, as a filled PUT: the PUT goes first and the copy
 *     into staging overlaps the broker's copy out of it (put_fill, wire.h KVB_SQEF_FILL).
 *   - kvb_get(): dst inside a registered host buffer is written by the broker; any other dst is
 *     filled by ACQUIRE, one memcpy from the read-only pool mapping, and a RELEASE that is posted
 *     without waiting for its completion (the broker runs SQEs in order, so the lease is gone
 *     before the next op of this client runs, and a GET costs one round trip instead of two).
 *   - kvb_lookup(): the keys go through the argument area of the ring region, in chunks sized so
 *     that keys and tier bytes of one chunk fit; the argument area is used only here, and only
 *     under the lock, so no two requests ever share it.
 *
 * The namespaces this client opened are remembered with their page size: every page op checks
 * its length against it before anything is queued, and lease.len comes from it.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fastcopy.h"
#include "internal.h"

const struct kvbc_ns *kvbc_ns_find(const struct kvb_client *c, uint32_t ns)
{
	/* A client opens one namespace per model it serves: a handful, so a scan beats a hash. */
	for (uint32_t i = 0; i < c->nns; i++)
		if (c->ns[i].id == ns)
			return &c->ns[i];
	return NULL;
}

/*
 * Whether kvb_get() of this namespace's pages into a buffer of ours copies them itself (ACQUIRE,
 * our copy, a deferred RELEASE) rather than leaving the copy to the broker's workers. Set,
 * KVB_CLIENT_GET_SELF_KB decides by page size. Unset, the fan-out rule (docs/benchmarks.md,
 * "MLA TP=8"): pages of 1 MiB or more of an MLA namespace shared by tp_size ranks, on a machine
 * with at least two CPUs per rank, because there the ranks' eight copies of one page run side
 * by side on their own CPUs where the broker has at most four workers. With fewer CPUs too when
 * the broker keeps a pool directory [dir]: a rank then reads a page with no round trip, in its
 * own time slice as from a private pool (TP=8 Kimi on 2 vCPUs: GET p50 0.56 ms against 0.59
 * private and 1.34 through the broker's workers, load phase 45 against 47 and 33 ms,
 * docs/benchmarks.md); without one the ranks' ACQUIREs and copies only contend there, and the
 * broker's workers split each page instead.
 */
static int self_get_rule(const struct kvb_client *c, const struct kvb_layout *l, uint64_t pb)
{
	const char *env = getenv("KVB_CLIENT_GET_SELF_KB");
	long cpus;

	if (env && *env)
		return pb >= c->get_self_min;
	if (l->kind != KVB_LAYOUT_MLA || l->tp_size < 2 || pb < (1ull << 20))
		return 0;
	cpus = sysconf(_SC_NPROCESSORS_ONLN);
	return cpus >= 2 * (long)l->tp_size || c->dir;
}

static int ns_reserve(struct kvb_client *c)
{
	struct kvbc_ns *n;
	uint32_t cap;

	if (c->nns < c->ns_cap)
		return 0;
	cap = c->ns_cap ? 2 * c->ns_cap : 4;
	n = realloc(c->ns, cap * sizeof(*n));
	if (!n)
		return -ENOMEM;
	c->ns = n;
	c->ns_cap = cap;
	return 0;
}

int kvb_ns_open(kvb_client *c, const struct kvb_layout *l, uint32_t *ns, size_t *page_bytes)
{
	return kvb_ns_open2(c, l, NULL, ns, page_bytes);
}

int kvb_ns_open2(kvb_client *c, const struct kvb_layout *l, const struct kvb_ns_ident *id,
		 uint32_t *ns, size_t *page_bytes)
{
	uint8_t msg[KVB_MSG_NS_OPEN_V2_SIZE];
	struct kvb_msg_ns_reply rep;
	struct kvbc_reply r;
	size_t mlen = sizeof(*l);
	uint64_t pb;
	int err;

	if (!l || !ns)
		return -EINVAL;
	/* The broker checks again; checking here spares a round trip and names the error. */
	err = kvb_layout_check(l, &pb);
	if (!err && id)
		err = kvb_ident_check(l, id);
	if (err)
		return err;
	memcpy(msg, l, sizeof(*l));
	err = kvbc_enter(c);
	if (err)
		return err;
	/*
	 * An ABI 1.1 broker would read the layout and drop the identity after it, merging
	 * namespaces that must stay apart: it gets the default identity only, as the short form.
	 */
	if (id && c->broker_minor >= 2) {
		memcpy(msg + sizeof(*l), id, sizeof(*id));
		mlen = sizeof(msg);
	} else if (!kvb_ident_is_default(id)) {
		err = -EOPNOTSUPP;
		goto out;
	}
	/* Room first: once the broker has answered, remembering the namespace must not fail. */
	err = ns_reserve(c);
	if (err)
		goto out;
	err = kvbc_ctl(c, KVB_MSG_NS_OPEN, msg, mlen, -1, &r);
	if (err < 0)
		goto out;
	err = kvbc_reply_body(&r, &rep, sizeof(rep));
	if (err)
		goto out_reply;
	/* page_bytes is a pure function of the layout: a different answer is not our protocol. */
	if (rep.page_bytes != pb) {
		err = -EPROTO;
		goto out_reply;
	}
	{
		uint32_t cid = kvbc_ns_cid(c, rep.ns);

		if (!kvbc_ns_find(c, cid)) {
			struct kvbc_ns *n = &c->ns[c->nns++];

			*n = (struct kvbc_ns){
				.id = cid,
				.bid = rep.ns,
				.nparts = kvb_layout_parts(l),
				.tpp = l->tokens_per_page,
				.page_bytes = pb,
				.mlen = (uint32_t)mlen,
				.self_get = self_get_rule(c, l, pb),
			};
			memcpy(n->msg, msg, mlen); /* [RECONNECT] opened again from this */
		}
		*ns = cid;
	}
	if (page_bytes)
		*page_bytes = (size_t)pb;
	err = 0;
out_reply:
	kvbc_reply_free(&r);
out:
	kvbc_leave(c);
	return err;
}

static void sqe_key(struct kvb_sqe *sqe, uint8_t opcode, uint32_t ns, const kvb_key *key)
{
	memset(sqe, 0, sizeof(*sqe));
	sqe->opcode = opcode;
	sqe->ns = ns;
	if (key)
		memcpy(sqe->key, key->b, sizeof(sqe->key));
}

/* Takes the lock and finds the namespace; -EBADF when this client never opened it. */
static int enter_ns(struct kvb_client *c, uint32_t ns, const struct kvbc_ns **out)
{
	int err = kvbc_enter(c);

	if (err)
		return err;
	*out = kvbc_ns_find(c, ns);
	if (!*out) {
		kvbc_leave(c);
		return -EBADF;
	}
	return 0;
}

/* Runs sqe; returns the CQE's res (and its flags in *flags), or the transport's error. */
static int run_parent(struct kvb_client *c, struct kvb_sqe *sqe, const kvb_key *parent,
		      uint32_t *flags)
{
	struct kvb_cqe cqe;
	int err = kvbc_sync_parent_locked(c, sqe, parent, &cqe);

	if (err)
		return err;
	if (flags)
		*flags = cqe.flags;
	return cqe.res;
}

static int run(struct kvb_client *c, struct kvb_sqe *sqe, uint32_t *flags)
{
	return run_parent(c, sqe, NULL, flags);
}

static int put_result(int res, uint32_t flags)
{
	if (res < 0)
		return res;
	return (flags & KVB_CQEF_EXISTED) ? 1 : 0;
}

/*
 * A filled PUT's staging copy goes in chunks, each published in the fill word: the first
 * small, so that the broker starts its copy early and tells us of a stored page before we
 * copied much of it, then doubling up to FILL_CHUNK_MAX, which bounds how far the broker's
 * copy trails ours (at most a chunk, a few tens of microseconds) while keeping the stores to
 * the shared word rare. Towards the end at most half of what is left, down to FILL_CHUNK_TAIL:
 * the broker's copy of the last chunk is all of its copy the PUT waits for once ours is done.
 */
#define FILL_CHUNK_FIRST (16u << 10)
#define FILL_CHUNK_MAX (256u << 10)
#define FILL_CHUNK_TAIL (8u << 10)

/*
 * [fill-ring] Where the staging copy lands and with which stores. The broker reads each chunk
 * right after us. Into one staging page, plain stores must take every line back from the
 * broker's cache, which read it last time: glibc's memcpy ran at 2-6 GB/s instead of 13-16
 * (64 KiB, AMD EPYC, 2 vCPUs), so such a copy uses streaming stores (kvb_copy_nt) and the
 * broker reads the chunk from DRAM. Pages under KVB_COPY_NT_MIN instead go round a ring of
 * staging slots, twice the L2 in all (conn.c stage_ring_bytes): by the time a slot comes
 * round again the broker's copy of its lines has left its L2, and the page crosses in the
 * shared L3 with plain stores, so the two copies no longer both go through DRAM. 64 KiB PUTs
 * from plain memory, client and broker pinned to a CPU each: 5.4-6.7 -> 8.2-9.3 GB/s (memcpy
 * 11.2-12.8; docs/benchmarks.md). Larger pages keep one slot and streaming stores: a ring of
 * a few of them would not leave the L2, and each fills the L3 anyway.
 *
 * Not always: in spells (seconds long; a vCPU placed far from the other, sharing no cache
 * with it whatever the guest's topology says) the ring's PUTs took 31-37 us against 7 for
 * streaming ones. So the ring's PUTs are timed, each kind's ns per MiB kept as a moving
 * average, and the faster kind used, the other tried now and then so that its figure follows
 * the machine. A probe of a kind k times slower costs k - 1 PUTs' time, so it comes once in
 * 100 (k - 1) PUTs, FILL_PROBE_MIN to FILL_PROBE_MAX: 1% of the time at most. Once in 64 in a
 * spell was a 32 us PUT among 7 us ones: 5% of a stream of 64 KiB PUTs, and its p99.
 */
#define FILL_PROBE_MIN 64
#define FILL_PROBE_MAX 1024

/* 1: this ring PUT's staging copy takes plain stores, 0 streaming ones. */
static int fill_plain(struct kvb_client *c)
{
	uint64_t plain = c->fill_ns[1], nt = c->fill_ns[0];
	int best = plain <= nt; /* the unmeasured kind first */
	uint64_t fast = best ? plain : nt, slow = best ? nt : plain, every = FILL_PROBE_MIN;

	if (fast && slow > fast)
		every = 100 * (slow - fast) / fast;
	every = every < FILL_PROBE_MIN ? FILL_PROBE_MIN : every;
	every = every > FILL_PROBE_MAX ? FILL_PROBE_MAX : every;
	return ++c->fill_n % every ? best : !best;
}

/* A ring PUT of len bytes took ns with plain or streaming stores: into that kind's average. */
static void fill_timed(struct kvb_client *c, int plain, uint64_t ns, size_t len)
{
	uint64_t *avg = &c->fill_ns[plain], x = (ns << 20) / len;

	/* A PUT that lost its CPU for a while says little of the stores: capped at twice. */
	if (*avg && x > 2 * *avg)
		x = 2 * *avg;
	*avg = *avg ? *avg - *avg / 8 + x / 8 : x + !x;
}

/* Staging slots for a filled PUT of len bytes: 1, or as many as the ring holds. */
static size_t stage_slots(const struct kvb_client *c, size_t len)
{
	return len < KVB_COPY_NT_MIN && len <= c->stage_ring / 2 ? c->stage_ring / len : 1;
}

/*
 * kvb_put() from plain memory to a broker of ABI 1.4 (wire.h, KVB_SQEF_FILL): posts the PUT of
 * the staging buffer first, then copies src into it while the broker copies out what is
 * there, and stops as soon as the broker says the page is stored or being stored by another
 * (ask-first: EXISTED). -EAGAIN from the broker (it gave up on the fill): finish the copy and
 * send a plain PUT. Returns the CQE's res with its flags in *flags, or the transport's error.
 */
static int put_fill(struct kvb_client *c, struct kvb_sqe *sqe, const kvb_key *parent,
		    const void *src, size_t len, int ring, uint32_t *flags)
{
	uint8_t *dst = (uint8_t *)c->staging.addr + sqe->off;
	size_t done = 0, chunk = FILL_CHUNK_FIRST;
	int plain = ring && fill_plain(c);
	uint64_t t0 = ring ? clock_ns() : 0;
	struct kvb_cqe cqe;
	int stopped = 0;
	uint32_t seq;
	int idx, err;

	sqe->flags = KVB_SQEF_FILL;
	kvb_store_relaxed(c->fill, 0); /* before the SQE: the SQ tail's release publishes it [R1] */
	idx = kvbc_post_sync_locked(c, sqe, parent);
	if (idx < 0)
		return idx;
	seq = ++c->fill_seq;
	/* Busy on this CPU: a broker polling on it yields to us (the spinning hints, wire.h). */
	kvb_store_relaxed(c->spin_cpu, (uint32_t)sched_getcpu() + 1u);
	while (done < len) {
		size_t left = len - done,
		       n = left / 2 > FILL_CHUNK_TAIL ? left / 2 : FILL_CHUNK_TAIL;

		n = n < chunk ? n : chunk;
		n = n < left ? n : left;

		if (plain)
			memcpy(dst + done, (const uint8_t *)src + done, n); /* [fill-ring] */
		else
			kvb_copy_nt(dst + done, (const uint8_t *)src + done, n);
		done += n;
		kvbc_fill_publish_locked(c, (uint32_t)done);
		if (chunk < FILL_CHUNK_MAX)
			chunk *= 2;
		stopped = kvb_load_relaxed(c->fill_stop) == seq;
		if (stopped || kvbc_sync_done_locked(c, (uint32_t)idx))
			break;
	}
	kvb_store_relaxed(c->spin_cpu, 0);
	/*
	 * Spin for the rest of the broker's copy of ours; told to stop, we wait for another
	 * rank's PUT instead, and spinning for it would take the CPUs that rank and the broker
	 * copy on (seven MLA ranks, two vCPUs): a short spin, then sleep until the CQE.
	 */
	c->expect_bytes = stopped ? 0 : len;
	err = kvbc_wait_sync_locked(c, (uint32_t)idx, &cqe);
	c->expect_bytes = 0;
	if (err)
		return err;
	if (cqe.res != -EAGAIN) {
		/* Timed only when the whole page crossed: a stored page stops the copy early. */
		if (ring && cqe.res >= 0 && !stopped && !(cqe.flags & KVB_CQEF_EXISTED))
			fill_timed(c, plain, clock_ns() - t0, len);
		*flags = cqe.flags;
		return cqe.res;
	}
	kvb_copy_nt(dst + done, (const uint8_t *)src + done, len - done);
	sqe->flags = 0;
	c->expect_bytes = len;
	err = run_parent(c, sqe, parent, flags);
	c->expect_bytes = 0;
	return err;
}

int kvb_put(kvb_client *c, uint32_t ns, kvb_key key, const void *src, size_t len)
{
	return kvb_put_child(c, ns, key, NULL, src, len);
}

int kvb_put_child(kvb_client *c, uint32_t ns, kvb_key key, const kvb_key *parent, const void *src,
		  size_t len)
{
	const struct kvbc_ns *n;
	const struct kvbc_buf *b;
	struct kvb_sqe sqe;
	uint32_t flags = 0;
	int err;

	if (!src)
		return -EINVAL;
	err = enter_ns(c, ns, &n);
	if (err)
		return err;
	if (len != n->page_bytes) {
		err = -EINVAL;
		goto out;
	}
	sqe_key(&sqe, KVB_OP_PUT, ns, &key);
	b = kvbc_buf_find(c, src, len);
	if (b) {
		sqe.buf = b->id;
		sqe.off = (uint64_t)((const char *)src - (const char *)b->addr);
	} else {
		int fill = c->broker_minor >= 4 && len >= c->fill_min;
		size_t slots = fill ? stage_slots(c, len) : 1;

		err = kvbc_staging_locked(c, len * slots);
		if (err)
			goto out;
		sqe.buf = c->staging.id;
		sqe.off = (uint64_t)(c->stage_next++ % slots) * len;
		if (fill) {
			err = put_fill(c, &sqe, parent, src, len, slots > 1, &flags);
			err = put_result(err, flags);
			goto out;
		}
		kvb_copy(c->staging.addr, src, len);
	}
	c->expect_bytes = len; /* the broker copies it (ring.c) */
	err = run_parent(c, &sqe, parent, &flags);
	c->expect_bytes = 0;
	err = put_result(err, flags);
out:
	kvbc_leave(c);
	return err;
}

/* Posts the RELEASE of a lease we no longer need without waiting for it (see the file comment). */
/*
 * KVB_SQEF_GET on the ACQUIRE and RELEASE of a kvb_get(): the broker counts the pair as the
 * GET it is. Only for brokers that know the flag (ABI 1.2); older ones refuse unknown flags.
 */
static uint8_t get_flag(const struct kvb_client *c, int as_get)
{
	return as_get && c->broker_minor >= 2 ? KVB_SQEF_GET : 0;
}

static void release_deferred(struct kvb_client *c, uint64_t lease, int as_get)
{
	struct kvb_sqe sqe;

	sqe_key(&sqe, KVB_OP_RELEASE, 0, NULL);
	sqe.flags = get_flag(c, as_get);
	sqe.off = lease;
	/* Fails only when the broker is gone, and then it has dropped the lease itself. */
	(void)kvbc_note_locked(c, &sqe);
}

/* ACQUIRE under the lock: returns 0 with *data and *lease, or a negative errno. */
static int acquire_locked(struct kvb_client *c, const struct kvbc_ns *n, const kvb_key *key,
			  const void **data, uint64_t *lease, int as_get)
{
	struct kvb_sqe sqe;
	struct kvb_cqe cqe;
	int err;

	sqe_key(&sqe, KVB_OP_ACQUIRE, n->id, key);
	sqe.flags = get_flag(c, as_get);
	err = kvbc_sync_locked(c, &sqe, &cqe);
	if (err)
		return err;
	if (cqe.res < 0)
		return cqe.res;
	err = kvbc_lease_map(c, cqe.loc, n->page_bytes, data);
	if (err) {
		release_deferred(c, cqe.lease, as_get);
		return err;
	}
	*lease = cqe.lease;
	return 0;
}

/*
 * [dir] kvb_get() of a page the pool directory lists: our own copy out of the pool map, with
 * no round trip (pooldir.h, the reader's side). 1 when dst holds the page, 0 when the broker
 * must be asked (not listed, or the entry changed while we copied: dst may hold anything).
 * The broker hears of the read afterwards (a GET with KVB_SQEF_GET, not waited for), to
 * count it and keep the page warm.
 */
static int dir_get(struct kvb_client *c, const struct kvbc_ns *n, uint32_t ns, const kvb_key *key,
		   void *dst)
{
	const struct kvb_dir_ent *e;
	const void *src;
	uint32_t seq, len;
	uint64_t loc;

	if (!kvbc_dir_readable(c))
		return 0;
	e = kvb_dir_find(c->dir, c->dir_nbuckets, c->dir_epoch, n->bid, key, &seq, &loc, &len);
	if (!e || len < n->page_bytes || kvbc_lease_map(c, loc, n->page_bytes, &src))
		return 0;
	kvb_copy(dst, src, n->page_bytes);
	if (!kvb_dir_still(c->dir, e, seq, c->dir_epoch))
		return 0;
	kvbc_dir_read_note(c, ns, key);
	return 1;
}

void kvbc_dir_read_note(struct kvb_client *c, uint32_t ns, const kvb_key *key)
{
	struct kvb_sqe sqe;

	sqe_key(&sqe, KVB_OP_GET, ns, key);
	sqe.flags = KVB_SQEF_GET;
	/* Fails only when the broker is gone: the read stands, it is only not counted. */
	(void)kvbc_note_locked(c, &sqe);
}

int kvb_get(kvb_client *c, uint32_t ns, kvb_key key, void *dst, size_t len)
{
	const struct kvbc_ns *n;
	const struct kvbc_buf *b;
	struct kvb_sqe sqe;
	const void *data;
	uint64_t lease;
	int err, hot;

	if (!dst)
		return -EINVAL;
	err = enter_ns(c, ns, &n);
	if (err)
		return err;
	if (len < n->page_bytes) {
		err = -EINVAL;
		goto out;
	}
	b = kvbc_buf_find(c, dst, n->page_bytes);
	/*
	 * Large pages into a buffer we may write (kvbc_buf_direct): we copy them (a lease), so
	 * that TP ranks loading one page copy it in parallel rather than queue on the broker's
	 * copy threads (one per two CPUs), and the copy faults only our own page tables.
	 */
	if (b && kvbc_buf_direct(b) && n->self_get)
		b = NULL;
	/*
	 * [dir] Plain memory, and a buffer we may write for pages below KVBC_DIR_GET_BUF_MAX,
	 * where the round trip is most of a GET, or into the destination of our previous GET (a
	 * staging page: our cache holds it, Kimi pages 0.86 -> 0.97 of memcpy); other large
	 * pages into a buffer go to the broker, whose copy threads split them (faster than one
	 * copy of ours into fresh memory from 1 MiB on, docs/benchmarks.md), except on a small
	 * machine [dir-few] (conn.c). A page the directory does not list goes to the broker
	 * too: a fetch from the disk or a remote tier lands in dst directly.
	 */
	hot = dst == c->last_get_dst;
	c->last_get_dst = dst;
	if ((!b || (kvbc_buf_direct(b) &&
		    (n->page_bytes < KVBC_DIR_GET_BUF_MAX || hot || c->dir_get_big))) &&
	    dir_get(c, n, ns, &key, dst)) {
		err = (int)n->page_bytes;
		goto out;
	}
	if (b) {
		sqe_key(&sqe, KVB_OP_GET, ns, &key);
		sqe.buf = b->id;
		sqe.off = (uint64_t)((char *)dst - (char *)b->addr);
		c->expect_bytes = n->page_bytes;
		err = run(c, &sqe, NULL);
		c->expect_bytes = 0;
		if (err >= 0 && (uint64_t)err != n->page_bytes)
			err = -EPROTO;
		goto out;
	}
	err = acquire_locked(c, n, &key, &data, &lease, 1);
	if (err)
		goto out;
	kvb_copy(dst, data, n->page_bytes);
	release_deferred(c, lease, 1);
	err = (int)n->page_bytes;
out:
	kvbc_leave(c);
	return err;
}

int kvb_lookup_tiers(kvb_client *c, uint32_t ns, const kvb_key *keys, size_t n, size_t *hits,
		     uint8_t *tiers)
{
	const struct kvbc_ns *nsr;
	struct kvb_sqe sqe;
	size_t per, total = 0;
	int missed = 0, err;

	if (n && !keys)
		return -EINVAL;
	err = enter_ns(c, ns, &nsr);
	if (err)
		return err;
	/* Keys then tier bytes of one chunk side by side: 33 bytes a key (>= 124 keys in 4 KiB). */
	per = kvbc_lookup_room(c) / (sizeof(kvb_key) + 1);
	if (n && !per) {
		err = -EOPNOTSUPP; /* a broker started without an argument area */
		goto out;
	}
	if (per > UINT32_MAX / sizeof(kvb_key))
		per = UINT32_MAX / sizeof(kvb_key);
	for (size_t done = 0; done < n;) {
		uint32_t cnt = (uint32_t)(n - done < per ? n - done : per);
		int res;

		memcpy(c->arg, &keys[done], (size_t)cnt * sizeof(kvb_key));
		sqe_key(&sqe, KVB_OP_LOOKUP, ns, NULL);
		sqe.batch.arg_off = 0;
		sqe.batch.count = cnt;
		sqe.batch.out_off = cnt * (uint32_t)sizeof(kvb_key);
		res = run(c, &sqe, NULL);
		if (res < 0) {
			err = res;
			goto out;
		}
		if ((uint32_t)res > cnt) {
			err = -EPROTO;
			goto out;
		}
		if (tiers)
			memcpy(&tiers[done], c->arg + sqe.batch.out_off, cnt);
		if (!missed)
			total += (size_t)res;
		done += cnt;
		if ((uint32_t)res < cnt) {
			missed = 1;
			/* The prefix has ended; only a caller who wants every tier needs the rest. */
			if (!tiers)
				break;
		}
	}
	if (hits)
		*hits = total;
	err = 0;
out:
	kvbc_leave(c);
	return err;
}

int kvb_lookup(kvb_client *c, uint32_t ns, const kvb_key *keys, size_t n, size_t *hits)
{
	if (!hits)
		return -EINVAL;
	return kvb_lookup_tiers(c, ns, keys, n, hits, NULL);
}

int kvb_delete(kvb_client *c, uint32_t ns, kvb_key key)
{
	const struct kvbc_ns *n;
	struct kvb_sqe sqe;
	int err;

	err = enter_ns(c, ns, &n);
	if (err)
		return err;
	sqe_key(&sqe, KVB_OP_DELETE, ns, &key);
	err = run(c, &sqe, NULL);
	if (err > 0)
		err = 0;
	kvbc_leave(c);
	return err;
}

/* [hazard] Entry i of our hazard table names nothing again (after our reads of the page). */
static void hz_clear(struct kvb_client *c, uint32_t i)
{
	kvb_store64_release(&c->hz[i], 0);
	kvb_store_relaxed(c->hz_count, --c->hz_n);
}

/*
 * [hazard] kvb_acquire() of a page the pool directory lists, leased under our hazard table with
 * no round trip (wire.h: the entry, the count, a full fence [H1], then the directory entry
 * again). 1 with *data and *id, 0 when the broker must be asked. The broker hears of it
 * afterwards (an ACQUIRE with KVB_SQEF_HELD in the note ring), to count it and warm the page.
 */
static int hz_acquire(struct kvb_client *c, const struct kvbc_ns *n, uint32_t ns,
		      const kvb_key *key, const void **data, uint64_t *id)
{
	const struct kvb_dir_ent *e;
	struct kvb_sqe sqe;
	uint32_t seq, len, i, max;
	uint64_t loc, budget;

	if (!c->hz || !kvbc_dir_readable(c))
		return 0;
	/* Within what the broker lets such leases of ours hold now (KVB_HZ_MAX, KVB_HZ_BUDGET). */
	max = kvb_load_relaxed(c->hz_max);
	budget = kvb_load64_relaxed(c->hz_budget);
	if ((uint32_t)__builtin_popcount(c->hz_used) >=
		    (max < KVB_HZ_ENTRIES ? max : KVB_HZ_ENTRIES) ||
	    (budget && c->hz_held + n->page_bytes > budget))
		return 0;
	e = kvb_dir_find(c->dir, c->dir_nbuckets, c->dir_epoch, n->bid, key, &seq, &loc, &len);
	if (!e || len < n->page_bytes || kvbc_lease_map(c, loc, n->page_bytes, data))
		return 0;
	i = (uint32_t)__builtin_ctz(~c->hz_used);
	kvb_store64_relaxed(&c->hz[i], loc | 1);
	kvb_store_relaxed(c->hz_count, ++c->hz_n);
	kvb_fence_full(); /* [H1] pairs with the broker's after it withdraws a directory entry */
	if (!kvb_dir_still(c->dir, e, seq, c->dir_epoch)) {
		hz_clear(c, i);
		return 0;
	}
	c->hz_used |= 1u << i;
	*id = ((uint64_t)++c->hz_seq << 32) | (KVB_HZ_LEASE_MIN + i);
	c->hz_id[i] = *id;
	c->hz_len[i] = n->page_bytes;
	c->hz_held += n->page_bytes;
	sqe_key(&sqe, KVB_OP_ACQUIRE, ns, key);
	sqe.flags = KVB_SQEF_HELD;
	sqe.off = *id;			 /* what the broker counts it by */
	(void)kvbc_note_locked(c, &sqe); /* fails only with the broker gone: uncounted */
	return 1;
}

int kvbc_hz_release(struct kvb_client *c, uint64_t id)
{
	uint32_t i = (uint32_t)id - KVB_HZ_LEASE_MIN;

	if ((uint32_t)id < KVB_HZ_LEASE_MIN || i >= KVB_HZ_ENTRIES || !(c->hz_used & (1u << i)) ||
	    c->hz_id[i] != id)
		return 0;
	hz_clear(c, i);
	c->hz_used &= ~(1u << i);
	c->hz_held -= c->hz_len[i];
	return 1;
}

int kvb_acquire(kvb_client *c, uint32_t ns, kvb_key key, struct kvb_lease *lease)
{
	const struct kvbc_ns *n;
	const void *data;
	uint64_t id;
	int err, hz;

	if (!lease)
		return -EINVAL;
	err = enter_ns(c, ns, &n);
	if (err)
		return err;
	hz = hz_acquire(c, n, ns, &key, &data, &id);
	err = hz ? 0 : acquire_locked(c, n, &key, &data, &id, 0);
	if (!err) {
		c->leases++;
		if (!hz) {
			id = kvbc_lease_issue(c, id);		     /* [lease-alias] */
			kvbc_lease_note(c, id, data, n->page_bytes); /* [release-post] */
		}
		lease->data = data;
		lease->len = (size_t)n->page_bytes;
		lease->id = id;
	}
	kvbc_leave(c);
	return err;
}

/*
 * [release-post] The lease ids this client holds, as a list searched from its newest end
 * (a lease is most often released soon, and there are few). An id may be held more than
 * once: two ACQUIREs of one page give it twice, and the broker wants two RELEASEs.
 */
void kvbc_lease_note(struct kvb_client *c, uint64_t id, const void *data, uint64_t len)
{
	if (c->nheld == c->held_cap) {
		uint32_t cap = c->held_cap ? 2 * c->held_cap : 16;
		struct kvbc_held *n = realloc(c->held, cap * sizeof(*n));

		if (!n)
			return; /* not noted: its kvb_release() waits for the broker's answer */
		c->held = n;
		c->held_cap = cap;
	}
	c->held[c->nheld++] = (struct kvbc_held){id, data, len};
}

int kvbc_lease_held(const struct kvb_client *c, uint64_t id)
{
	for (uint32_t i = 0; i < c->nheld; i++)
		if (c->held[i].id == id)
			return 1;
	return 0;
}

/* Removes one instance of id; 1 when it was held. */
static int lease_unnote(struct kvb_client *c, uint64_t id)
{
	const void *data;
	uint64_t len;

	kvbc_lease_forget(c, id, &data, &len);
	return data != NULL;
}

void kvbc_lease_forget(struct kvb_client *c, uint64_t id, const void **data, uint64_t *len)
{
	*data = NULL;
	*len = 0;
	for (uint32_t i = c->nheld; i-- > 0;) {
		if (c->held[i].id == id) {
			*data = c->held[i].data;
			*len = c->held[i].len;
			c->held[i] = c->held[--c->nheld];
			return;
		}
	}
}

/*
 * [lease-alias] A broker that adopts the pool gives a page the lease id its predecessor gave it
 * (same slot, same generation), and a cold one counts generations from the same start, so a
 * lease of the new broker can have the id of an old one the caller still holds. An async
 * RELEASE carries nothing but the id, and the old lease's would release the new one. Such an id
 * is handed out as an alias instead, never the broker's: a count of this client's in the high
 * word, KVBC_LEASE_ALIAS in the low. Collisions need a restart and a page taken again, so the
 * table is small and searched whole; so are the old ids each new lease is looked up among, as
 * long as old leases are held (few outlive a restart).
 */
uint64_t kvbc_lease_issue(struct kvb_client *c, uint64_t real)
{
	struct kvbc_alias *a;
	uint32_t i;

	for (i = 0; i < c->nold_ids && c->old_ids[i].id != real; i++)
		;
	if (i == c->nold_ids)
		return real;
	if (c->nalias == c->alias_cap) {
		uint32_t cap = c->alias_cap ? 2 * c->alias_cap : 8;

		a = realloc(c->alias, cap * sizeof(*a));
		if (!a)
			return real; /* out of memory: an old lease's RELEASE is ambiguous */
		c->alias = a;
		c->alias_cap = cap;
	}
	a = &c->alias[c->nalias++];
	a->real = real;
	a->id = (uint64_t)++c->alias_seq << 32 | KVBC_LEASE_ALIAS;
	return a->id;
}

static struct kvbc_alias *alias_of(struct kvb_client *c, uint64_t id)
{
	if ((uint32_t)id != KVBC_LEASE_ALIAS)
		return NULL;
	for (uint32_t i = 0; i < c->nalias; i++)
		if (c->alias[i].id == id)
			return &c->alias[i];
	return NULL;
}

uint64_t kvbc_lease_wire(struct kvb_client *c, uint64_t id)
{
	const struct kvbc_alias *a = alias_of(c, id);

	return a ? a->real : id; /* none (released already, forged): the broker says -EINVAL */
}

void kvbc_lease_unalias(struct kvb_client *c, uint64_t id)
{
	struct kvbc_alias *a = alias_of(c, id);

	if (a)
		*a = c->alias[--c->nalias];
}

int kvb_release(kvb_client *c, struct kvb_lease *lease)
{
	struct kvb_sqe sqe;
	int err;

	if (!lease)
		return -EINVAL;
	err = kvbc_enter(c);
	if (err)
		return err;
	/*
	 * [RECONNECT] A lease of a broker that went: nothing to tell the new one. Found by its
	 * mapping, or by its id where the mapping could not be kept on record (out of memory at
	 * the reconnect: conn.c retire_broker), which [lease-alias] keeps apart from the new
	 * broker's ids.
	 */
	if (kvbc_lease_retired(c, lease->data, lease->id) || kvbc_old_release(c, lease->id)) {
		lease->data = NULL;
		lease->len = 0;
		kvbc_leave(c);
		return 0;
	}
	sqe_key(&sqe, KVB_OP_RELEASE, 0, NULL);
	sqe.off = kvbc_lease_wire(c, lease->id); /* [lease-alias] */
	/*
	 * [release-post] A lease we hold is released without waiting for the broker's answer,
	 * which can only be success: the RELEASE goes into the note ring (ring.c [notes]; the SQ
	 * without a doorbell where there is none), which the broker reads before it answers a
	 * STATS, before our next ACQUIRE or RELEASE on the SQ, before a full pool refuses a PUT,
	 * and otherwise within its next tick. A lease of our hazard table is released here, by
	 * clearing its entry; the broker, told, counts it and drops its pin ([hazard]). Any other id (released
	 * already, forged, another client's) waits for the broker's -EINVAL.
	 */
	if (kvbc_hz_release(c, lease->id)) {
		sqe.flags = KVB_SQEF_HELD;
		(void)kvbc_note_locked(c, &sqe); /* fails only with the broker gone: uncounted */
		err = 0;
	} else if (lease_unnote(c, lease->id)) {
		err = kvbc_note_locked(c, &sqe);
		if (err)
			kvbc_lease_note(c, lease->id, lease->data,
					lease->len); /* broker gone: still held */
	} else {
		err = run(c, &sqe, NULL);
	}
	if (err >= 0) {
		kvbc_lease_unalias(c, lease->id);
		if (c->leases)
			c->leases--;
		/* The page may be evicted and its slot reused now: make a stale read fault loudly. */
		lease->data = NULL;
		lease->len = 0;
		err = 0;
	}
	kvbc_leave(c);
	return err;
}

int kvb_lease_copy(const struct kvb_lease *lease, size_t off, void *dst, size_t len)
{
	if (!lease || !lease->data || !dst || off > lease->len || len > lease->len - off)
		return -EINVAL;
	kvb_copy(dst, (const uint8_t *)lease->data + off, len);
	return 0;
}

int kvb_nop(kvb_client *c)
{
	struct kvb_sqe sqe;
	int err;

	err = kvbc_enter(c);
	if (err)
		return err;
	sqe_key(&sqe, KVB_OP_NOP, 0, NULL);
	err = run(c, &sqe, NULL);
	if (err > 0)
		err = 0;
	kvbc_leave(c);
	return err;
}

int kvb_view_put(kvb_client *c, uint32_t view, kvb_key key, uint64_t slot)
{
	return kvb_view_put_child(c, view, key, NULL, slot);
}

int kvb_view_put_child(kvb_client *c, uint32_t view, kvb_key key, const kvb_key *parent,
		       uint64_t slot)
{
	struct kvb_sqe sqe;
	uint32_t flags = 0;
	int err;

	err = kvbc_enter(c);
	if (err)
		return err;
	sqe_key(&sqe, KVB_OP_PUT, 0, &key);
	sqe.flags = KVB_OPF_VIEW;
	sqe.buf = view;
	sqe.off = slot;
	err = run_parent(c, &sqe, parent, &flags);
	err = put_result(err, flags);
	kvbc_leave(c);
	return err;
}

int kvb_view_get(kvb_client *c, uint32_t view, kvb_key key, uint64_t slot, uint32_t layer_first,
		 uint32_t layer_count)
{
	struct kvbc_vread vr;
	struct kvb_sqe sqe;
	int err;

	/* The SQE carries 16-bit layer fields; KVB_MAX_VIEW_PARTS keeps real ranges far below. */
	if (layer_first > UINT16_MAX || layer_count > UINT16_MAX)
		return -EINVAL;
	err = kvbc_enter(c);
	if (err)
		return err;
	/* [vdir] A page the directory lists: our own copy (vread.c). */
	err = kvbc_view_dir_find(c, view, &key, slot, layer_first, layer_count, &vr)
		      ? kvbc_view_dir_copy(c, &key, &vr)
		      : 0;
	if (!err) {
		sqe_key(&sqe, KVB_OP_GET, 0, &key);
		sqe.flags = KVB_OPF_VIEW;
		sqe.buf = view;
		sqe.off = slot;
		sqe.layer_first = (uint16_t)layer_first;
		sqe.layer_count = (uint16_t)layer_count;
		err = run(c, &sqe, NULL);
	}
	kvbc_leave(c);
	return err;
}
