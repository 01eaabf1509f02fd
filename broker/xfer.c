// SPDX-License-Identifier: MIT
/*
 * xfer.c - an op's page copy (PUT into the pool, GET out of it) as a copy-engine job.
 *
 * The job lives in the op (struct op, ops.h), its segments too (op->seg1, or the view op's
 * list), so nothing is copied or allocated here. The engine either runs it at once (COPY_DONE:
 * the op completes in its run, its CQE goes out with the batch) or queues it (the op returns
 * OPS_DEFERRED and holds its CQ slot); a queued job ends in xfer_done() on the loop thread,
 * which commits or aborts the PUT's page or unpins the GET's and completes the op
 * (ops_complete: counted, CQE posted).
 *
 * Page states during a PUT: store_alloc makes the page WRITING with the writer's pin; only
 * xfer_finish moves it on, to READY (copy ok) or FREE (copy failed). Either way store.c wakes
 * whoever waits on the page (ops parked on pg->waiters: PUTs of the same key, ops.c), which
 * then run again: they find it READY (EXISTED, nothing copied: one device-to-host copy for
 * eight TP ranks) or gone (the first becomes the new writer). A WRITING page is never served
 * (GET and LOOKUP see a miss), never evicted, and its buffers stay mapped: the session keeps
 * every buffer until its last op completed, even when the client died or unregistered the
 * buffer meanwhile (session.c, sbuf.closing).
 *
 * Loop thread only (the engines' workers never call in here).
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "broker.h"
#include "clock.h"
#include "copy_cuda.h"
#include "crccopy.h"
#include "fastcopy.h"
#include "log.h"
#include "slot.h"

#define OPS_HOLD_SEGS 64 /* more segments: no loop_hold() for the job */

/* The copy ended with op->job.res: move the page on and set the op's result. */
static void xfer_finish(struct broker *b, struct op *op)
{
	int32_t res = op->job.res;
	struct page *pg = op->pg;

	op->pg = NULL;
	if (op->job.dir == COPY_TO_POOL) {
		if (!res) {
			/* Wakes the PUTs that waited for it. [crc-worker] */
			store_commit_crc(&b->store, pg, op->job.has_crc ? &op->job.crc : NULL);
			op->bytes_in = op->n->page_bytes;
			remote_on_put(b, op->n, pg); /* still READY here: nothing ran since */
		} else {
			store_abort(&b->store, pg);
		}
	} else {
		store_unpin(&b->store, pg);
		if (!res) {
			res = (int32_t)op->n->page_bytes;
			op->bytes_out = op->n->page_bytes;
		}
	}
	if (res < 0)
		b->xs.errors++;
	op->cqe.res = res;
}

static void xfer_done(struct copy_job *job)
{
	struct op *op = (struct op *)(void *)((char *)job - offsetof(struct op, job));
	struct broker *b = op->b;

	if (op->copy_yield)
		b->copy_yield--;

	xfer_finish(b, op);
	ops_complete(b, op);
}

/*
 * [crc-src] The checksum of a PUT's slot (pagehdr, for a restart) taken from what it was
 * copied from, right after the copy, into op->job.crc: the source is in the cache then,
 * where the slot written with streaming stores (fastcopy.h [nt-fresh]) is not, and reading
 * it back from DRAM cost more than the copy's saving. Where the CPU has VPCLMULQDQ the copy
 * computes it itself ([crc-fused], crccopy.c: the engine's inline run, a filled PUT's
 * chunks), from the bytes it stored, in about the copy's time; this is what is left for
 * other CPUs. A source changed under the copy (a client writing its own buffer meanwhile)
 * leaves a checksum that does not match the slot: the page is then dropped as torn at a
 * restart, the same as a copy cut short, and that client's own page is all it can lose. The
 * slot's bytes past the page (a larger class's slot) are read from the slot (slot_tail_crc).
 */
