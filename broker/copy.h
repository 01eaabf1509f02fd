/* SPDX-License-Identifier: MIT */
/*
 * copy.h - the copy-engine interface: moves a page between the pool and a client's registered
 * memory (host or GPU) as a job, a list of segments, completed asynchronously.
 *
 * Contract:
 *   submit(e, job)  takes the job or refuses it. COPY_DONE: it ran to completion before
 *                   returning (job->res set, done() NOT called, the job is the caller's again).
 *                   COPY_QUEUED: it is in flight; the engine owns it until it calls
 *                   job->done(job) exactly once, from poll(), on the loop thread, with job->res
 *                   set (0 or a negative errno). < 0: refused, nothing was copied.
 *   poll(e)         loop thread: completes what finished (calls done()); returns how many.
 *   efd             an eventfd that becomes readable when a queued job may have finished (the
 *                   loop adds it to epoll, so it sleeps while copies are in flight and wakes
 *                   for their completion); poll() drains it. -1 when the engine never queues.
 *   arm(e)          optional: the loop is about to sleep with jobs in flight; make sure efd
 *                   rings when they complete (an engine may skip ringing while the loop
 *                   polls it anyway, as the CUDA one does: a host callback per job would
 *                   stall its stream for microseconds).
 *   inflight        jobs queued and not yet completed.
 *   destroy(e)      waits for every queued job (calling done() for each), then frees.
 *
 * The caller pins the page and keeps every buffer in the job mapped (and, for GPU memory, its
 * handle open) until done() ran; it checked every segment against its registered range. An
 * engine may check again (the CUDA one does: an out-of-range DMA poisons a context).
 *
 * Segments: dst and src are addresses in the broker, except that the client side of a job with
 * dev >= 0 is a device address (CUdeviceptr) in the broker's context of CUDA device dev, and
 * that a host job may carry fds: then segment i whose fds[i].fd >= 0 has its client side in
 * a file (a KVB_BUF_FDCOPY buffer, fdcopy.c): its pointer there is a placeholder, never
 * dereferenced, and the bytes move with pread/pwrite at fds[i].off. An engine may merge
 * segments in place (nsegs shrinks), except in a job with fds.
 */
#ifndef KVB_BROKER_COPY_H
#define KVB_BROKER_COPY_H

#include <errno.h>
#include <stdint.h>

struct copy_gpu_alloc;
struct gpu_map;

struct copy_seg {
	void *dst;
	const void *src;
	uint64_t len;
};

enum copy_dir {
	COPY_TO_POOL = 0,   /* PUT: client memory -> pool */
	COPY_FROM_POOL = 1, /* GET: pool -> client memory */
};

#define COPY_HOST (-1) /* job->dev: the client side is host memory */

/* The file behind one segment's client side (fdcopy.c); fd -1: ordinary memory. */
struct copy_fdseg {
	int32_t fd;	/* the broker's own descriptor of the client's file */
	uint32_t flags; /* COPY_FD_SHARED */
	uint64_t off;	/* file offset of the segment's client side */
};
/* fd is the client's own open file description: it may turn O_APPEND on (checked per write). */
#define COPY_FD_SHARED 1u

enum { COPY_DONE = 0, COPY_QUEUED = 1 };

