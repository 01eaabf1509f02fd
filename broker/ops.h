/* SPDX-License-Identifier: MIT */
/*
 * ops.h - the request engine: one struct op per SQE, from the ring to its counted completion.
 * See ops.c for the life cycle. Loop thread only.
 */
#ifndef KVB_BROKER_OPS_H
#define KVB_BROKER_OPS_H

#include <stdint.h>

#include "copy.h"
#include "kvbroker.h"
#include "list.h"
#include "wire.h"

struct broker;
struct session;
struct ns;
struct page;
struct sview;
struct remote_lq;
struct remote_call;

/* What an op's run returned: complete now (cqe filled), or it completes later. */
enum { OPS_DONE = 0, OPS_DEFERRED = 1 };

/* A list of parked ops; whoever owns it wakes it when what they wait for happened. */
struct waitq {
	struct list ops;
};

/*
 * One request. Decoded once from its SQE (a private copy: the key, the resolved namespace or
 * view). On the heap from the ring to its completion, on its session's list (slink) all along,
 * and on at most one wait list (link): a waitq (parked), the run queue (woken, about to run
 * again) or its session's yield queue; on none while it runs or a copy engine holds it.
 */
struct op {
	struct list link;  /* a waitq, the run queue, or its session's yield queue */
	struct list slink; /* its session's ops in flight */
	struct broker *b;
	struct session *s;
	struct ns *n;	    /* the SQE's namespace or the view's; NULL: -EBADF */
	struct sview *v;    /* KVB_OPF_VIEW: held (v->refs) until the op completes */
	struct kvb_sqe sqe; /* the private copy; sqe.key is never read again, key is */
	struct kvb_cqe cqe;
	kvb_key key;
	kvb_key parent;	    /* [chain] PUT with KVB_OPF_PARENT: read once from the arg area */
	const char *waits;  /* what it is parked on (drain log), NULL while it runs */
	double since;	    /* taken from the SQ (drain log) */
	double t0;	    /* [hist] taken from the SQ, for its latency; 0: not timed */
	struct page *pg;    /* the page a PUT writes or a GET copies from, while it is held */
	int32_t dev;	    /* COPY_HOST or the CUDA device of the client side */
	uint8_t parked;	    /* on a waitq, the run queue or its session's yield queue */
	uint8_t batch;	    /* its client's SQ held more SQEs behind it (xfer.c [batch-queue]) */
	uint8_t as_get;	    /* ACQUIRE/RELEASE of a kvb_get() (KVB_SQEF_GET): counted as its GET */
	uint8_t note;	    /* from the note ring (ops_note) */
	int8_t hit;	    /* 1 found, 0 missed, -1 no lookup (counted at completion) */
	uint8_t dedup;	    /* PUT: the key was stored */
	uint8_t remote;	    /* the remote tier was asked (once per op: remote.c) */
	uint8_t disk;	    /* [hist] the disk tier holds it: a hit is a promotion (tier.c) */
	uint8_t fill;	    /* KVB_SQEF_FILL: a PUT whose source is filled while it runs */
	uint8_t copy_yield; /* counted in b->copy_yield while its copy is queued */
	uint8_t fill_stopped;	   /* the client was told to stop filling (fill-stop word) */
	uint32_t fill_seq;	   /* its number among the session's filled PUTs (wire.h) */
	uint32_t filled;	   /* bytes of it copied into the page so far */
	double fill_at;		   /* when the fill word last moved on (or the copy began) */
	struct remote_lq *rlq;	   /* LOOKUP: its questions to the remote tier, while asked */
	struct remote_call *rcall; /* GET: the fetch landing in its destination too (remote.c) */
	uint8_t rfilled;	   /* GET: that fetch checked and committed: dst holds the page */
	/* resumable work: LOOKUP keys done, or view (part, token) pairs whose segments are built */
	uint32_t cursor, lead;
	uint8_t leading;
	uint64_t bytes_in, bytes_out; /* page bytes moved, counted at completion */
	uint64_t work;		      /* work units of its last step (fair rounds) */
	struct copy_seg seg1;	      /* a plain op's one segment */
	struct copy_seg *segs;	      /* view ops: nsegs built so far ([seg-list], ops.c) */
	uint32_t nsegs, segs_cap;
	uint8_t segs_mapped;	/* segs is a mapping of its own, not the heap's */
	uint64_t seg_bytes;	/* the bytes of segs, summed as they are built */
	struct copy_fdseg *fds; /* KVB_BUF_FDCOPY: the file side of each segment (xfer.c) */
	struct copy_job job;	/* its copy, while an engine runs it */
};

