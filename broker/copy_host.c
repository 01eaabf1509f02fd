// SPDX-License-Identifier: MIT
/*
 * copy_host.c - the host copy engine: memcpy between the pool and clients' host buffers.
 *
 * Jobs whose client side is a file (KVB_BUF_FDCOPY buffers) copy with pread/pwrite instead
 * (fdcopy.c), on the same paths, except that writes into such a file always go to a worker.
 *
 * Small jobs run inline, inside submit(), on the loop thread; larger ones go to worker threads
 * and complete through a done queue that poll() drains on the loop thread, woken by an eventfd
 * in the loop's epoll set. Why the split (measured on the 2-vCPU development machines, numbers
 * in docs/design.md "Copies"): handing a job to a sleeping worker and getting its completion
 * back costs two futex/eventfd wake-ups, ~10 us each across CPUs, while a 64 KiB memcpy takes
 * ~5-10 us; below a few MiB the hand-off costs more than it frees on the loop thread, and with
 * two vCPUs shared by the client and the broker there is no idle core for a worker anyway.
 * Above it, a worker keeps the loop serving other clients' small ops while a big page copies.
 *
 * Fan-out: eight TP ranks loading one MLA page are eight queued jobs of the same bytes. With one
 * worker they copied one after another while the ranks waited (TP=8 load p50 3.7x private
 * pools). So a queued job of two COPY_HOST_PART_MIN or more is split into parts, one per worker,
 * taken from the head of the queue in order: every worker copies the oldest job, which finishes
 * in 1/nthreads of its time and leaves first (first come, first done: the mean wait is lower
 * than each worker taking whole jobs, and no job waits for a later one). A part is bytes
 * [cur_seg/cur_off, +part_bytes) of the job's segments; the job completes when its last part
 * does, with the first error any part had.
 *
 * Threads: submit() and poll() run on the loop thread; workers touch only jobs on the pending
 * queue (their parts taken under the lock) and push them to the done queue. A job's memory
 * belongs to the workers from the moment the first takes a part until the last pushes it back;
 * its bookkeeping (cursor, running parts, res) changes only under the lock, its bytes outside
 * it, each part's by one worker. Lock order: just the one mutex.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "copy.h"
#include "crccopy.h"
#include "slot.h"
#include "fastcopy.h"
#include "log.h"

#define HOST_MAX_THREADS 64
#define WORKER_NICE 5 /* workers' nice value, relative to 0 */

struct host_engine {
	struct copy_engine e;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct copy_job *pend_head, **pend_tail; /* FIFO, workers take from the head */
	struct copy_job *done_head, **done_tail; /* FIFO, poll() takes all */
	uint64_t inline_max;
	uint32_t delay_us;   /* testing: a queued job sleeps this long first (copy_host_test) */
	uint32_t fail_every; /* testing: every n-th queued job fails with -EIO */
	uint64_t queued;     /* jobs taken by workers */
	uint32_t nthreads;
	uint32_t whole_running; /* jobs of one part being copied (see may_take) */
	int stop;
	pthread_t threads[HOST_MAX_THREADS];
};

/* 0, or -errno from a file segment (a KVB_BUF_FDCOPY buffer: fdcopy.c). */
static int run_segs(const struct copy_job *j)
{
	if (j->fds)
		return fdcopy_run(j);
	for (uint32_t i = 0; i < j->nsegs; i++)
		kvb_copy_part(j->segs[i].dst, j->segs[i].src, j->segs[i].len, j->bytes);
	return 0;
}

/* One part of a job: len bytes of its segments from segment seg, offset off. */
struct part {
	struct copy_job *j;
	uint32_t seg;
	uint64_t off, len;
};

static int run_part(const struct part *p)
{
	uint64_t left = p->len, off = p->off;

	if (p->seg == 0 && off == 0 && left == p->j->bytes)
		return run_segs(p->j); /* the whole job (the only way a job with fds runs) */
	for (uint32_t i = p->seg; left; i++, off = 0) {
		const struct copy_seg *s = &p->j->segs[i];
		uint64_t n = s->len - off < left ? s->len - off : left;

		kvb_copy_part((uint8_t *)s->dst + off, (const uint8_t *)s->src + off, n,
			      p->j->bytes);
		left -= n;
	}
	return 0;
}

/*
 * [crc-worker] A part of a crc_fused job (its segments fill the slot in order, so the part's
 * bytes are one run of the slot's): copied with their crc folded in (crccopy.c), continued
 * from segment to segment, the raw crc moved to its place in the slot (crc_shift by the
 * slot's bytes after it), into *x. The worker reads none of its bytes again.
 */