struct copy_job {
	struct copy_job *next; /* the engine's queues */
	void (*done)(struct copy_job *job);
	int32_t res;  /* 0 or -errno once complete */
	int32_t dev;  /* COPY_HOST or the CUDA device index of the client side */
	uint32_t dir; /* enum copy_dir */
	uint32_t nsegs;
	uint64_t bytes; /* sum of the segments' lengths */
	uint32_t batch; /* more ops of its client wait behind it (host: see copy_host_create) */
	struct copy_seg *segs;
	struct copy_fdseg *fds; /* NULL, or one per segment (host jobs only) */
	/*
	 * [crc-worker] A PUT's slot (crc_len bytes at crc_at, in the pool): the host workers that
	 * wrote it compute its crc32c (folded into their copies where the job fills the slot,
	 * crc_fused below; else the last reads the slot back after the copy) into crc, and set
	 * has_crc; the loop thread then only writes the header (store.c store_commit_crc). An
	 * inline job that fills its slot copies and checksums in one pass ([crc-fused],
	 * copy_host.c run_fused) and sets has_crc too, and so does the CUDA engine where its
	 * kernel checksummed the source ([gpu-crc], copy_cuda.c). Other inline jobs leave has_crc
	 * 0: xfer.c then takes a plain host PUT's from its source ([crc-src]), and the loop any
	 * other's from the slot.
	 */
	const void *crc_at;
	uint64_t crc_len;
	uint32_t crc;
	uint32_t has_crc;
	/*
	 * [crc-worker] A queued job that fills its slot (copy_job_tiles): each part's worker folds
	 * its bytes' crc into its copy (crccopy.c) and xors it, moved to its place in the slot,
	 * into crc_x under the engine's lock; the last one finishes the slot's crc from it.
	 */
	uint32_t crc_fused;
	uint32_t crc_x;
	/*
	 * What copy_job_tiles() would find, where the producer knows it without the pass over
	 * every segment (a view PUT's, ops.c [seg-list]): the bytes its segments fill the slot
	 * with, in order, from crc_at. 0: unknown, copy_job_tiles() looks.
	 */
	uint64_t tiled;
	/*
	 * [cqe-first] An inline job may leave its streaming stores unfenced (crc_copy_unfenced):
	 * the loop fences them before the page is published (xfer.c). Other runs ignore it.
	 */
	uint32_t unfenced;
	/* The host engine's, while queued: a job split into parts (copy_host.c). */
	uint64_t part_bytes; /* bytes per part */
	uint64_t taken;	     /* bytes handed to workers so far */
	uint32_t cur_seg;    /* where the next part starts: segment, */
	uint64_t cur_off;    /* and offset in it */
	uint32_t running;    /* parts taken and not yet finished */
};

struct copy_engine {
	const char *name;
	int efd;
	uint32_t inflight;
	int (*submit)(struct copy_engine *e, struct copy_job *job);
	uint32_t (*poll)(struct copy_engine *e);
	void (*arm)(struct copy_engine *e); /* may be NULL */
	void (*destroy)(struct copy_engine *e);
	/* Engines of device memory only (NULL elsewhere): copy_gpu_open(), copy_gpu_put(). */
	int (*gpu_open)(struct copy_engine *e, uint32_t owner, const struct copy_gpu_alloc *a,
			struct gpu_map **gm, uint64_t *dptr, int32_t *dev);
	void (*gpu_put)(struct copy_engine *e, struct gpu_map *gm);
};

/*
 * A client's GPU allocation for copy_gpu_open(): what the control path decoded from the
 * client's registration (BUF_REG_GPU), in the engine's terms. The engine knows no message.
 */
#define COPY_GPU_IPC 1 /* handle: a CUipcMemHandle (cuMemAlloc memory) */
#define COPY_GPU_FD 2  /* fd: a cuMem allocation's POSIX fd */
struct copy_gpu_alloc {
	uint8_t uuid[16];   /* the device it lives on */
	uint8_t handle[64]; /* COPY_GPU_IPC */
	uint64_t key;	    /* its base address in the client: one open per client and key */
	uint64_t size;	    /* its bytes */
	int kind;	    /* COPY_GPU_IPC or COPY_GPU_FD */
	int fd;		    /* COPY_GPU_FD: the fd (the caller closes it); else -1 */
};

/*
 * Opens owner's allocation a on its device (or takes another reference: one open per owner
 * and key): *dptr is the device address of its base in the engine's context and *dev the
 * device's index, which jobs name (copy_job.dev). Errors: -ENODEV no engine of device memory
 * or no device with a's uuid, -EINVAL a key reopened with another size or kind, -EFAULT the
 * driver maps less than a->size, -ENOMEM, -EIO (or another errno) the driver refused it.
 */