static uint32_t slot_tail_crc(const struct broker *b, const struct op *op, uint32_t crc)
{
	uint64_t page = op->n->page_bytes, slot = b->store.cls[op->pg->cls].slot_bytes;

	if (slot > page)
		crc = slot_crc32c_more(crc, (const uint8_t *)store_addr(&b->store, op->pg) + page,
				       (size_t)(slot - page));
	return crc;
}

/* [crc-src] An inline PUT's copy of one plain host segment that the engine did not checksum
 * as it copied: its checksum from the source. */
static void src_crc(struct broker *b, struct op *op)
{
	if (op->job.dir != COPY_TO_POOL || op->dev != COPY_HOST || !b->pool.meta || !op->pg ||
	    op->segs || op->fds || op->job.has_crc)
		return;
	op->job.crc = slot_tail_crc(b, op, slot_crc32c(op->seg1.src, op->seg1.len));
	op->job.has_crc = 1;
}

static void commit_later(struct broker *b, struct op *op);

int xfer_start(struct broker *b, struct op *op, uint32_t dir)
{
	struct copy_engine *e = op->dev == COPY_HOST ? b->copy : b->gpu;
	int r;

	op->job = (struct copy_job){.done = xfer_done,
				    .dev = op->dev,
				    .dir = dir,
				    .nsegs = op->segs ? op->nsegs : 1,
				    .segs = op->segs ? op->segs : &op->seg1,
				    .bytes = op->segs ? op->seg_bytes : op->seg1.len};
	/*
	 * [seg-list] A view op's bytes were summed as its steps built the segments, and a view
	 * PUT's segments fill its page in order by construction (parts lie in the page in order,
	 * ns.c): a pass over a million segments here, and another in copy_job_tiles(), held the
	 * loop for 1-2 ms after the op's last step.
	 */
	if (op->segs && dir == COPY_TO_POOL)
		op->job.tiled = op->n->page_bytes;
	/*
	 * [batch-queue] More ops of this client's batch wait behind it: its big copies go to the
	 * workers (split, side by side) while the loop takes the next SQEs (copy.h).
	 */
	op->job.batch = op->batch;
	/*
	 * [crc-worker] A host worker that writes the slot checksums it too (copy.h); [gpu-crc] the
	 * GPU checksums what it sends (copy_cuda.c).
	 */
	if (dir == COPY_TO_POOL && b->pool.meta && op->pg) {
		op->job.crc_at = store_addr(&b->store, op->pg);
		op->job.crc_len = b->store.cls[op->pg->cls].slot_bytes;
	}
	/* [cqe-first] Only where session_poll will commit it (late_ok), into a host slot. */
	op->job.unfenced = b->late_ok && dir == COPY_TO_POOL && op->dev == COPY_HOST && !op->segs &&
			   !op->s->nfdbufs && op->pg;
	/* KVB_BUF_FDCOPY buffers: each segment's file side, kept with the op (fdcopy.c). */
	if (op->dev == COPY_HOST && op->s->nfdbufs) {
		op->fds = malloc((size_t)op->job.nsegs * sizeof(*op->fds));
		if (!op->fds) {
			op->job.res = -ENOMEM;
			xfer_finish(b, op);
			return OPS_DONE;
		}
		fdcopy_resolve(op->s, &op->job, op->fds);
	}
	/* A GPU buffer only exists while its engine does (ctl.c buf_reg_gpu): e is never NULL here. */
	r = e ? e->submit(e, &op->job) : -ENODEV;
	if (r == COPY_QUEUED) {
		b->xs.queued_jobs++;
		/*
		 * Its completion comes back soon: stay up for it, unless it is a job of many small
		 * segments (a view), whose time is not its bytes and which needs the CPU we would
		 * poll on (t_fairness's view flood).
		 */
		if (op->job.nsegs <= OPS_HOLD_SEGS) {
			loop_hold_bytes(&b->loop, op->job.bytes);
			/* [copy-yield] */
			op->copy_yield = op->dev == COPY_HOST;
			b->copy_yield += op->copy_yield;
		}
		op->waits = op->dev == COPY_HOST ? "a host copy" : "a GPU copy";
		return OPS_DEFERRED;
	}
	if (r < 0) {
		op->job.res = r;
	} else {
		b->xs.inline_jobs++;
		src_crc(b, op);
		/* Fair rounds: a copy on the loop thread is work of this turn (ops.h). */
		op->work += op->job.bytes / OPS_WORK_BYTES + op->job.nsegs;
		if (op->job.unfenced && !op->job.res) {
			commit_later(b, op);
			return OPS_DONE;
		}
	}
	xfer_finish(b, op);
	return OPS_DONE;
}

