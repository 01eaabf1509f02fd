// SPDX-License-Identifier: MIT
/*
 * xfer.c - page copies of PUT and GET as copy-engine jobs, and how their ops complete.
 *
 * A transfer is one op's copy: a heap record holding the op's CQE, the page, the session and
 * the job (its segment list copied in, since the op's scratch list is reused by the next op).
 * The engine either runs it at once (COPY_DONE: the op completes in ops_exec as before) or
 * queues it (the op returns OPS_DEFERRED and session_poll holds a CQ slot for it); a queued job
 * ends in xfer_done() on the loop thread, which commits or aborts the PUT's page or unpins the
 * GET's, and posts the CQE with session_complete().
 *
 * Page states during a PUT: store_alloc makes the page WRITING with the writer's pin; only
 * xfer_finish moves it on, to READY (copy ok) or FREE (copy failed). A WRITING page is never
 * served (GET and LOOKUP see a miss), never evicted, and its buffers stay mapped: the session
 * keeps every buffer until its last op completed, even when the client died or unregistered
 * the buffer meanwhile (session.c, sbuf.closing).
 *
 * [XFER-PARK] A PUT of a key another PUT is still writing (eight TP ranks storing the same MLA
 * page at once) waits, parked on b->parked, for that writer: when the writer commits, every
 * waiter completes with EXISTED and copies nothing (one device-to-host copy for eight ranks);
 * when it fails, each waiter is re-run from its saved SQE, so the first becomes the new writer
 * and the others park on it (or, if the waiter's client died, it is dropped). Completing a
 * waiter with EXISTED at once instead would report a page stored that may never be; waiting
 * costs nothing but a CQ slot, which the waiter holds anyway. Parked PUTs are few (at most one
 * per client SQE in flight), so the list is scanned.
 *
 * Loop thread only (the engines' workers never call in here).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "broker.h"
#include "copy_cuda.h"
#include "log.h"

struct xfer {
	struct broker *b;
	struct session *s;
	struct ns *n;
	struct page *pg;     /* the page copied (PUT: WRITING; GET: pinned), or parked on */
	struct list link;    /* parked: on b->parked */
	struct kvb_sqe sqe;  /* parked: the PUT, re-run when its writer fails */
	struct kvb_cqe cqe;  /* what the op completes with */
	struct copy_job job; /* segs follow the record */
};

void xfer_existed(struct broker *b, struct ns *n, struct kvb_cqe *cqe)
{
	b->ctr.dedup++;
	n->c.dedup++;
	cqe->flags |= KVB_CQEF_EXISTED;
}

/* Completes the PUTs parked on pg, whose writer just committed (stored) or failed. */
static void wake_parked(struct broker *b, struct page *pg, int stored)
{
	struct list mine, *pos, *tmp;

	list_init(&mine);
	list_for_each_safe (pos, tmp, &b->parked) {
		struct xfer *x = list_entry(pos, struct xfer, link);

		if (x->pg == pg) {
			list_del(pos);
			list_add_tail(&mine, pos);
		}
	}
	/* Detached first: a re-run may park again, on the new writer's page. */
	list_for_each_safe (pos, tmp, &mine) {
		struct xfer *x = list_entry(pos, struct xfer, link);
		struct kvb_cqe cqe;

		list_del(pos);
		if (stored) {
			xfer_existed(b, x->n, &x->cqe);
			session_complete(b, x->s, &x->cqe);
		} else if (x->s->dead) {
			x->cqe.res = -ECANCELED;
			session_complete(b, x->s, &x->cqe);
		} else if (ops_exec(b, x->s, &x->sqe, &cqe) == OPS_DONE) {
			session_complete(b, x->s, &cqe);
		}
		/* else: deferred again; that op now owes the session its completion. */
		free(x);
	}
}

int xfer_park_put(struct broker *b, struct session *s, const struct kvb_sqe *sqe, struct page *pg,
		  struct kvb_cqe *cqe)
{
	struct xfer *x = calloc(1, sizeof(*x));

	if (!x) {
		cqe->res = -ENOMEM;
		return OPS_DONE;
	}
	x->b = b;
	x->s = s;
	x->n = ns_get(&b->nst, pg->ns);
	x->pg = pg;
	x->sqe = *sqe;
	x->cqe = *cqe;
	list_add_tail(&b->parked, &x->link);
	b->xs.parked++;
	return OPS_DEFERRED;
}

/* The copy ended with x->job.res: move the page on and fill x->cqe. */
static void xfer_finish(struct xfer *x)
{
	struct broker *b = x->b;
	int32_t res = x->job.res;

	if (x->job.dir == COPY_TO_POOL) {
		if (!res) {
			store_commit(&b->store, x->pg);
			b->ctr.bytes_in += x->n->page_bytes;
		} else {
			store_abort(&b->store, x->pg);
		}
		wake_parked(b, x->pg, !res);
	} else {
		store_unpin(&b->store, x->pg);
		if (!res) {
			res = (int32_t)x->n->page_bytes;
			b->ctr.bytes_out += x->n->page_bytes;
		}
	}
	if (res < 0)
		b->xs.errors++;
	x->cqe.res = res;
}

static void xfer_done(struct copy_job *job)
{
	struct xfer *x = (struct xfer *)((char *)job - offsetof(struct xfer, job));

	xfer_finish(x);
	if (x->cqe.res < 0)
		x->b->ctr.errors++;
	session_complete(x->b, x->s, &x->cqe);
	free(x);
}