static int run_part_crc(const struct part *p, uint32_t *x)
{
	const struct copy_job *j = p->j;
	uint64_t left = p->len, off = p->off,
		 at = (uint64_t)((const uint8_t *)j->segs[p->seg].dst + off -
				 (const uint8_t *)j->crc_at);
	uint32_t crc = ~0u;

	for (uint32_t i = p->seg; left; i++, off = 0) {
		const struct copy_seg *s = &j->segs[i];
		uint64_t n = s->len - off < left ? s->len - off : left;

		crc = crc_copy((uint8_t *)s->dst + off, (const uint8_t *)s->src + off, n, crc);
		left -= n;
	}
	*x = crc_shift(~crc, j->crc_len - at - p->len);
	return 0;
}

/*
 * Under the lock: the next part of the job at the head of the queue, which leaves the queue
 * with its last part (its memory is then the workers' until the last part finished).
 */
static void take_part(struct host_engine *h, struct part *p)
{
	struct copy_job *j = h->pend_head;
	uint64_t left = j->bytes - j->taken < j->part_bytes ? j->bytes - j->taken : j->part_bytes;

	*p = (struct part){j, j->cur_seg, j->cur_off, left};
	while (left) {
		uint64_t room = j->segs[j->cur_seg].len - j->cur_off;

		if (room > left) {
			j->cur_off += left;
			break;
		}
		left -= room;
		j->cur_seg++;
		j->cur_off = 0;
	}
	j->taken += p->len;
	j->running++;
	if (j->taken == j->bytes) {
		h->pend_head = j->next;
		if (!h->pend_head)
			h->pend_tail = &h->pend_head;
	}
}

/*
 * Whether a worker may take the head job now. A job of one part (not split: smaller, or with
 * file segments, or a view's many segments) runs on at most nthreads - 1 workers at a time
 * (one of one, with fewer than three): one worker is kept for the parts of large pages, so
 * that a TP fan-out never waits behind a flood of whole jobs, and on two CPUs such a flood
 * keeps one worker busy, as it did before jobs were split (t_fairness's view flood).
 */
static int may_take(const struct host_engine *h)
{
	const struct copy_job *j = h->pend_head;
	uint32_t max = h->nthreads > 2 ? h->nthreads - 1 : 1;

	return j && (j->part_bytes < j->bytes || h->whole_running < max);
}

/* Under the lock: job j, finished, to the done queue, and the loop woken for it. */
static void job_done(struct host_engine *h, struct copy_job *j)
{
	uint64_t one = 1;

	j->next = NULL;
	*h->done_tail = j;
	h->done_tail = &j->next;
	/* Wakes the loop; poll() drains the eventfd and takes the queue under this lock. */
	if (write(h->e.efd, &one, sizeof(one)) < 0) {
		/* EAGAIN only (counter saturated): the loop is already due to wake. */
	}
}

/*
 * Under the lock, stopping: the head job, if it copies into a client's memory, leaves the
 * queue uncopied (-ECANCELED). The broker exits and every session is gone, so nobody reads
 * those bytes, and copying them holds the exit up (16 view GETs of a million segments each
 * are seconds of work under TSan). PUTs still copy: a hand-over's next broker adopts what
 * they commit. 1 when it cancelled one.
 */
static int cancel_head(struct host_engine *h)
{
	struct copy_job *j = h->pend_head;

	if (!h->stop || !j || j->dir != COPY_FROM_POOL)
		return 0;
	h->pend_head = j->next;
	if (!h->pend_head)
		h->pend_tail = &h->pend_head;
	j->taken = j->bytes;
	if (!j->res)
		j->res = -ECANCELED;
	if (!j->running) /* else the worker of its last part running hands it back */
		job_done(h, j);
	return 1;
}