/*
 * Work units (fair rounds): an op costs 1, plus one per key looked up and per segment built,
 * plus one per segment and per OPS_WORK_BYTES bytes copied inline; a unit is ~50 ns of loop
 * time on these machines. A session gets OPS_ROUND_WORK per loop round (about 200 us); long
 * ops (a LOOKUP of many keys, a view op of many segments) run in steps of about OPS_STEP_WORK
 * and yield between them, so that no client holds the loop for more than that. Whatever else
 * a step does on the loop must stay within its units too: a segment list is never copied or
 * freed whole there (ops.c [seg-list]); STATS loop_stretch_* shows the loop's longest runs.
 */
#define OPS_WORK_BYTES 256u
#define OPS_ROUND_WORK 4096u
#define OPS_STEP_WORK 2048u

/* [seg-list] A segment list mapped for view ops of many segments, idle (ops.c). */
struct seg_map {
	struct copy_seg *at;
	uint32_t cap; /* entries */
};
#define OPS_SEG_CACHE 4

/* The loop: initialises the run queue. */
void ops_init(struct broker *b);
/* At exit: frees the ops and segment lists kept for reuse ([op-cache], [seg-list], ops.c). */
void ops_fini(struct broker *b);
/* After each epoll batch: segment lists idle for a second go back to the system. */
void ops_tick(struct broker *b, double now);
/* [ns-free] A session that had namespace id open is gone (its last op completed). */
void ops_ns_close(struct broker *b, uint32_t id);

/*
 * session.c: runs one SQE copied out of the ring. Returns OPS_DONE with *cqe filled (counted),
 * or OPS_DEFERRED: the op holds a CQ slot and ends with session_complete(). *work gets what it
 * cost.
 */
int ops_submit(struct broker *b, struct session *s, const struct kvb_sqe *sqe, struct kvb_cqe *cqe,
	       uint64_t *work);

/*
 * [told] An op the client tells afterwards: a read it made through the pool directory (GET with
 * KVB_SQEF_GET) or a lease of its hazard table (ACQUIRE or RELEASE with KVB_SQEF_HELD). On the
 * SQ, where a full note ring sends it (and, for the same reason, an async RELEASE of a hazard
 * lease the library could not answer itself), it is answered in the round that reads it, and
 * it is no work that keeps the loop polling afterwards, nor holds it for a copy: the client
 * needs nothing more of us. An SQE of that shape that kvb_sqe_check refuses counts too; it is
 * answered all the same.
 */
static inline int ops_told(const struct kvb_sqe *sqe)
{
	return (sqe->opcode == KVB_OP_GET && (sqe->flags & KVB_SQEF_GET)) ||
	       ((sqe->opcode == KVB_OP_ACQUIRE || sqe->opcode == KVB_OP_RELEASE) &&
		(sqe->flags & KVB_SQEF_HELD));
}

/*
 * session.c [notes]: runs one entry of a session's note ring (wire.h KVB_FEAT_NOTES): a read
 * through the pool directory (a GET with KVB_SQEF_GET) or a RELEASE, as on the SQ but with no
 * CQE and no hold of the loop. -EPROTO for anything else, or a RELEASE of no lease of ours;
 * -ENOMEM: not run, to be run again later.
 */
int ops_note(struct broker *b, struct session *s, const struct kvb_sqe *sqe);

/* The page bytes a session of partition part may hold in leases (--max-lease-bytes), 0 none. */
uint64_t ops_lease_limit(const struct broker *b, uint32_t part);

/* session.c: runs the session's yielded ops, up to budget work units; returns units spent. */
uint64_t ops_run_yielded(struct broker *b, struct session *s, uint64_t budget);

/* The loop: runs every woken op again (the one resume path). Returns how many ran. */
uint32_t ops_poll(struct broker *b);

/* Parks op on q (what: for the drain log); returns OPS_DEFERRED. */
int ops_park(struct broker *b, struct op *op, struct waitq *q, const char *what);

/* Parks op until page pg changes state (committed, aborted, freed); returns OPS_DEFERRED. */
int ops_park_page(struct broker *b, struct op *op, struct page *pg, const char *what);

/* Moves every op of q to the run queue: they run again at the loop's next ops_poll(). */
void ops_wake(struct broker *b, struct waitq *q);

/* store.c's hook: page pg changed state; its waiters run again. */
void ops_page_changed(void *arg, struct page *pg);

/* xfer.c: a copy of a heap op finished (op->cqe.res set): completes and frees it. */
void ops_complete(struct broker *b, struct op *op);

/* session.c: its session died; its parked ops complete (cancelled) now. */
void ops_session_dead(struct broker *b, struct session *s);

/* Drops every lease a session holds (client gone). */
void ops_release_all(struct broker *b, struct session *s);

static inline void waitq_init(struct waitq *q)
{
	list_init(&q->ops);
}

#endif /* KVB_BROKER_OPS_H */