static inline int copy_gpu_open(struct copy_engine *e, uint32_t owner,
				const struct copy_gpu_alloc *a, struct gpu_map **gm, uint64_t *dptr,
				int32_t *dev)
{
	return e && e->gpu_open ? e->gpu_open(e, owner, a, gm, dptr, dev) : -ENODEV;
}

/*
 * Drops one reference on gm; the last closes it, once no copy on its device is in flight any
 * more. A NULL engine (already destroyed, which closed every mapping) is a no-op.
 */
static inline void copy_gpu_put(struct copy_engine *e, struct gpu_map *gm)
{
	if (e && e->gpu_put && gm)
		e->gpu_put(e, gm);
}

/*
 * Appends dst <- src (len bytes) to segs[*n], merging it into the previous segment when both
 * sides continue it. The caller made room for one more. Returns the new count.
 */
static inline uint32_t copy_seg_add(struct copy_seg *segs, uint32_t n, void *dst, const void *src,
				    uint64_t len)
{
	struct copy_seg *prev = n ? &segs[n - 1] : 0;

	if (prev && (uint8_t *)prev->dst + prev->len == (uint8_t *)dst &&
	    (const uint8_t *)prev->src + prev->len == (const uint8_t *)src) {
		prev->len += len;
		return n;
	}
	segs[n] = (struct copy_seg){dst, src, len};
	return n + 1;
}

/*
 * [crc-fused] The bytes a PUT's segments cover when they fill its slot (crc_at, crc_len) from
 * the start, in order, with no file among them: then the slot's checksum can be computed from
 * what is copied, in the copy's pass ([crc-fused], [crc-worker]) or on the GPU ([gpu-crc]),
 * and the rest of the slot, if any, read from it. 0 for any other job. A page and a view's
 * page do fill it: a view lays its parts out in order (ops.c).
 */
static inline uint64_t copy_job_tiles(const struct copy_job *j)
{
	uint64_t covered = 0;

	if (!j->crc_len || j->fds)
		return 0;
	if (j->tiled)
		return j->tiled <= j->crc_len ? j->tiled : 0;
	for (uint32_t i = 0; i < j->nsegs; i++) {
		if ((const uint8_t *)j->segs[i].dst != (const uint8_t *)j->crc_at + covered)
			return 0;
		covered += j->segs[i].len;
	}
	return covered <= j->crc_len ? covered : 0;
}

/*
 * The host engine: memcpy. Jobs of at most inline_max bytes run inside submit() (COPY_DONE);
 * larger ones go to nthreads worker threads (0: every job inline), a job of at least
 * 2 x COPY_HOST_PART_MIN bytes split into parts that idle workers copy side by side. A job
 * of a batch (job->batch) of 2 x COPY_HOST_PART_MIN or more is queued whatever inline_max says.
 * See copy_host.c for the numbers behind the defaults.
 */
struct copy_engine *copy_host_create(uint32_t nthreads, uint64_t inline_max);
/*
 * Testing (--copy-delay-us, --copy-fail-every): every queued job sleeps delay_us on its worker
 * before copying, and every fail_every-th one (counted from start-up) fails with -EIO instead.
 */
void copy_host_test(struct copy_engine *e, uint32_t delay_us, uint32_t fail_every);
#define COPY_HOST_INLINE_DEFAULT (4ull << 20)
#define COPY_HOST_INLINE_SEGS 16384u	  /* more segments go to a worker, whatever the bytes */
#define COPY_HOST_PART_MIN (512ull << 10) /* a queued job's parts are at least this big */

/*
 * Runs a host job that has fds (fdcopy.c): memcpy for memory segments, preadv/pwritev for file
 * ones. Returns 0 or -errno: -EFAULT when the file no longer holds the range (shrunk, or
 * O_APPEND turned on). Any thread; touches nothing but the job and its files.
 */
int fdcopy_run(const struct copy_job *j);

#endif /* KVB_BROKER_COPY_H */
