/* SPDX-License-Identifier: MIT */
/*
 * internal.h - what the files of libkvbroker share: the client object and the kvbc_* helpers
 * each file offers the others. Nothing here is exported (client/libkvbroker.map keeps only
 * kvb_*), and the kvbc_ prefix keeps a static link from colliding with an engine's symbols.
 *
 * Locking: every public entry point takes kvb_client.lock for its whole duration, including
 * while it waits for a completion or for a control reply, so calls on one client are serialized
 * and everything below is touched by one thread at a time. The one exception is kvb_reap(),
 * which drops the lock while it sleeps in poll() (and only then: it touches nothing of the
 * client meanwhile), so that a completion thread blocked in kvb_reap() does not stall the
 * threads that submit. Functions named *_locked expect the lock held; so do all kvbc_*
 * functions that take a client. Only kvb_key_chain(), kvb_key_chain_eagle(), kvb_version() and
 * kvb_strerror() are lock-free (they touch no client). kvb_close() waits for a call in progress,
 * then makes the client fatal (-ESHUTDOWN) and wakes every thread asleep in kvb_reap(); it
 * frees the client only once nreapers is 0. A call started after kvb_close() returned is the
 * caller's bug.
 *
 * Fatal state: once the broker is gone (socket hang-up) or has broken the ring protocol,
 * c->fatal holds -ECONNRESET or -EPROTO and every later call returns it at once; -ESHUTDOWN
 * while kvb_close() runs.
 */
#ifndef KVB_CLIENT_INTERNAL_H
#define KVB_CLIENT_INTERNAL_H

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "clock.h" /* clock_ns(): every deadline and timing of the library */
#include "api.h"
#include "pooldir.h"
#include "proto.h"
#include "ring.h"
#include "wire.h"

/* How long a waiter spins on the CQ before it sleeps on the doorbell (see ring.c). */
#define KVBC_SPIN_NS_DEFAULT 30000ull
/*
 * kvb_get() of pages this big into a buffer of ours: ACQUIRE and our own copy (ops.c), when
 * KVB_CLIENT_GET_SELF_KB is set but unreadable: off. Unset, ops.c's self_get_rule() decides.
 */
#define KVBC_GET_SELF_DEFAULT UINT64_MAX
/*
 * kvb_put() from plain memory of pages this big: a filled PUT (ops.c), the staging copy and the
 * broker's overlapping. Smaller pages: copy, then a plain PUT.
 */
#define KVBC_FILL_MIN_DEFAULT (64ull << 10)
/* How long a control request waits for its reply. */
#define KVBC_CTL_TIMEOUT_MS 30000

/*
 * In-flight operation slots. Every SQE carries a token (gen << 32 | index) in user_data
 * instead of the caller's value, so a CQE maps back to its slot without a search and without
 * ever confusing the library's own ops with the caller's. The slot keeps the caller's user_data
 * and, for ACQUIRE, the namespace whose page_bytes becomes lease.len.
 */
enum kvbc_slot_kind {
	KVBC_SLOT_FREE = 0,
	KVBC_SLOT_SYNC,	   /* a synchronous call waits on it */
	KVBC_SLOT_ASYNC,   /* kvb_submit(); delivered by kvb_reap() */
	KVBC_SLOT_DISCARD, /* fire and forget (deferred RELEASE); dropped on completion */
};

/* [release-post] A lease of the current broker we hold: its id, and [retire] its bytes. */
struct kvbc_held {
	uint64_t id;
	const void *data;
	uint64_t len;
};

struct kvbc_slot {
	uint64_t user_data; /* ASYNC: the caller's */
	struct kvb_cqe cqe; /* valid once done */
	uint32_t gen;	    /* bumped on every reuse: a stale or forged token never matches */
	uint32_t ns;	    /* ACQUIRE: namespace, for lease.len */
	uint64_t lease;	    /* ASYNC RELEASE: the lease, still the caller's if the broker goes */
	const void *lease_data; /* ... its bytes and length, noted again with it ([retire]) */
	uint64_t lease_len;
	uint8_t kind; /* enum kvbc_slot_kind */
	uint8_t opcode;
	uint8_t done;
};