/*
 * [cqe-first] A 64 KiB PUT's copy ends with a store fence that waits for its streaming stores
 * to reach memory (400-600 cycles here), then the commit: the directory entry, READY, waiters.
 * Its client needs neither: only to know that its source was read, which every load of the
 * copy, retired before the CQE's store, says. Readers of the page do need both, and every
 * reader finds the page through the directory or an op of ours, which session_poll runs only
 * after xfer_commit_late. So an inline PUT into a host slot from session_poll, and a filled
 * PUT's last step from its session's turn (ops_run_yielded), seal the slot's header (below),
 * post the CQE, and only then fence and commit: a 64 KiB PUT from plain memory p50 5.95 ->
 * 5.73 us (docs/benchmarks.md, run 35).
 */
static void commit_later(struct broker *b, struct op *op)
{
	xfer_commit_late(b); /* one at a time: none is pending here */
	/*
	 * The header before the CQE, though: a PUT that completed must survive a kill -9 right
	 * after (test_restart.py: test_reconnect_off lost its page now and then). Its store may
	 * overtake the unfenced copy's; only a broker adopting the pool reads it, once we are
	 * gone and the copy's stores with us (the core drains them at the kill's interrupt).
	 */
	store_seal(&b->store, op->pg, op->job.has_crc ? &op->job.crc : NULL);
	b->late.pg = op->pg;
	b->late.n = op->n;
	op->pg = NULL;
	op->bytes_in = op->n->page_bytes;
	op->cqe.res = 0;
}

void xfer_commit_late(struct broker *b)
{
	struct page *pg = b->late.pg;

	if (!pg)
		return;
	b->late.pg = NULL;
	crc_copy_fence();
	store_commit_sealed(&b->store, pg);
	remote_on_put(b, b->late.n, pg);
}

/*
 * [fill] A filled PUT (KVB_SQEF_FILL, wire.h): the client copies its page into its staging
 * buffer while we copy it out, so the page costs about one copy's time rather than two. Each
 * step copies what the fill word says is in place ([F1]: its load-acquire pairs with the
 * client's store-release after the bytes), at most FILL_STEP bytes (about a turn of work:
 * fair rounds), then yields; a step that found nothing new counts no work, so the loop idles
 * between steps, and sleeps at once while the client fills on its own CPU (the spinning hints:
 * a sched_yield gave the client the CPU only until the scheduler picked the loop again, and
 * half the runs of Kimi pages took 1.2 ms instead of 0.3; the client's next chunk rings), and no
 * hold keeps it up past the poll window: a client descheduled mid-fill finds the loop asleep
 * and rings its doorbell, rather than a broker spinning for milliseconds against the CPUs
 * that client needs (on a loaded 2-vCPU machine, a spinning loop also loses its share and
 * then waits for a whole time slice when the bytes come). The page
 * stays WRITING (never served, never evicted) until every byte was copied, then is committed
 * as a copied PUT is, after its CQE where its session's turn runs the last step ([cqe-first]).
 * The client dying parks nothing: its op is on its yield queue, cancelled
 * with the session (ops_session_dead: the page is aborted). A fill that stops moving for
 * FILL_GIVE_UP ends in -EAGAIN and the page is aborted; the client sends a plain PUT then.
 */
#define FILL_STEP (1ull << 20)
#define FILL_GIVE_UP 0.1 /* seconds: a client descheduled that long on a loaded machine */