int xfer_start(struct broker *b, struct session *s, struct ns *n, struct page *pg, int32_t dev,
	       uint32_t dir, const struct copy_seg *segs, uint32_t nsegs, struct kvb_cqe *cqe)
{
	struct copy_engine *e = dev == COPY_HOST ? b->copy : b->gpu;
	/* KVB_BUF_FDCOPY buffers: room for each segment's file side after the segments. */
	size_t fdroom = dev == COPY_HOST && s->nfdbufs ? sizeof(struct copy_fdseg) : 0;
	struct xfer *x = malloc(sizeof(*x) + (size_t)nsegs * (sizeof(*segs) + fdroom));
	int r;

	if (!x) {
		/* Undo what the op did for the copy: the writer's slot, or the reader's pin. */
		if (dir == COPY_TO_POOL)
			store_abort(&b->store, pg);
		else
			store_unpin(&b->store, pg);
		cqe->res = -ENOMEM;
		return OPS_DONE;
	}
	x->b = b;
	x->s = s;
	x->n = n;
	x->pg = pg;
	x->cqe = *cqe;
	x->job = (struct copy_job){.done = xfer_done,
				   .dev = dev,
				   .dir = dir,
				   .nsegs = nsegs,
				   .segs = (struct copy_seg *)(x + 1)};
	memcpy(x->job.segs, segs, (size_t)nsegs * sizeof(*segs));
	for (uint32_t i = 0; i < nsegs; i++)
		x->job.bytes += segs[i].len;
	if (fdroom)
		fdcopy_resolve(s, &x->job, (struct copy_fdseg *)(x->job.segs + nsegs));
	/* A GPU buffer only exists while its engine does (gpu_buf_reg): e is never NULL here. */
	r = e ? e->submit(e, &x->job) : -ENODEV;
	if (r == COPY_QUEUED) {
		b->xs.queued_jobs++;
		return OPS_DEFERRED;
	}
	if (r < 0)
		x->job.res = r;
	else
		b->xs.inline_jobs++;
	xfer_finish(x);
	*cqe = x->cqe;
	free(x);
	return OPS_DONE;
}

uint32_t xfer_poll(struct broker *b)
{
	uint32_t n = b->copy->poll(b->copy);

	if (b->gpu)
		n += b->gpu->poll(b->gpu);
	return n;
}

void xfer_arm(struct broker *b)
{
	struct copy_engine *e[2] = {b->copy, b->gpu};

	for (int i = 0; i < 2; i++)
		if (e[i] && e[i]->inflight && e[i]->arm)
			e[i]->arm(e[i]);
}

static int ep_add_copy(struct broker *b, const struct copy_engine *e)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = LOOP_COPY};

	if (e->efd < 0)
		return 0;
	return epoll_ctl(b->epfd, EPOLL_CTL_ADD, e->efd, &ev) < 0 ? -errno : 0;
}

int xfer_init(struct broker *b)
{
	int err;

	list_init(&b->parked);
	b->copy = copy_host_create(b->cfg.copy_threads, b->cfg.copy_inline);
	if (!b->copy)
		return -ENOMEM;
	if (b->cfg.copy_delay_us || b->cfg.copy_fail_every)
		copy_host_test(b->copy, b->cfg.copy_delay_us, b->cfg.copy_fail_every);
	err = ep_add_copy(b, b->copy);
	if (err)
		return err;
	if (b->cfg.gpu)
		b->gpu = copy_cuda_open(b);
	else
		log_info("GPU copies off: --no-gpu");
	return b->gpu ? ep_add_copy(b, b->gpu) : 0;
}

void xfer_fini(struct broker *b)
{
	/* Each waits for its jobs: their completions go to sessions that are dead by now. */
	if (b->gpu)
		b->gpu->destroy(b->gpu);
	b->gpu = NULL;
	if (b->copy)
		b->copy->destroy(b->copy);
	b->copy = NULL;
}

cJSON *xfer_stats_json(const struct broker *b)
{
	cJSON *o = cJSON_CreateObject();
	const struct list *pos;
	uint32_t draining = 0;

	/* Dead sessions whose copies are still in flight (their buffers stay mapped). */
	list_for_each (pos, &b->graveyard)
		draining++;

	cJSON_AddStringToObject(o, "host_engine", b->copy ? b->copy->name : "none");
	cJSON_AddNumberToObject(o, "host_threads", b->cfg.copy_threads);
	cJSON_AddNumberToObject(o, "host_inline_max", (double)b->cfg.copy_inline);
	cJSON_AddNumberToObject(o, "inline_jobs", (double)b->xs.inline_jobs);
	cJSON_AddNumberToObject(o, "queued_jobs", (double)b->xs.queued_jobs);
	cJSON_AddNumberToObject(
		o, "inflight", (b->copy ? b->copy->inflight : 0) + (b->gpu ? b->gpu->inflight : 0));
	cJSON_AddNumberToObject(o, "parked_puts", (double)b->xs.parked);
	cJSON_AddNumberToObject(o, "sessions_draining", draining);
	cJSON_AddNumberToObject(o, "errors", (double)b->xs.errors);
	cJSON_AddItemToObject(o, "gpu", copy_cuda_stats_json(b));
	return o;
}