/* A namespace this client opened: what the library needs to size pages and views. */
struct kvbc_ns {
	uint32_t id;   /* the caller's: what the first broker answered (conn.c [RECONNECT]) */
	uint32_t bid;  /* the current broker's */
	uint32_t mlen; /* bytes of msg */
	uint8_t msg[KVB_MSG_NS_OPEN_V2_SIZE]; /* the NS_OPEN body, sent again on a reconnect */
	uint32_t nparts; /* (component, layer) pairs: the part count of its views */
	uint32_t tpp;	 /* tokens_per_page */
	uint64_t page_bytes;
	int self_get; /* kvb_get() into a buffer of ours: our own copy (ops.c, self_get_rule) */
};

/*
 * A registered buffer: host (memfd mapped read-write here, copied to/from by the broker) or GPU
 * (addr is the device pointer; nothing mapped here).
 */
struct kvbc_buf {
	struct kvbc_buf *next;
	void *addr;
	size_t len;   /* mapped and registered bytes */
	uint32_t id;  /* the caller's */
	uint32_t bid; /* the current broker's; UINT32_MAX: lost in a reconnect */
	int gpu;
	int foreign; /* kvb_buf_register_host_fd(): the caller's mapping (or none), never unmapped */
	int mapped;  /* foreign: addr maps the range shared and writable, the file sealed (buf.c) */
	int fd;	     /* host: our own fd of the file, to register it again; -1 none */
	uint64_t off;	   /* BUF_REG_FD: offset in the file */
	uint32_t regflags; /* BUF_REG_FD: KVB_BUF_REG_FD_* */
	/* GPU: the allocation the buffer was in, to register it again after a reconnect. */
	uint64_t gpu_base, gpu_size;
};

/* A view, kept to be created again on a reconnect (with the caller's ns and buffer ids). */
struct kvbc_view {
	uint32_t id, bid;
	uint16_t type; /* KVB_MSG_VIEW_CREATE or _CREATE2 */
	uint32_t len;
	void *msg;
	struct kvbc_vplan *plan; /* vread.c [vdir]: NULL until its first GET */
};

struct kvbc_arena {
	const void *map; /* PROT_READ, MAP_SHARED */
	size_t size;
};

/*
 * [RECONNECT] The pool maps of a broker that went, kept while leases it granted are held: the
 * last of them unmaps them (conn.c old_lease_gone), whatever other brokers' leases are held.
 */
struct kvbc_gone {
	struct kvbc_arena arenas[KVB_MAX_ARENAS];
	uint32_t narenas;
	uint32_t leases; /* its leases still held */
	uint32_t gen;	 /* which broker: what its old ids carry */
};

struct kvbc_old_id {
	uint64_t id; /* a lease id the caller holds (an alias, if it got one) */
	uint32_t gen;
};

struct kvb_client {
	pthread_mutex_t lock;
	int sock;	/* control socket */
	int sq_efd;	/* we write: wakes the broker */
	int cq_efd;	/* the broker writes: wakes us */
	int fatal;	/* 0, -ECONNRESET or -EPROTO: see the file comment */
	uint32_t flags; /* KVB_CONNECT_* */
	uint32_t seq;	/* last control request seq */
	uint32_t client_id;
	uint32_t broker_minor; /* the broker's KVB_ABI_MINOR (what it understands) */
	uint64_t spin_ns;      /* CQ spin before sleeping */
	uint64_t expect_bytes; /* the page the broker copies for the sync op waited on (ring.c) */
	uint64_t get_self_min; /* kvb_get() into our own buffer copies pages this big itself */

	/* Ring region (absent on a control-only client: region == NULL). */
	void *region;
	size_t region_size;
	struct kvb_region_hdr hdr;	       /* private copy: the shared one is never re-read */
	struct kvb_ring sq;		       /* we produce */
	struct kvb_ring cq;		       /* we consume */
	struct kvb_ring notes;		       /* [notes] we produce; entries NULL: none */
	uint32_t notes_bell;		       /* ring.c [note-early]: its head when we last rang */
	kvb_atomic_u32 *broker_cpu, *spin_cpu; /* spinning hints (wire.h) */
	kvb_atomic_u32 *fill, *fill_stop;      /* KVB_SQEF_FILL (wire.h): ours, the broker's */
	uint32_t fill_seq;		       /* KVB_SQEF_FILL SQEs posted to this region */
	uint64_t fill_min; /* kvb_put() from plain memory fills from this size */
	int dir_get_big; /* ops.c [dir-few]: kvb_get() into buffers via the directory at any size */
	uint8_t *arg;	 /* argument area */
	uint32_t arg_size;