static void *worker(void *arg)
{
	struct host_engine *h = arg;

	/*
	 * A little below the loop: where no core is idle, the loop (which serves every client's
	 * small ops) and the clients come before one client's bulk copy (t_fairness).
	 */
	if (setpriority(PRIO_PROCESS, (id_t)gettid(), WORKER_NICE) < 0)
		log_debug("copy worker: setpriority: %s", strerror(errno));
	pthread_mutex_lock(&h->lock);
	for (;;) {
		struct copy_job *j;
		struct part p;
		uint32_t delay = 0, x = 0;
		int fail = 0, res, whole, last;

		while (!may_take(h) && !h->stop)
			pthread_cond_wait(&h->cond, &h->lock);
		if (cancel_head(h))
			continue;
		/* Stopping: what is left is ours, or that of the worker a whole job keeps busy. */
		if (!may_take(h))
			break;
		j = h->pend_head;
		if (!j->taken) { /* the testing knobs act once per job, on its first part */
			delay = h->delay_us;
			fail = h->fail_every && !(++h->queued % h->fail_every);
		}
		whole = j->part_bytes >= j->bytes;
		h->whole_running += (uint32_t)whole;
		take_part(h, &p);
		if (may_take(h))
			pthread_cond_signal(&h->cond); /* more for another worker */
		pthread_mutex_unlock(&h->lock);

		if (delay) {
			struct timespec ts = {delay / 1000000, (long)(delay % 1000000) * 1000};

			nanosleep(&ts, NULL);
		}
		res = fail ? -EIO : j->crc_fused ? run_part_crc(&p, &x) : run_part(&p);

		pthread_mutex_lock(&h->lock);
		if (res && !j->res)
			j->res = res;
		if (!res && j->crc_fused)
			j->crc_x ^= x;
		last = !--j->running && j->taken == j->bytes;
		/*
		 * [crc-worker] The last part's worker has the job to itself: the slot's crc off the
		 * loop thread, and off the lock. From the parts' folded crcs where the job fills
		 * the slot (crc_fused), else read back from the slot, which the streaming stores
		 * left in DRAM (a Kimi page's PUT: 150-250 us more, docs/benchmarks.md).
		 */
		if (last && !j->res && j->crc_len) {
			pthread_mutex_unlock(&h->lock);
			j->crc = j->crc_fused ? crc_slot_finish(j->crc_x, j->crc_at, j->bytes,
								j->crc_len)
					      : slot_crc32c(j->crc_at, j->crc_len);
			j->has_crc = 1;
			pthread_mutex_lock(&h->lock);
		}
		if (whole) {
			h->whole_running--;
			/* A whole job that another worker may take now. */
			if (may_take(h))
				pthread_cond_signal(&h->cond);
		}
		if (!last)
			continue; /* other parts are still being copied, or still queued */
		job_done(h, j);
	}
	pthread_mutex_unlock(&h->lock);
	return NULL;
}

/*
 * How many parts a queued job is copied in: one per worker, each at least COPY_HOST_PART_MIN
 * (a part costs a lock round and maybe a wake-up, ~10 us, against ~40 us of copy in 512 KiB;
 * smaller parts would cost about what they save). A job with file segments is one part (fdcopy_run takes whole jobs).
 */
static uint64_t part_bytes(const struct host_engine *h, const struct copy_job *j)
{
	uint64_t parts = j->bytes / COPY_HOST_PART_MIN, per;

	if (j->fds || h->nthreads < 2 || parts < 2)
		return j->bytes;
	if (parts > h->nthreads)
		parts = h->nthreads;
	per = (j->bytes + parts - 1) / parts;
	return (per + 4095) & ~4095ull; /* whole 4 KiB pages: no two workers on one */
}

/*
 * [crc-fused] An inline PUT that fills its slot (one segment, or a view's page): copied and
 * checksummed in one pass (crccopy.c), segment after segment, the slot's bytes past the page
 * read from the slot. Returns 0 for any other job (run_segs copies it; xfer.c checksums a
 * plain one's source).
 */
static int run_fused(struct copy_job *j)
{
	uint64_t covered = copy_job_tiles(j);
	uint32_t crc = 0;

	if (!covered)
		return 0;
	for (uint32_t i = 0; i < j->nsegs; i++)
		crc = j->unfenced ? crc_copy_unfenced(j->segs[i].dst, j->segs[i].src,
						      j->segs[i].len, crc)
				  : crc_copy(j->segs[i].dst, j->segs[i].src, j->segs[i].len, crc);
	if (j->crc_len > covered)
		crc = slot_crc32c_more(crc, (const uint8_t *)j->crc_at + covered,
				       j->crc_len - covered);
	j->crc = crc;
	j->has_crc = 1;
	return 1;
}