/* The fill word, [F1] acquire, noted for a sleep (it needs it moved on to wake early). */
static uint64_t fill_word(struct session *s, uint64_t len)
{
	uint64_t f = kvb_load_acquire(s->fill);

	s->fill_seen = (uint32_t)f;
	return f < len ? f : len; /* a client's word: what lies past the page is not ours to read */
}

int xfer_fill(struct broker *b, struct op *op)
{
	struct session *s = op->s;
	uint64_t len = op->seg1.len, f = fill_word(s, len);
	double now = clock_now();

	if (!op->fill_at) {
		op->fill_at = now;
		b->xs.fill_puts++;
	}
	if (f <= op->filled) {
		if (now - op->fill_at > FILL_GIVE_UP) {
			b->xs.fill_gaveup++;
			store_abort(&b->store, op->pg);
			op->pg = NULL;
			op->cqe.res = -EAGAIN;
			return OPS_DONE;
		}
		b->xs.fill_waits++;
		op->work = 0;
		return ops_park(b, op, &s->yieldq, "its source being filled");
	}
	/*
	 * What the client published while we copied is copied in the same turn, up to
	 * FILL_STEP: going round the loop between its chunks cost 0.3-0.5 us each (64 KiB).
	 */
	for (uint64_t step = 0; f > op->filled && step < FILL_STEP; f = fill_word(s, len)) {
		uint64_t n = f - op->filled < FILL_STEP - step ? f - op->filled : FILL_STEP - step;
		uint8_t *dst = (uint8_t *)op->seg1.dst + op->filled;
		const uint8_t *src = (const uint8_t *)op->seg1.src + op->filled;

		int last = op->filled + n == len, late = last && b->late_ok && b->pool.meta;

		/*
		 * The slot is fresh and read by nobody soon: streaming stores at any chunk size,
		 * checksummed chunk by chunk as they are copied ([crc-fused], or [crc-src] from
		 * the source in the cache where the CPU cannot). Unfenced: one fence before the
		 * commit orders every chunk's stores ([cqe-first]: after the CQE); a fence per
		 * chunk took a 64 KiB PUT from plain memory from p50 5.95 to 6.15 us
		 * (docs/benchmarks.md, run 36).
		 */
		if (b->pool.meta)
			op->job.crc = crc_copy_unfenced(dst, src, (size_t)n, op->job.crc);
		else
			kvb_copy_nt(dst, src, (size_t)n);
		if (b->pool.meta && last)
			op->job.crc = slot_tail_crc(b, op, op->job.crc);
		op->filled += (uint32_t)n;
		op->work += n / OPS_WORK_BYTES;
		b->xs.fill_bytes += n;
		step += n;
		if (last) {
			op->job.dir = COPY_TO_POOL;
			op->job.res = 0;
			op->job.has_crc = b->pool.meta != NULL;
			if (late) {
				commit_later(b, op);
			} else {
				if (b->pool.meta) /* kvb_copy_nt fenced its own chunks */
					crc_copy_fence();
				xfer_finish(b, op); /* committed, counted, as a copied PUT */
			}
			return OPS_DONE;
		}
	}
	op->fill_at = clock_now(); /* the give-up counts from the end of our copy, not its start */
	return ops_park(b, op, &s->yieldq, "its source being filled");
}

uint32_t xfer_poll(struct broker *b)
{
	uint32_t n = b->copy->poll(b->copy);

	if (b->gpu)
		n += b->gpu->poll(b->gpu);
	return n;
}

uint32_t xfer_event(struct broker *b)
{
	struct copy_engine *e[2] = {b->copy, b->gpu};
	uint64_t v;

	for (int i = 0; i < 2; i++)
		if (e[i] && e[i]->efd >= 0 && read(e[i]->efd, &v, sizeof(v)) < 0) {
			/* EAGAIN: the other engine rang */
		}
	return xfer_poll(b);
}

void xfer_arm(struct broker *b)
{
	struct copy_engine *e[2] = {b->copy, b->gpu};

	for (int i = 0; i < 2; i++)
		if (e[i] && e[i]->inflight && e[i]->arm)
			e[i]->arm(e[i]);
}