	struct kvbc_arena arenas[KVB_MAX_ARENAS];
	uint32_t narenas;
	/* [dir] The pool directory (pooldir.h) in arena 0's map, NULL none; its geometry and
	 * epoch as checked at attach. */
	const struct kvb_dir_hdr *dir;
	uint32_t dir_nbuckets, dir_epoch;
	const void *last_get_dst; /* ops.c [dir]: where the last kvb_get() copied to */
	/* [hazard] Our hazard table (wire.h) in the ring region, NULL none (ring.c sets it). */
	kvb_atomic_u32 *hz_count;
	kvb_atomic_u64 *hz;
	uint32_t hz_used; /* bit i: entry i holds a lease of ours */
	uint32_t hz_n;	  /* entries in use: what we publish in hz_count */
	uint32_t hz_seq;  /* numbers the leases, so a stale id never matches a new one */
	/* What the broker lets us still hold so (wire.h), as it rewrites it: page bytes (0 no
	 * limit) and entries. */
	const kvb_atomic_u64 *hz_budget;
	const kvb_atomic_u32 *hz_max;
	uint64_t hz_held; /* page bytes we hold so */
	uint64_t hz_id[KVB_HZ_ENTRIES];
	uint64_t hz_len[KVB_HZ_ENTRIES];

	/* Operation slots: nslots == cq_entries, so the CQ can never overflow. */
	struct kvbc_slot *slots;
	uint32_t *free_list; /* stack of free slot indices */
	uint32_t nfree;
	uint32_t nslots;
	uint32_t nasync;     /* ASYNC slots in use (in flight or done, not yet reaped) */
	uint32_t *doneq;     /* FIFO of done ASYNC slots, in completion order */
	uint32_t doneq_head; /* free-running, masked by nslots - 1 (a power of two) */
	uint32_t doneq_tail;
	uint64_t bogus_cqes;   /* CQEs whose token matched nothing (counted, ignored) */
	uint32_t sleepers;     /* threads in poll() on the cq doorbell (ring.c: cq_sleep) */
	int poller;	       /* a kvb_reap() thread is in poll() without the lock */
	int kick_poller;       /* its wake-up was taken by another thread: ring again at leave */
	pthread_cond_t reaped; /* other reapers wait here for the poller or a drain */
	uint32_t nreapers;     /* threads inside kvb_reap(): kvb_close() waits for them */
	int broker_waking;     /* we rang the sq doorbell and no CQE has come since (ring.c) */
	/* kvb_completion_fd() (ring.c [CFD]); the fds are valid only while cfd_on. */
	int cfd_on;   /* created: KVB_CQ_NEED_WAKEUP stays set for the client's life */
	int cfd;      /* epoll instance over cq_efd and note_efd: what the caller polls */
	int note_efd; /* eventfd, non-zero exactly while the done queue is not empty */
	int note_set; /* what we last made note_efd's counter: 1 non-zero, 0 zero */

	struct kvbc_ns *ns;
	uint32_t nns;
	uint32_t ns_cap;

	struct kvbc_buf *bufs;	 /* caller's buffers, most recently hit first */
	struct kvbc_buf staging; /* library-owned; addr NULL until first needed */
	size_t stage_ring;	 /* ops.c [fill-ring]: bytes of staging slots for small pages, */
	uint32_t stage_next;	 /* the slot of the next filled PUT, */
	uint32_t fill_n;	 /* ring PUTs so far, */
	uint64_t fill_ns[2];	 /* and their ns per MiB (streaming, plain stores), 0 unmeasured */

