/* SPDX-License-Identifier: MIT */
/*
 * waitq.h - a wait queue, a leaf like list.h: a list of whatever waits, and the one way a
 * tier (the RAM store, the disk, the remote tier) tells the request engine to wait. A tier
 * never parks, resumes or completes a request: asked for a page it does not have in RAM, it
 * answers "miss" (0) or "wait on this queue" (1, with a struct wait_on), and the request
 * engine (ops.c) parks the op there. When what they wait for happened, the queue's owner
 * wakes it (waitq_wake) onto the engine's run queue; the engine runs them again from its one
 * resume path and they find the page, or miss. What waits is opaque here: entries are list
 * nodes the engine embeds in its ops. Loop thread only.
 */
#ifndef KVB_BROKER_WAITQ_H
#define KVB_BROKER_WAITQ_H

#include "list.h"

struct waitq {
	struct list ops; /* the waiters, in the order they came */
};

struct page;

/*
 * A tier's answer "wait": on q, for the reason why (shown in the drain log). pg: the page q
 * belongs to, when the tier is bringing that page into RAM (a read from disk or a fetch, issued
 * or joined); NULL when it waits for something else (room in the disk queue, RAM).
 */
struct wait_on {
	struct waitq *q;
	const char *why;
	struct page *pg;
};

static inline void waitq_init(struct waitq *q)
{
	list_init(&q->ops);
}

/* Moves every waiter of q to the end of runq, in the order they came (they run from there). */
static inline void waitq_wake(struct waitq *q, struct waitq *runq)
{
	list_splice_tail(&runq->ops, &q->ops);
}

/* Answers "wait on q for why": returns 1, the answer's value. */
static inline int wait_on(struct wait_on *w, struct waitq *q, const char *why)
{
	w->q = q;
	w->why = why;
	w->pg = (struct page *)0;
	return 1;
}

/* Answers "wait on q, the queue of page pg, which is being brought into RAM": returns 1. */
static inline int wait_on_page(struct wait_on *w, struct waitq *q, struct page *pg, const char *why)
{
	wait_on(w, q, why);
	w->pg = pg;
	return 1;
}

#endif /* KVB_BROKER_WAITQ_H */