static void on_copy(void *arg)
{
	xfer_event(arg); /* a completion eventfd: what finished completes its ops */
}

static int ep_add_copy(struct broker *b, const struct copy_engine *e, struct loop_fd *h)
{
	if (e->efd < 0)
		return 0;
	*h = (struct loop_fd){.fn = on_copy, .arg = b};
	return loop_add(&b->loop, e->efd, h);
}

/*
 * [copy-yield] While a page copy runs on a host worker, the loop's idle rounds (it holds on
 * for the completion, loop_hold) yield the CPU, where the machine has fewer CPUs than the
 * workers, the loop and a client spinning on its CQ: on two vCPUs those three spun against
 * each other, and the worker (nice 5) lost, so a 4.29 MiB Kimi GET ran at 0.4-0.5x memcpy
 * against 1.0-1.45x yielding (docs/benchmarks.md). Not for views' many-segment jobs: their
 * floods would make every idle round a yield (t_fairness). A yield with nothing else runnable
 * on the CPU returns at once.
 */
static int copy_yield_wanted(const struct broker *b)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);

	return cpus > 0 && cpus < (long)b->cfg.copy_threads + 2;
}

/* [slab-pin] The store's hooks: a sparse pool's slabs registered with the GPU engine. */
static int slab_pin(void *arg, void *base, uint64_t len)
{
	return copy_cuda_pin(((struct broker *)arg)->gpu, base, len);
}

static void slab_unpin(void *arg, void *base, uint64_t len)
{
	(void)copy_cuda_unpin(((struct broker *)arg)->gpu, base, len); /* logs what it refuses */
}

int xfer_init(struct broker *b)
{
	int err;

	b->copy_yield_on = copy_yield_wanted(b);

	b->copy = copy_host_create(b->cfg.copy_threads, b->cfg.copy_inline);
	if (!b->copy)
		return -ENOMEM;
	if (b->cfg.copy_delay_us || b->cfg.copy_fail_every)
		copy_host_test(b->copy, b->cfg.copy_delay_us, b->cfg.copy_fail_every);
	err = ep_add_copy(b, b->copy, &b->on_copy[0]);
	if (err)
		return err;
	if (b->cfg.gpu)
		b->gpu = copy_cuda_open(b);
	else
		log_info("GPU copies off: --no-gpu");
	/*
	 * [slab-pin] A sparse pool (--tenants) lends its memory slab by slab: registering it
	 * whole would pin every partition, each as large as the pool. Its slabs are registered
	 * one by one instead, the adopted ones now, the others as the store makes them.
	 */
	if (b->gpu && b->pool.sparse) {
		err = store_pin_hooks(&b->store, slab_pin, slab_unpin, b);
		if (err) {
			log_warn("GPU copies off: the GPU driver would not register the slabs "
				 "adopted from the kept pool (%s): GPU buffers are refused "
				 "(-ENODEV) "
				 "until a restart with more pinnable memory (ulimit -l)",
				 strerror(-err));
			b->gpu->destroy(b->gpu);
			b->gpu = NULL;
		}
	}
	return b->gpu ? ep_add_copy(b, b->gpu, &b->on_copy[1]) : 0;
}

void xfer_fini(struct broker *b)
{
	/* [slab-pin] No slab registered from here on; the engine unregisters what is. */
	b->store.pin = NULL;
	b->store.unpin = NULL;
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
	cJSON_AddNumberToObject(o, "fill_puts", (double)b->xs.fill_puts);
	cJSON_AddNumberToObject(o, "fill_existed", (double)b->xs.fill_existed);
	cJSON_AddNumberToObject(o, "fill_bytes", (double)b->xs.fill_bytes);
	cJSON_AddNumberToObject(o, "fill_waits", (double)b->xs.fill_waits);
	cJSON_AddNumberToObject(o, "fill_gaveup", (double)b->xs.fill_gaveup);
	cJSON_AddItemToObject(o, "gpu", copy_cuda_stats_json(b));
	return o;
}