	/* [RECONNECT] conn.c: what it takes to attach again to a broker that came back. */
	char path[108];		       /* socket */
	struct kvb_msg_hello hello;    /* as first sent */
	int reconnect;		       /* 0: KVB_CONNECT_NO_RECONNECT */
	uint32_t reconnect_ms;	       /* kvb_opts.reconnect_ms: how long a call waits */
	uint32_t reconnects;	       /* successful ones; ids are translated once > 0 */
	uint64_t retry_at, backoff_ns; /* the next attempt, CLOCK_MONOTONIC ns */
	uint32_t leases;	       /* leases acquired here and not released */
	uint32_t old_leases;	       /* of them, leases of a previous broker (retired maps) */
	struct kvbc_held *held;	       /* [release-post] this broker's leases we hold */
	uint32_t nheld, held_cap;
	struct kvbc_gone *gone; /* brokers that went while leases of theirs were held */
	uint32_t ngone, gone_seq;
	struct kvbc_view *views;
	uint32_t nviews, views_cap;
	uint64_t buf_gen;    /* [vdir] bumped when a buffer goes: view plans are rebuilt */
	uint32_t nmut_async; /* [vdir] async DELETEs and PUTs in flight: no view reads of ours */
	struct kvbc_old_id *old_ids; /* [RECONNECT] ids of old_leases (conn.c old_ids_keep) */
	uint32_t nold_ids;
	struct kvbc_alias *alias; /* [lease-alias] the ids handed out for this broker's */
	uint32_t nalias, alias_cap, alias_seq;
};

/*
 * ops.c [release-post]: lease id was handed to the caller (kvb_acquire, an async ACQUIRE's
 * completion), or given back by an async RELEASE; kvb_release() posts without waiting only
 * for an id noted here. A failed note only costs the wait.
 */
void kvbc_lease_note(struct kvb_client *c, uint64_t id, const void *data, uint64_t len);
/* Forgets one instance of id; its bytes into *data and *len (NULL, 0 when not held). */
void kvbc_lease_forget(struct kvb_client *c, uint64_t id, const void **data, uint64_t *len);

/*
 * ops.c [lease-alias]: kvbc_lease_issue() turns the broker's lease id into the one the caller
 * gets (the same, unless an old broker's lease we hold has it); kvbc_lease_wire() turns the
 * caller's back into the broker's for a RELEASE, and kvbc_lease_unalias() forgets the alias
 * once that RELEASE succeeded (a failed one may be sent again).
 */
#define KVBC_LEASE_ALIAS 0xfffffffeu /* in an alias's low word: no page id or hazard lease's */
_Static_assert(KVBC_LEASE_ALIAS >= KVB_HZ_LEASE_MIN + KVB_HZ_ENTRIES, "alias is a hazard id");
struct kvbc_alias {
	uint64_t id, real;
};
uint64_t kvbc_lease_issue(struct kvb_client *c, uint64_t real);
uint64_t kvbc_lease_wire(struct kvb_client *c, uint64_t id);
void kvbc_lease_unalias(struct kvb_client *c, uint64_t id);
/* [hazard] A lease of our hazard table is released here (its entry cleared): 1; else 0. */
int kvbc_hz_release(struct kvb_client *c, uint64_t id);
/*
 * ring.c [release-post]: waits until every SQE posted without waiting for its answer (a
 * RELEASE) has completed, so that a control request sent next is answered after them; at
 * most timeout_ms, then 0 all the same. A fatal error of the connection is returned.
 */
int kvbc_wait_discards_locked(struct kvb_client *c, uint32_t timeout_ms);

/* conn.c [RECONNECT]: the broker is gone (sets fatal, fails in-flight async ops). */
int kvbc_lost(struct kvb_client *c, int err);
/* ring.c: every async op in flight completes with err; discarded ones are dropped. */
void kvbc_fail_inflight(struct kvb_client *c, int err);
/* conn.c: the current broker's id of the caller's namespace, buffer or view id. */
uint32_t kvbc_ns_bid(const struct kvb_client *c, uint32_t id);
uint32_t kvbc_buf_bid(const struct kvb_client *c, uint32_t id);
void kvbc_view_msg_bids(kvb_client *c, uint16_t type, void *m); /* buf.c: ids -> broker ids */
uint32_t kvbc_view_bid(const struct kvb_client *c, uint32_t id);
/* A caller-visible id for a new object the broker named bid (unused by the caller yet). */
uint32_t kvbc_ns_cid(const struct kvb_client *c, uint32_t bid);
uint32_t kvbc_buf_cid(const struct kvb_client *c, uint32_t bid);
/* The SQE's ids, caller's -> broker's (nothing to do before the first reconnect). */
void kvbc_sqe_ids(const struct kvb_client *c, struct kvb_sqe *sqe);
/* ring.c: kvbc_sync_locked() of a PUT that names its parent (NULL: none) [parent-cells]. */
int kvbc_sync_parent_locked(struct kvb_client *c, struct kvb_sqe *sqe, const kvb_key *parent,
			    struct kvb_cqe *cqe);