static int host_submit(struct copy_engine *e, struct copy_job *j)
{
	struct host_engine *h = (struct host_engine *)e;
	/*
	 * A write into a client's file (a GET into a KVB_BUF_FDCOPY buffer) takes that file's
	 * inode lock, which its owner can hold for as long as it likes (a write() into the file
	 * from memory that faults slowly): never on the loop thread, which serves everyone.
	 */
	int file_write = j->fds && j->dir == COPY_FROM_POOL;

	/*
	 * Inline only when it is short in bytes and in segments (a view job of a million
	 * one-byte segments is tens of milliseconds of memcpy calls, which would hold the loop
	 * and every other client that long: t_fairness), writes no client file, and is not a
	 * part of a batch big enough to split ([batch-queue]): a batch's MiB copies inline ran one
	 * after another on the loop while the workers idled (an engine loading a request's layer
	 * groups of 1.07 MiB through a view took 1.5x its page loads, which the workers split).
	 */
	if (!h->nthreads || (j->bytes <= h->inline_max && j->nsegs <= COPY_HOST_INLINE_SEGS &&
			     !file_write && !(j->batch && j->bytes >= 2 * COPY_HOST_PART_MIN))) {
		j->res = run_fused(j) ? 0 : run_segs(j);
		return COPY_DONE;
	}
	j->next = NULL;
	j->res = 0;
	j->crc_x = 0;
	j->crc_fused = copy_job_tiles(j) != 0;
	j->part_bytes = part_bytes(h, j);
	j->taken = j->cur_off = 0;
	j->cur_seg = j->running = 0;
	pthread_mutex_lock(&h->lock);
	*h->pend_tail = j;
	h->pend_tail = &j->next;
	if (j->part_bytes < j->bytes)
		pthread_cond_broadcast(&h->cond);
	else
		pthread_cond_signal(&h->cond);
	pthread_mutex_unlock(&h->lock);
	e->inflight++;
	return COPY_QUEUED;
}

static uint32_t host_poll(struct copy_engine *e)
{
	struct host_engine *h = (struct host_engine *)e;
	struct copy_job *j;
	uint32_t n = 0;
	uint64_t v;

	if (!e->inflight)
		return 0;
	/*
	 * Drain under the lock the workers push and ring under: the eventfd then says exactly
	 * whether the done queue holds jobs we have not taken. Drained before taking the lock, a
	 * completion could ring between the read and the lock and be taken by this very poll,
	 * leaving the eventfd readable with nothing in flight, and the level-triggered loop
	 * spinning on it (100% CPU while idle; test_copy_host).
	 */
	pthread_mutex_lock(&h->lock);
	if (read(e->efd, &v, sizeof(v)) < 0) {
		/* EAGAIN: nothing rang; the done queue may still hold work from before. */
	}
	j = h->done_head;
	h->done_head = NULL;
	h->done_tail = &h->done_head;
	pthread_mutex_unlock(&h->lock);
	while (j) {
		struct copy_job *next = j->next;

		e->inflight--;
		n++;
		j->done(j);
		j = next;
	}
	return n;
}

static void host_destroy(struct copy_engine *e)
{
	struct host_engine *h = (struct host_engine *)e;

	pthread_mutex_lock(&h->lock);
	h->stop = 1;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
	for (uint32_t i = 0; i < h->nthreads; i++)
		pthread_join(h->threads[i], NULL);
	host_poll(e); /* the workers finished the queue before they left */
	close(e->efd);
	pthread_cond_destroy(&h->cond);
	pthread_mutex_destroy(&h->lock);
	free(h);
}

void copy_host_test(struct copy_engine *e, uint32_t delay_us, uint32_t fail_every)
{
	struct host_engine *h = (struct host_engine *)e;

	pthread_mutex_lock(&h->lock);
	h->delay_us = delay_us;
	h->fail_every = fail_every;
	pthread_mutex_unlock(&h->lock);
}

struct copy_engine *copy_host_create(uint32_t nthreads, uint64_t inline_max)
{
	struct host_engine *h = calloc(1, sizeof(*h));

	if (!h)
		return NULL;
	if (nthreads > HOST_MAX_THREADS)
		nthreads = HOST_MAX_THREADS;
	h->e.name = "host";
	h->e.submit = host_submit;
	h->e.poll = host_poll;
	h->e.destroy = host_destroy;
	h->inline_max = inline_max;
	h->pend_tail = &h->pend_head;
	h->done_tail = &h->done_head;
	h->e.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (h->e.efd < 0)
		goto err_free;
	pthread_mutex_init(&h->lock, NULL);
	pthread_cond_init(&h->cond, NULL);
	for (; h->nthreads < nthreads; h->nthreads++)
		if (pthread_create(&h->threads[h->nthreads], NULL, worker, h))
			break;
	if (h->nthreads < nthreads) {
		host_destroy(&h->e);
		return NULL;
	}
	return &h->e;

err_free:
	free(h);
	return NULL;
}