/* ring.c: bytes of the arg area, from its start, that LOOKUP may use [parent-cells]. */
uint32_t kvbc_lookup_room(const struct kvb_client *c);
/* Remembers a created view (msg copied); -ENOMEM. */
int kvbc_view_add(struct kvb_client *c, uint32_t bid, uint16_t type, const void *msg, uint32_t len,
		  uint32_t *id);
void kvbc_view_del(struct kvb_client *c, uint32_t id);
/* A lease of a broker we are no longer attached to: released here only. 1 if it was one. */
int kvbc_lease_retired(struct kvb_client *c, const void *data, uint64_t id);
/* conn.c [RECONNECT]: an async RELEASE of lease id of a broker that went: 1, released here. */
int kvbc_old_release(struct kvb_client *c, uint64_t id);
/* ops.c [release-post]: whether id is a lease of the current broker we noted. */
int kvbc_lease_held(const struct kvb_client *c, uint64_t id);

/* conn.c / ctl.c: the control channel. */
struct kvbc_reply {
	void *msg;	  /* the whole datagram (malloc'd) */
	const void *body; /* after kvb_msg_hdr + kvb_msg_reply */
	size_t body_len;
	int32_t res;
	int nfds;
	int fds[KVB_MAX_FDS]; /* set an entry to -1 to keep it from kvbc_reply_free() */
};

int kvbc_ctl(struct kvb_client *c, uint16_t type, const void *body, size_t body_len, int send_fd,
	     struct kvbc_reply *r);
void kvbc_reply_free(struct kvbc_reply *r);
/* Copies the first len bytes of a reply body into dst; -EPROTO when the body is shorter. */
int kvbc_reply_body(const struct kvbc_reply *r, void *dst, size_t len);
void kvbc_close_fds(const int *fds, int n);
/* conn.c: the broker revoked the session (KVB_SQ_REVOKED): the pool becomes PROT_NONE. */
void kvbc_pool_revoke(struct kvb_client *c);

/* ring.c: slots, submission and completion. */
int kvbc_ring_setup(struct kvb_client *c);
void kvbc_ring_teardown(struct kvb_client *c);
int kvbc_sync_locked(struct kvb_client *c, struct kvb_sqe *sqe, struct kvb_cqe *cqe);
/*
 * kvbc_sync_locked() in parts, for a call that works while its op runs (a filled PUT): posts
 * sqe (naming parent, or NULL) and returns its slot (or a negative errno);
 * kvbc_sync_done_locked() says whether its CQE
 * came, draining what is there without waiting; kvbc_wait_sync_locked() waits for it and frees
 * the slot (as kvbc_sync_locked() returns).
 */
int kvbc_post_sync_locked(struct kvb_client *c, struct kvb_sqe *sqe, const kvb_key *parent);
int kvbc_sync_done_locked(struct kvb_client *c, uint32_t idx);
/* KVB_SQEF_FILL: publishes bytes in the fill word, waking a broker that went to sleep. */
void kvbc_fill_publish_locked(struct kvb_client *c, uint32_t bytes);
int kvbc_wait_sync_locked(struct kvb_client *c, uint32_t idx, struct kvb_cqe *cqe);
/* Tells the broker of a [dir] read or a RELEASE of a lease we hold, with no wait for it: through
 * the note ring (ring.c [notes]), or posted on the SQ without a doorbell ([dir-note]). */
int kvbc_note_locked(struct kvb_client *c, struct kvb_sqe *sqe);
/* ops.c [dir]: tells the broker of a read of (ns, key) through the directory (a note). */
void kvbc_dir_read_note(struct kvb_client *c, uint32_t ns, const kvb_key *key);
/*
 * [dir] From this size a page goes through the directory into a buffer of ours only by the
 * namespace's self_get rule (or, kvb_get(), into the previous GET's destination).
 */
#define KVBC_DIR_GET_BUF_MAX (1ull << 20)
/*
 * vread.c [vdir]: a view GET served from the pool map by our own copy, in two steps:
 * kvbc_view_dir_find() says whether the op is ours to copy (1: the page is listed, the view has
 * a plan, slot and layers are ones the broker takes) and fills r; kvbc_view_dir_copy() copies
 * and answers the page's bytes (what the broker's GET answers), or 0 when the entry changed
 * meanwhile: the broker must serve it then (the buffers may hold anything).
 */
struct kvbc_vread {
	const struct kvbc_vplan *p;
	const struct kvb_dir_ent *e;
	const uint8_t *page;
	uint64_t slot, total;
	uint32_t seq, lfirst, lend, page_bytes;
};
int kvbc_view_dir_find(struct kvb_client *c, uint32_t view, const kvb_key *key, uint64_t slot,
		       uint32_t lfirst, uint32_t lcount, struct kvbc_vread *r);
int kvbc_view_dir_copy(struct kvb_client *c, const kvb_key *key, const struct kvbc_vread *r);
void kvbc_vplan_free(struct kvbc_view *v);
int kvbc_lease_map(const struct kvb_client *c, uint64_t loc, uint64_t len, const void **data);

/* ops.c */
const struct kvbc_ns *kvbc_ns_find(const struct kvb_client *c, uint32_t ns);

/* buf.c */
struct kvbc_buf *kvbc_buf_find(struct kvb_client *c, const void *p, size_t len);

/*
 * Whether reads of ours through the pool directory may answer now ([dir], [hazard], [vdir]):
 * there is one, the session was not revoked (its pool is no longer ours to read, conn.c
 * kvbc_pool_revoke), and no async DELETE or PUT of ours is in flight, which the broker runs
 * first (the page may go, the destination may be a PUT's source: ring.c submit_local).
 */
static inline int kvbc_dir_readable(const struct kvb_client *c)
{
	return c->dir && !c->nmut_async && !(kvb_load_acquire(c->sq.flags) & KVB_SQ_REVOKED);
}

/*
 * Whether the library may write host buffer b itself, as the broker would ([dir], [vdir]): a
 * mapping of its own, or the caller's mapping of a registered file that buf.c checked; not one
 * lost in a reconnect, whose ops the broker fails -EBADF.
 */
static inline int kvbc_buf_direct(const struct kvbc_buf *b)
{
	return b->addr && !b->gpu && (!b->foreign || b->mapped) && b->bid != UINT32_MAX;
}

/*
 * [RECONNECT] Registers GPU buffer b with the broker just re-attached to (cuda.c): exported
 * again from its device pointer. 0 when done or when the buffer is lost (b->bid = UINT32_MAX:
 * its ops fail -EBADF), a negative errno when the connection failed meanwhile.
 */
int kvbc_gpu_again(struct kvb_client *c, struct kvbc_buf *b);
/* [RECONNECT] Whether err of a control call is the connection's (else it is the broker's no). */
static inline int kvbc_transport_err(int err)
{
	return err == -EPIPE || err == -ECONNRESET || err == -ETIMEDOUT || err == -EPROTO ||
	       err == -ENOTCONN || err == -ESHUTDOWN;
}
int kvbc_buf_alloc_locked(struct kvb_client *c, size_t len, struct kvbc_buf *b);
void kvbc_buf_free_all(struct kvb_client *c);
int kvbc_staging_locked(struct kvb_client *c, size_t len);

/* -errno of the call that just failed; never 0, so a failure can never read as success. */
static inline int kvbc_errno(void)
{
	return errno > 0 ? -errno : -EIO;
}

/*
 * Entry and exit of every public call that uses the rings: takes the lock and refuses
 * control-only and broken clients. Returns 0 with the lock held, or a negative errno without.
 */
int kvbc_enter(struct kvb_client *c);
int kvbc_enter_ctl(struct kvb_client *c);
/* kvbc_enter(), and with nothing in flight a broker that hung up is reconnected to first. */
int kvbc_enter_live(struct kvb_client *c);
/* Unlocks; first wakes the poller if this call took a wake-up meant for it (ring.c). */
void kvbc_kick_poller(struct kvb_client *c);
static inline void kvbc_leave(struct kvb_client *c)
{
	if (c->kick_poller)
		kvbc_kick_poller(c);
	pthread_mutex_unlock(&c->lock);
}

#endif /* KVB_CLIENT_INTERNAL_H */
