// SPDX-License-Identifier: MIT
/*
 * copy_cuda.c - the CUDA copy engine: DMA between the pinned pool and clients' GPU memory.
 *
 * Driver: the CUDA driver API through a table of function pointers (proto/cuda_api.h), loaded
 * from libcuda.so.1 at start-up; the tests hand in a table of fakes. Without the CUDA headers
 * at build time only the "GPU copies off" stubs at the end of this file are compiled.
 *
 * Devices: every device gets its primary context, one stream per direction (H2D for GETs, D2H
 * for PUTs, so loads and stores overlap on the two copy engines), and a descriptor ring in
 * mapped pinned memory for the kernel path. Clients name devices by UUID (CUDA_VISIBLE_DEVICES
 * renumbers ordinals per process; UUIDs are global).
 *
 * The pool: registered once for every client with cuMemHostRegister(PORTABLE | DEVICEMAP), in
 * chunks of at most 64 GiB (single registrations above ~64-96 GiB fail on real drivers); the
 * time it takes goes to the log and to the "copy.gpu.pin_seconds" statistic. Each chunk's device
 * mapping (cuMemHostGetDevicePointer, per device) is what the kernel path reads and writes.
 * [slab-pin] A sparse pool (--tenants) is not registered whole, which would pin every
 * partition, each as large as the pool: each slab is a chunk of its own, registered when the
 * store gives it memory and unregistered before it gives it back (copy_cuda_pin, _unpin,
 * through the store's hooks set in xfer.c). The chunks are kept sorted by address, so that
 * checking a job's pool side against thousands of slabs is a binary search.
 *
 * Client memory: a gpu_map is one client allocation opened in our context, from a legacy IPC
 * handle (cuIpcOpenMemHandle) or a POSIX fd of a cuMem allocation (import, reserve, map, set
 * access). One open per (client, allocation): buffers inside one caching-allocator segment
 * share it by reference count. Each device keeps its open maps sorted by address; every segment
 * of every job is checked against them and against the pool's chunks before anything is issued:
 * an out-of-range DMA can leave the context in a sticky error that would end GPU copies for
 * every client. A map whose last buffer is gone is closed only when no job is in flight on its
 * device (the "closing" list), so a dying client's copies finish before its handles close.
 *
 * [CUDA-PATH] Two ways to move a job: COPY, the (coalesced) segments on the copy engines, as
 * one cuMemcpyBatchAsync where the driver has it, else one cuMemcpy{HtoD,DtoH}Async each; KERNEL, the gather/scatter kernel (kernels/copy_segs.cu) over a
 * descriptor table, with SMs reading or writing the pool through its device mapping. Many
 * small segments (61 layer parts of 72 KiB for a Kimi-K2.5 page) favour the kernel, few large
 * ones the copy engines; where the line lies depends on the GPU, the PCIe link and the NUMA
 * placement, so it is measured, not guessed: the first jobs of every page shape (device,
 * direction, segment count, bytes) alternate between the paths, timed with events, and after
 * CUDA_CALIB timed runs of each (the first of each discarded as warm-up) the faster one is
 * cached for that shape. One-segment jobs always take COPY.
 *
 * [gpu-crc] A PUT's slot checksum (pagehdr, for adoption after a restart) is computed on the
 * GPU from the job's source by the checksum kernel (kernels/copy_segs.cu kvb_crc_segs), on a
 * stream of its own so that it runs beside the DMA; the job's stream waits for it before the
 * job's end event. Each block's part lands in the descriptor ring, and the host combines them
 * at completion (microseconds) and reads only the slot's bytes past the page. Reading the slot
 * back from DRAM instead ran at about 13 GB/s on the loop thread, a fifth of the DMA's rate
 * (H200, 2026-12-04). Where the segments do not tile the page from the slot's start, or the
 * kernel is missing, has_crc stays 0 and the loop reads the slot as before.
 *
 * Completion: each job records an event after its work; poll() queries the events of each
 * stream in submission order (a stream completes in order) and completes the jobs whose event
 * fired. The loop polls every round while it is busy; only when it is about to sleep with jobs
 * in flight does arm() queue a host function behind the last job of each busy stream, which
 * rings the engine's eventfd (in the loop's epoll set). Not one per job: a host function
 * holds its stream for several microseconds, a tenth of a page's transfer time.
 *
 * Loop thread only, except the host function (a driver thread), which only writes the eventfd.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "broker.h"
#include "clock.h"
#include "copy_cuda.h"
#include "crccopy.h"
#include "cuda_api.h"
#include "kernels/crc32c_gf.h"
#include "log.h"

#ifdef KVB_HAVE_CUDA

#define CUDA_MAX_DEVS 16
#define CUDA_SHAPES 64
#define CUDA_CALIB 3		     /* timed runs of each path per shape, after one warm-up */
#define CUDA_DESC_BYTES (1u << 20)   /* descriptor ring per stream: 43,690 segments */
#define CUDA_CHUNK_MAX (64ull << 30) /* largest single cuMemHostRegister */
#define CUDA_THREADS 256	     /* kernel block size */
#define CUDA_KCHUNK 16384	     /* bytes per block per segment: KVB_CHUNK of the kernel */
#define CUDA_GRID_Y 65535u	     /* segments walked by blockIdx.y (grid-stride beyond) */
#define CUDA_GRID_X 64u		     /* chunks of one segment spread over at most this many */
#define CUDA_CRC_BLOCKS 4096u	     /* [gpu-crc] most blocks (results) of one checksum */

struct kvb_dseg { /* kernels/copy_segs.cu */
	uint64_t dst, src, len;
};

struct kvb_cseg { /* kernels/copy_segs.cu, [gpu-crc] */
	uint64_t src, len, after;
};

struct gpu_map {
	struct gpu_map *next; /* on its device's closing list */
	uint32_t owner;	      /* session id */
	int kind;	      /* COPY_GPU_IPC or COPY_GPU_FD */
	uint32_t refs;
	int dev;
	uint64_t key; /* the client's address of the allocation */
	CUdeviceptr base;
	uint64_t size;
	CUmemGenericAllocationHandle h; /* FD: the imported allocation */
};

struct shape {
	int32_t dev;
	uint32_t dir, nsegs;
	uint64_t bytes;
	uint32_t gen; /* bumped on reuse: a job's timing for an evicted shape is dropped */
	uint32_t issued[2], runs[2];
	float ms[2];
	int choice; /* CUDA_PATH_*, -1 while measuring */
	uint64_t used;
};

struct cuda_job {
	struct cuda_job *next;
	struct copy_job *job;
	CUevent start, end;
	struct shape *sh; /* measuring: where the time goes */
	uint32_t sh_gen;
	int path;
	int32_t err;		 /* an enqueue failed: completes with this */
	uint64_t desc_end;	 /* descriptor ring position released at completion */
	CUevent crc_done;	 /* [gpu-crc] on the checksum stream; created at first use */
	const uint32_t *crc_out; /* [gpu-crc] the blocks' parts, in the ring; NULL: none */
	uint32_t crc_blocks;
	uint64_t crc_covered; /* the slot's bytes the kernel checksummed */
};

struct cuda_stream {
	CUstream st;
	struct cuda_job *head, **tail;
	int armed;	    /* a host function rings the eventfd after the last job queued */
	uint8_t *desc;	    /* ring in mapped pinned memory */
	CUdeviceptr desc_d; /* its device address */
	uint64_t desc_head, desc_tail; /* free-running byte positions */
};

struct cuda_dev {
	CUdevice dev;
	CUcontext ctx;
	CUuuid uuid;
	struct cuda_stream s[2];    /* by enum copy_dir */
	CUstream crc_st;	    /* [gpu-crc] */
	struct cuda_job *free_jobs; /* recycled, with their events (of this context) */
	CUmodule mod;
	CUfunction fn;	       /* NULL: no kernel path */
	CUfunction crc_fn;     /* NULL: PUT checksums from the slot, on the loop [gpu-crc] */
	struct gpu_map **maps; /* sorted by base */
	uint32_t nmaps, cap;
	struct gpu_map *closing;
	uint32_t inflight;
};

struct cuda_chunk {
	uint8_t *host;
	uint64_t len;
	CUdeviceptr dptr[CUDA_MAX_DEVS]; /* its device mapping, per device (the kernel path) */
};

struct cuda_engine {
	struct copy_engine e;
	const struct kvb_cuda_api *api;
	struct kvb_cuda_api *owned_api; /* loaded by copy_cuda_open, unloaded at destroy */
	int path;
	uint32_t ndev;
	struct cuda_dev dev[CUDA_MAX_DEVS];
	struct cuda_chunk *chunks; /* registered pool memory, sorted by host address */
	uint32_t nchunks, chunk_cap;
	struct shape shapes[CUDA_SHAPES];
	uint64_t tick;
	struct cuda_info info;
	int logged_bounds;
	int logged_crc;
	int no_batch;		  /* cuMemcpyBatchAsync missing or refused: one call per segment */
	CUdeviceptr *bdst, *bsrc; /* its argument arrays, grown as needed */
	size_t *bsize;
	uint32_t bcap;
};

#define CU(e, call) ((e)->api->call)

static int cuda_gpu_open(struct copy_engine *e, uint32_t owner, const struct copy_gpu_alloc *a,
			 struct gpu_map **gm, uint64_t *dptr, int32_t *dev);

static int cu_fail(struct cuda_engine *c, const char *what, CUresult r)
{
	log_warn("cuda: %s: %s", what, kvb_cuda_strerror(c->api, r));
	return kvb_cuda_errno(r);
}

/* ---- client allocations ---- */

int cuda_dev_find(struct copy_engine *e, const uint8_t uuid[16])
{
	struct cuda_engine *c = (struct cuda_engine *)e;

	for (uint32_t i = 0; i < c->ndev; i++)
		if (!memcmp(c->dev[i].uuid.bytes, uuid, 16))
			return (int)i;
	return -ENODEV;
}

/* Index of the last map with base <= addr, or -1. */
static int map_floor(const struct cuda_dev *d, uint64_t addr)
{
	int lo = 0, hi = (int)d->nmaps - 1, best = -1;

	while (lo <= hi) {
		int mid = (lo + hi) / 2;

		if (d->maps[mid]->base <= addr) {
			best = mid;
			lo = mid + 1;
		} else {
			hi = mid - 1;
		}
	}
	return best;
}

/* Is [addr, addr + len) inside one open allocation of this device? */
static int in_maps(const struct cuda_dev *d, uint64_t addr, uint64_t len)
{
	int i = map_floor(d, addr);

	return i >= 0 && addr - d->maps[i]->base <= d->maps[i]->size &&
	       len <= d->maps[i]->size - (addr - d->maps[i]->base);
}

static int map_insert(struct cuda_dev *d, struct gpu_map *gm)
{
	int at;

	if (d->nmaps == d->cap) {
		uint32_t cap = d->cap ? 2 * d->cap : 64;
		struct gpu_map **nm = realloc(d->maps, cap * sizeof(*nm));

		if (!nm)
			return -ENOMEM;
		d->maps = nm;
		d->cap = cap;
	}
	at = map_floor(d, gm->base) + 1;
	memmove(&d->maps[at + 1], &d->maps[at], (d->nmaps - (uint32_t)at) * sizeof(*d->maps));
	d->maps[at] = gm;
	d->nmaps++;
	return 0;
}

static void map_remove(struct cuda_dev *d, struct gpu_map *gm)
{
	for (uint32_t i = 0; i < d->nmaps; i++) {
		if (d->maps[i] == gm) {
			memmove(&d->maps[i], &d->maps[i + 1],
				(d->nmaps - i - 1) * sizeof(*d->maps));
			d->nmaps--;
			return;
		}
	}
}

/* Closes the handle: no job may use it any more. */
static void map_close(struct cuda_engine *c, struct gpu_map *gm)
{
	CUresult r = CUDA_SUCCESS;

	CU(c, cuCtxSetCurrent)(c->dev[gm->dev].ctx);
	if (gm->kind == COPY_GPU_IPC) {
		r = CU(c, cuIpcCloseMemHandle)(gm->base);
	} else {
		CU(c, cuMemUnmap)(gm->base, gm->size);
		CU(c, cuMemAddressFree)(gm->base, gm->size);
		r = CU(c, cuMemRelease)(gm->h);
	}
	if (r != CUDA_SUCCESS)
		cu_fail(c, "closing a client allocation", r);
	c->info.nmaps--;
	free(gm);
}

static int map_open_fd(struct cuda_engine *c, struct cuda_dev *d, struct gpu_map *gm, int fd)
{
	CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = d->dev},
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUresult r;

	r = CU(c, cuMemImportFromShareableHandle)(&gm->h, (void *)(uintptr_t)fd,
						  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS)
		return cu_fail(c, "cuMemImportFromShareableHandle", r);
	r = CU(c, cuMemAddressReserve)(&gm->base, gm->size, 0, 0, 0);
	if (r != CUDA_SUCCESS)
		goto err_release;
	/* Fails unless size fits the allocation: the client cannot make us map past its end. */
	r = CU(c, cuMemMap)(gm->base, gm->size, 0, gm->h, 0);
	if (r != CUDA_SUCCESS)
		goto err_free;
	r = CU(c, cuMemSetAccess)(gm->base, gm->size, &acc, 1);
	if (r != CUDA_SUCCESS)
		goto err_unmap;
	return 0;

err_unmap:
	CU(c, cuMemUnmap)(gm->base, gm->size);
err_free:
	CU(c, cuMemAddressFree)(gm->base, gm->size);
err_release:
	CU(c, cuMemRelease)(gm->h);
	return cu_fail(c, "mapping a client's cuMem allocation", r);
}

static int map_open_ipc(struct cuda_engine *c, struct gpu_map *gm, const uint8_t handle[64])
{
	CUipcMemHandle h;
	CUdeviceptr base = 0;
	size_t size = 0;
	CUresult r;

	memcpy(h.reserved, handle, sizeof(h.reserved));
	r = CU(c, cuIpcOpenMemHandle)(&gm->base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	if (r != CUDA_SUCCESS)
		return cu_fail(c, "cuIpcOpenMemHandle", r);
	/* The size is the driver's, not the client's word for it. */
	r = CU(c, cuMemGetAddressRange)(&base, &size, gm->base);
	if (r != CUDA_SUCCESS || base != gm->base || size < gm->size) {
		CU(c, cuIpcCloseMemHandle)(gm->base);
		if (r != CUDA_SUCCESS)
			return cu_fail(c, "cuMemGetAddressRange", r);
		log_warn("cuda: a client's IPC allocation is %zu bytes, it claimed %llu", size,
			 (unsigned long long)gm->size);
		return -EFAULT;
	}
	return 0;
}

int cuda_map_get(struct copy_engine *e, uint32_t owner, int dev, const struct copy_gpu_alloc *m,
		 struct gpu_map **out, uint64_t *dptr)
{
	struct cuda_engine *c = (struct cuda_engine *)e;
	struct cuda_dev *d = &c->dev[dev];
	struct gpu_map *gm;
	int err;

	for (uint32_t i = 0; i < d->nmaps; i++) {
		gm = d->maps[i];
		if (gm->owner == owner && gm->key == m->key) {
			if (gm->size != m->size || gm->kind != m->kind)
				return -EINVAL;
			gm->refs++;
			*out = gm;
			*dptr = gm->base;
			return 0;
		}
	}
	gm = calloc(1, sizeof(*gm));
	if (!gm)
		return -ENOMEM;
	*gm = (struct gpu_map){.owner = owner,
			       .kind = m->kind,
			       .refs = 1,
			       .dev = dev,
			       .key = m->key,
			       .size = m->size};
	CU(c, cuCtxSetCurrent)(d->ctx);
	/* Each open undoes its own steps on failure. */
	err = m->kind == COPY_GPU_FD ? map_open_fd(c, d, gm, m->fd)
				     : map_open_ipc(c, gm, m->handle);
	if (err) {
		free(gm);
		return err;
	}
	c->info.nmaps++;
	err = map_insert(d, gm);
	if (err) {
		map_close(c, gm);
		return err;
	}
	*out = gm;
	*dptr = gm->base;
	return 0;
}

void gpu_map_put(struct copy_engine *e, struct gpu_map *gm)
{
	struct cuda_engine *c = (struct cuda_engine *)e;
	struct cuda_dev *d;

	if (!c || !gm || --gm->refs)
		return;
	d = &c->dev[gm->dev];
	map_remove(d, gm); /* no new job can name it */
	if (!d->inflight) {
		map_close(c, gm);
		return;
	}
	gm->next = d->closing;
	d->closing = gm;
	c->info.nclosing++;
}

/* ---- jobs ---- */

/* Index of the last chunk whose host address is <= p, or -1. */
static int chunk_floor(const struct cuda_engine *c, const uint8_t *p)
{
	int lo = 0, hi = (int)c->nchunks - 1, best = -1;

	while (lo <= hi) {
		int mid = (lo + hi) / 2;

		if ((uintptr_t)c->chunks[mid].host <= (uintptr_t)p) {
			best = mid;
			lo = mid + 1;
		} else {
			hi = mid - 1;
		}
	}
	return best;
}

/* The chunk holding [p, p + len) of the pool, or -1. Registrations never overlap. */
static int chunk_of(const struct cuda_engine *c, const void *p, uint64_t len)
{
	const uint8_t *a = p;
	int i = chunk_floor(c, a);

	if (i >= 0 && (uint64_t)(a - c->chunks[i].host) <= c->chunks[i].len &&
	    len <= c->chunks[i].len - (uint64_t)(a - c->chunks[i].host))
		return i;
	return -1;
}

/* Every segment inside an open allocation of the device and inside one pool chunk? */
static int job_bounds(struct cuda_engine *c, const struct cuda_dev *d, const struct copy_job *j)
{
	for (uint32_t i = 0; i < j->nsegs; i++) {
		const struct copy_seg *sg = &j->segs[i];
		const void *pool = j->dir == COPY_TO_POOL ? sg->dst : sg->src;
		uint64_t gpu = (uint64_t)(uintptr_t)(j->dir == COPY_TO_POOL ? sg->src : sg->dst);

		if (!in_maps(d, gpu, sg->len) || chunk_of(c, pool, sg->len) < 0) {
			if (!c->logged_bounds++)
				log_warn("cuda: refused a copy outside the registered memory "
					 "(segment %u of %u, %llu bytes)",
					 i, j->nsegs, (unsigned long long)sg->len);
			return -EFAULT;
		}
	}
	return 0;
}

/* Merges segments that continue each other on both sides (the producer may not have). */
static void coalesce(struct copy_job *j)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < j->nsegs; i++) {
		struct copy_seg sg = j->segs[i];

		n = copy_seg_add(j->segs, n, sg.dst, sg.src, sg.len);
	}
	j->nsegs = n;
}

static struct shape *shape_get(struct cuda_engine *c, const struct copy_job *j)
{
	struct shape *victim = &c->shapes[0];

	c->tick++;
	for (int i = 0; i < CUDA_SHAPES; i++) {
		struct shape *sh = &c->shapes[i];

		if (sh->used && sh->dev == j->dev && sh->dir == j->dir && sh->nsegs == j->nsegs &&
		    sh->bytes == j->bytes) {
			sh->used = c->tick;
			return sh;
		}
		if (sh->used < victim->used)
			victim = sh;
	}
	if (!victim->used)
		c->info.shapes++;
	*victim = (struct shape){.dev = j->dev,
				 .dir = j->dir,
				 .nsegs = j->nsegs,
				 .bytes = j->bytes,
				 .gen = victim->gen + 1,
				 .choice = -1,
				 .used = c->tick};
	return victim;
}

/* [CUDA-PATH]: the path of this job, and the shape to time it for while measuring. */
static int choose_path(struct cuda_engine *c, const struct cuda_dev *d, const struct copy_job *j,
		       struct shape **timed)
{
	struct shape *sh;
	int p;

	*timed = NULL;
	if (!d->fn || j->nsegs == 1)
		return CUDA_PATH_COPY;
	if (c->path != CUDA_PATH_AUTO)
		return c->path;
	sh = shape_get(c, j);
	if (sh->choice >= 0)
		return sh->choice;
	p = sh->issued[CUDA_PATH_COPY] <= sh->issued[CUDA_PATH_KERNEL] ? CUDA_PATH_COPY
								       : CUDA_PATH_KERNEL;
	sh->issued[p]++;
	*timed = sh;
	return p;
}

static void shape_time(struct cuda_engine *c, struct cuda_job *cj)
{
	struct shape *sh = cj->sh;
	float ms = 0;
	double us[2];

	if (sh->gen != cj->sh_gen || sh->choice >= 0)
		return;
	if (CU(c, cuEventElapsedTime)(&ms, cj->start, cj->end) != CUDA_SUCCESS)
		return;
	if (sh->runs[cj->path]++) /* the first run of each path warms up */
		sh->ms[cj->path] += ms;
	if (sh->runs[CUDA_PATH_COPY] <= CUDA_CALIB || sh->runs[CUDA_PATH_KERNEL] <= CUDA_CALIB)
		return;
	for (int p = 0; p < 2; p++)
		us[p] = 1e3 * sh->ms[p] / (sh->runs[p] - 1);
	sh->choice = us[CUDA_PATH_KERNEL] < us[CUDA_PATH_COPY] ? CUDA_PATH_KERNEL : CUDA_PATH_COPY;
	log_info("cuda: device %d %s pages of %u segments, %llu bytes: copies %.1f us, kernel "
		 "%.1f us: %s",
		 sh->dev, sh->dir == COPY_TO_POOL ? "D2H" : "H2D", sh->nsegs,
		 (unsigned long long)sh->bytes, us[CUDA_PATH_COPY], us[CUDA_PATH_KERNEL],
		 sh->choice == CUDA_PATH_KERNEL ? "kernel" : "copies");
}

/* A job record of device d, whose context is current: events belong to a context. */
static struct cuda_job *job_rec(struct cuda_engine *c, struct cuda_dev *d)
{
	struct cuda_job *cj = d->free_jobs;

	if (cj) {
		d->free_jobs = cj->next;
		return cj;
	}
	cj = calloc(1, sizeof(*cj));
	if (!cj)
		return NULL;
	if (CU(c, cuEventCreate)(&cj->start, CU_EVENT_DEFAULT) != CUDA_SUCCESS ||
	    CU(c, cuEventCreate)(&cj->end, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
		if (cj->start)
			CU(c, cuEventDestroy)(cj->start);
		free(cj);
		return NULL;
	}
	return cj;
}

/*
 * Enqueues a job's segments as one cuMemcpyBatchAsync where the driver has it (one call
 * instead of 61 for a Kimi-K2.5 page: the per-call cost, a few microseconds each, would
 * otherwise bound a page's throughput), else one cuMemcpy*Async per segment.
 */
static CUresult issue_batch(struct cuda_engine *c, CUstream st, const struct copy_job *j)
{
	CUmemcpyAttributes attr = {.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM};
	size_t zero = 0;
	CUresult r;

	if (j->nsegs > c->bcap) {
		uint32_t cap = j->nsegs;
		CUdeviceptr *d = realloc(c->bdst, cap * sizeof(*d));
		CUdeviceptr *s = d ? realloc(c->bsrc, cap * sizeof(*s)) : NULL;
		size_t *z = s ? realloc(c->bsize, cap * sizeof(*z)) : NULL;

		if (d)
			c->bdst = d;
		if (s)
			c->bsrc = s;
		if (!z)
			return CUDA_ERROR_OUT_OF_MEMORY;
		c->bsize = z;
		c->bcap = cap;
	}
	for (uint32_t i = 0; i < j->nsegs; i++) {
		c->bdst[i] = (CUdeviceptr)(uintptr_t)j->segs[i].dst;
		c->bsrc[i] = (CUdeviceptr)(uintptr_t)j->segs[i].src;
		c->bsize[i] = j->segs[i].len;
	}
	r = CU(c, cuMemcpyBatchAsync)(c->bdst, c->bsrc, c->bsize, j->nsegs, &attr, &zero, 1, st);
	if (r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY) {
		/* Copying a segment twice is harmless; a driver that refuses batches is not. */
		cu_fail(c, "cuMemcpyBatchAsync (one call per segment from now on)", r);
		c->no_batch = 1;
	}
	return r;
}

static CUresult issue_copies(struct cuda_engine *c, CUstream st, const struct copy_job *j)
{
	CUresult r = CUDA_SUCCESS;

	if (j->nsegs > 1 && c->api->cuMemcpyBatchAsync && !c->no_batch &&
	    issue_batch(c, st, j) == CUDA_SUCCESS)
		return CUDA_SUCCESS;
	for (uint32_t i = 0; i < j->nsegs && r == CUDA_SUCCESS; i++) {
		const struct copy_seg *sg = &j->segs[i];

		if (j->dir == COPY_FROM_POOL)
			r = CU(c, cuMemcpyHtoDAsync)((CUdeviceptr)(uintptr_t)sg->dst, sg->src,
						     sg->len, st);
		else
			r = CU(c, cuMemcpyDtoHAsync)(sg->dst, (CUdeviceptr)(uintptr_t)sg->src,
						     sg->len, st);
	}
	return r;
}

/*
 * need bytes (a multiple of 8) of the stream's descriptor ring, contiguous (the tail end is
 * skipped when they would wrap): the host address, the device's in *dev. NULL when the ring is
 * full. Released in order as the jobs complete (cj->desc_end).
 */
static void *ring_take(struct cuda_stream *s, uint64_t need, struct cuda_job *cj, CUdeviceptr *dev)
{
	uint64_t at = s->desc_head;

	if (at % CUDA_DESC_BYTES + need > CUDA_DESC_BYTES)
		at += CUDA_DESC_BYTES - at % CUDA_DESC_BYTES;
	if (need > CUDA_DESC_BYTES || at + need - s->desc_tail > CUDA_DESC_BYTES)
		return NULL;
	s->desc_head = at + need;
	cj->desc_end = s->desc_head;
	*dev = s->desc_d + at % CUDA_DESC_BYTES;
	return s->desc + at % CUDA_DESC_BYTES;
}

/*
 * Writes the descriptor table into the stream's ring (pool addresses translated to their
 * device mapping) and launches the kernel. -ENOSPC when the ring is full: the caller copies.
 */
static int issue_kernel(struct cuda_engine *c, struct cuda_dev *d, struct cuda_stream *s,
			const struct copy_job *j, struct cuda_job *cj)
{
	uint64_t head = s->desc_head, end = cj->desc_end, maxlen = 0;
	CUdeviceptr table;
	struct kvb_dseg *t = ring_take(s, (uint64_t)j->nsegs * sizeof(*t), cj, &table);
	unsigned n = j->nsegs, gx, gy;
	void *args[2] = {&table, &n};
	CUresult r;

	if (!t)
		return -ENOSPC;
	for (uint32_t i = 0; i < j->nsegs; i++) {
		const struct copy_seg *sg = &j->segs[i];
		const void *pool = j->dir == COPY_TO_POOL ? sg->dst : sg->src;
		int k = chunk_of(c, pool, sg->len); /* >= 0: job_bounds checked it */
		uint64_t pd = c->chunks[k].dptr[d - c->dev] +
			      (uint64_t)((const uint8_t *)pool - c->chunks[k].host);
		uint64_t gpu = (uint64_t)(uintptr_t)(j->dir == COPY_TO_POOL ? sg->src : sg->dst);

		t[i] = j->dir == COPY_TO_POOL ? (struct kvb_dseg){pd, gpu, sg->len}
					      : (struct kvb_dseg){gpu, pd, sg->len};
		if (sg->len > maxlen)
			maxlen = sg->len;
	}
	gy = n < CUDA_GRID_Y ? n : CUDA_GRID_Y;
	gx = (unsigned)((maxlen + CUDA_KCHUNK - 1) / CUDA_KCHUNK);
	gx = gx < 1 ? 1 : gx > CUDA_GRID_X ? CUDA_GRID_X : gx;
	/* The table is written before the launch is queued; the GPU reads it after. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	r = CU(c, cuLaunchKernel)(d->fn, gx, gy, 1, CUDA_THREADS, 1, 1, 0, s->st, args, NULL);
	if (r != CUDA_SUCCESS) {
		s->desc_head = head; /* nothing queued reads it */
		cj->desc_end = end;
		return cu_fail(c, "cuLaunchKernel", r);
	}
	return 0;
}

/*
 * [gpu-crc] Queues the checksum kernel over a PUT's source when its segments tile the slot
 * from its start, in order (views and single buffers do; coalesce() merged what continues):
 * the slot's bytes past them are the host's at completion. Nothing queued otherwise.
 */
static void issue_crc(struct cuda_engine *c, struct cuda_dev *d, struct cuda_stream *s,
		      const struct copy_job *j, struct cuda_job *cj)
{
	uint64_t head = s->desc_head, end = cj->desc_end, maxlen = 0, covered = copy_job_tiles(j);
	uint64_t need;
	CUdeviceptr table, out;
	struct kvb_cseg *t;
	unsigned n = j->nsegs, gx, gy;
	void *args[3] = {&table, &n, &out};
	CUresult r;

	if (!d->crc_fn || j->dir != COPY_TO_POOL || !covered)
		return;
	if (!cj->crc_done &&
	    CU(c, cuEventCreate)(&cj->crc_done, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
		cj->crc_done = NULL;
		return;
	}
	for (uint32_t i = 0; i < n; i++)
		maxlen = j->segs[i].len > maxlen ? j->segs[i].len : maxlen;
	gy = n < CUDA_GRID_Y ? n : CUDA_GRID_Y;
	gx = (unsigned)((maxlen + KVB_CRC_THREADS * KVB_CRC_PIECE - 1) /
			(KVB_CRC_THREADS * KVB_CRC_PIECE));
	gx = gx < 1 ? 1 : gx > CUDA_GRID_X ? CUDA_GRID_X : gx;
	if (gx * gy > CUDA_CRC_BLOCKS)
		gy = CUDA_CRC_BLOCKS / gx;
	need = (uint64_t)n * sizeof(*t) + ((uint64_t)gx * gy * sizeof(uint32_t) + 7) / 8 * 8;
	t = ring_take(s, need, cj, &table);
	if (!t)
		return;
	out = table + (uint64_t)n * sizeof(*t);
	for (uint32_t i = 0; i < n; i++) {
		const struct copy_seg *sg = &j->segs[i];

		t[i] = (struct kvb_cseg){
			(uint64_t)(uintptr_t)sg->src, sg->len,
			j->crc_len -
				(uint64_t)((const uint8_t *)sg->dst - (const uint8_t *)j->crc_at) -
				sg->len};
	}
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	r = CU(c, cuLaunchKernel)(d->crc_fn, gx, gy, 1, KVB_CRC_THREADS, 1, 1, 0, d->crc_st, args,
				  NULL);
	if (r == CUDA_SUCCESS)
		r = CU(c, cuEventRecord)(cj->crc_done, d->crc_st);
	if (r != CUDA_SUCCESS) {
		/* A kernel may be queued: the ring must stay its until it ran. */
		CU(c, cuStreamSynchronize)(d->crc_st);
		s->desc_head = head;
		cj->desc_end = end;
		c->info.errors++;
		if (!c->logged_crc++)
			cu_fail(c, "the checksum kernel (this PUT's checksum from the pool)", r);
		return;
	}
	cj->crc_out = (const uint32_t *)(void *)&t[n];
	cj->crc_blocks = gx * gy;
	cj->crc_covered = covered;
}

static void CUDA_CB ring_efd(void *arg)
{
	const struct cuda_engine *c = arg;
	uint64_t one = 1;

	if (write(c->e.efd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is saturated, the loop is due to wake anyway. */
	}
}

static int cuda_submit(struct copy_engine *e, struct copy_job *j)
{
	struct cuda_engine *c = (struct cuda_engine *)e;
	struct cuda_dev *d;
	struct cuda_stream *s;
	struct cuda_job *cj;
	struct shape *timed;
	CUresult r;
	int err;

	/* File segments (KVB_BUF_FDCOPY) are host memory: ops never pair them with a device. */
	if (j->dev < 0 || (uint32_t)j->dev >= c->ndev || j->dir > COPY_FROM_POOL || j->fds)
		return -EINVAL;
	d = &c->dev[j->dev];
	s = &d->s[j->dir];
	coalesce(j);
	err = job_bounds(c, d, j);
	if (err)
		return err;
	CU(c, cuCtxSetCurrent)(d->ctx);
	cj = job_rec(c, d);
	if (!cj)
		return -ENOMEM;
	cj->job = j;
	cj->err = 0;
	cj->desc_end = s->desc_head;
	cj->crc_out = NULL;
	cj->path = choose_path(c, d, j, &timed);
	cj->sh = timed;
	cj->sh_gen = timed ? timed->gen : 0;
	issue_crc(c, d, s, j, cj);
	if (timed)
		CU(c, cuEventRecord)(cj->start, s->st);
	if (cj->path == CUDA_PATH_KERNEL && issue_kernel(c, d, s, j, cj)) {
		cj->path = CUDA_PATH_COPY; /* ring full or launch refused: the copies still work */
		cj->sh = NULL;
	}
	if (cj->path == CUDA_PATH_COPY) {
		r = issue_copies(c, s->st, j);
		if (r != CUDA_SUCCESS)
			cj->err = cu_fail(c, "cuMemcpyAsync", r);
	}
	/* [gpu-crc] The checksum ran beside the copies; the job ends after both. */
	if (cj->crc_out && CU(c, cuStreamWaitEvent)(s->st, cj->crc_done, 0) != CUDA_SUCCESS)
		CU(c, cuStreamSynchronize)(d->crc_st);
	/*
	 * What was enqueued must finish before the job's buffers may go, so even a failed
	 * enqueue completes through the event; only a failed record leaves nothing to wait on.
	 */
	r = CU(c, cuEventRecord)(cj->end, s->st);
	if (r != CUDA_SUCCESS) {
		err = cu_fail(c, "cuEventRecord", r);
		CU(c, cuStreamSynchronize)(s->st);
		cj->next = d->free_jobs;
		d->free_jobs = cj;
		return err;
	}
	s->armed = 0;
	c->info.jobs[cj->path]++;
	cj->next = NULL;
	*s->tail = cj;
	s->tail = &cj->next;
	d->inflight++;
	e->inflight++;
	return COPY_QUEUED;
}

static void close_deferred(struct cuda_engine *c, struct cuda_dev *d)
{
	while (d->closing) {
		struct gpu_map *gm = d->closing;

		d->closing = gm->next;
		c->info.nclosing--;
		map_close(c, gm);
	}
}

/* Completes the jobs of one stream whose events fired, in order. wait: block for each. */
static uint32_t stream_poll(struct cuda_engine *c, struct cuda_dev *d, struct cuda_stream *s,
			    int wait)
{
	uint32_t n = 0;

	while (s->head) {
		struct cuda_job *cj = s->head;
		struct copy_job *j = cj->job;
		CUresult r = wait ? CU(c, cuEventSynchronize)(cj->end)
				  : CU(c, cuEventQuery)(cj->end);

		if (r == CUDA_ERROR_NOT_READY)
			break;
		if (r != CUDA_SUCCESS) {
			c->info.errors++;
			j->res = cu_fail(c, "a copy failed", r);
		} else {
			j->res = cj->err;
			if (cj->sh)
				shape_time(c, cj);
			if (!j->res && cj->crc_out) { /* [gpu-crc] */
				uint32_t x = 0;

				for (uint32_t b = 0; b < cj->crc_blocks; b++)
					x ^= cj->crc_out[b];
				j->crc = crc_slot_finish(x, j->crc_at, cj->crc_covered, j->crc_len);
				j->has_crc = 1;
				c->info.crc_jobs++;
			}
		}
		s->head = cj->next;
		if (!s->head)
			s->tail = &s->head;
		s->desc_tail = cj->desc_end > s->desc_tail ? cj->desc_end : s->desc_tail;
		cj->next = d->free_jobs;
		d->free_jobs = cj;
		d->inflight--;
		c->e.inflight--;
		n++;
		j->done(j);
	}
	return n;
}

static uint32_t poll_all(struct cuda_engine *c, int wait)
{
	uint32_t n = 0;
	uint64_t v;

	if (!c->e.inflight)
		return 0;
	if (read(c->e.efd, &v, sizeof(v)) < 0) {
		/* EAGAIN: polled from the loop's round, not woken */
	}
	for (uint32_t i = 0; i < c->ndev; i++) {
		struct cuda_dev *d = &c->dev[i];

		if (!d->inflight)
			continue;
		CU(c, cuCtxSetCurrent)(d->ctx);
		n += stream_poll(c, d, &d->s[COPY_TO_POOL], wait);
		n += stream_poll(c, d, &d->s[COPY_FROM_POOL], wait);
		if (!d->inflight)
			close_deferred(c, d);
	}
	return n;
}

static uint32_t cuda_poll(struct copy_engine *e)
{
	return poll_all((struct cuda_engine *)e, 0);
}

static void cuda_arm(struct copy_engine *e)
{
	struct cuda_engine *c = (struct cuda_engine *)e;

	for (uint32_t i = 0; i < c->ndev; i++) {
		for (int k = 0; k < 2; k++) {
			struct cuda_stream *s = &c->dev[i].s[k];

			if (!s->head || s->armed)
				continue;
			CU(c, cuCtxSetCurrent)(c->dev[i].ctx);
			if (CU(c, cuLaunchHostFunc)(s->st, ring_efd, c) == CUDA_SUCCESS)
				s->armed = 1;
			else if (!c->info.errors++)
				log_warn("cuda: cuLaunchHostFunc failed: completions wait for "
					 "the loop's next round");
		}
	}
}

void copy_cuda_info(struct copy_engine *e, struct cuda_info *out)
{
	*out = ((struct cuda_engine *)e)->info;
}

int cuda_shape_path(struct copy_engine *e, int dev, uint32_t dir, uint32_t nsegs, uint64_t bytes)
{
	struct cuda_engine *c = (struct cuda_engine *)e;

	for (int i = 0; i < CUDA_SHAPES; i++) {
		const struct shape *sh = &c->shapes[i];

		if (sh->used && sh->dev == dev && sh->dir == dir && sh->nsegs == nsegs &&
		    sh->bytes == bytes)
			return sh->choice;
	}
	return -1;
}

/* ---- set-up and teardown ---- */

static void dev_fini(struct cuda_engine *c, struct cuda_dev *d)
{
	if (!d->ctx)
		return;
	CU(c, cuCtxSetCurrent)(d->ctx);
	while (d->free_jobs) {
		struct cuda_job *cj = d->free_jobs;

		d->free_jobs = cj->next;
		CU(c, cuEventDestroy)(cj->start);
		CU(c, cuEventDestroy)(cj->end);
		if (cj->crc_done)
			CU(c, cuEventDestroy)(cj->crc_done);
		free(cj);
	}
	close_deferred(c, d);
	while (d->nmaps) {
		struct gpu_map *gm = d->maps[--d->nmaps];

		map_close(c, gm);
	}
	free(d->maps);
	for (int k = 0; k < 2; k++) {
		if (d->s[k].st)
			CU(c, cuStreamDestroy)(d->s[k].st);
		if (d->s[k].desc)
			CU(c, cuMemFreeHost)(d->s[k].desc);
	}
	if (d->crc_st)
		CU(c, cuStreamDestroy)(d->crc_st);
	if (d->mod)
		CU(c, cuModuleUnload)(d->mod);
	CU(c, cuDevicePrimaryCtxRelease)(d->dev);
	d->ctx = NULL;
}

static void cuda_destroy(struct copy_engine *e)
{
	struct cuda_engine *c = (struct cuda_engine *)e;

	poll_all(c, 1); /* every job in flight finishes and completes */
	if (c->ndev)
		CU(c, cuCtxSetCurrent)(c->dev[0].ctx);
	for (uint32_t i = 0; i < c->nchunks; i++)
		CU(c, cuMemHostUnregister)(c->chunks[i].host);
	for (uint32_t i = 0; i < c->ndev; i++)
		dev_fini(c, &c->dev[i]);
	free(c->chunks);
	free(c->bdst);
	free(c->bsrc);
	free(c->bsize);
	if (c->e.efd >= 0)
		close(c->e.efd);
	kvb_cuda_unload(c->owned_api);
	free(c);
}

static int dev_init(struct cuda_engine *c, const struct cuda_opts *o, int ord)
{
	struct cuda_dev *d = &c->dev[ord];
	CUresult r;

	if ((r = CU(c, cuDeviceGet)(&d->dev, ord)) != CUDA_SUCCESS ||
	    (r = CU(c, cuDeviceGetUuid)(&d->uuid, d->dev)) != CUDA_SUCCESS ||
	    (r = CU(c, cuDevicePrimaryCtxRetain)(&d->ctx, d->dev)) != CUDA_SUCCESS)
		return cu_fail(c, "device set-up", r);
	CU(c, cuCtxSetCurrent)(d->ctx);
	for (int k = 0; k < 2; k++) {
		struct cuda_stream *s = &d->s[k];
		void *p = NULL;

		s->tail = &s->head;
		if ((r = CU(c, cuStreamCreate)(&s->st, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS ||
		    (r = CU(c, cuMemHostAlloc)(&p, CUDA_DESC_BYTES,
					       CU_MEMHOSTALLOC_DEVICEMAP |
						       CU_MEMHOSTALLOC_PORTABLE)) != CUDA_SUCCESS)
			return cu_fail(c, "stream set-up", r);
		s->desc = p;
		if ((r = CU(c, cuMemHostGetDevicePointer)(&s->desc_d, p, 0)) != CUDA_SUCCESS)
			return cu_fail(c, "descriptor ring mapping", r);
	}
	if (!o->fatbin)
		return 0;
	r = CU(c, cuModuleLoadData)(&d->mod, o->fatbin);
	if (r != CUDA_SUCCESS) {
		d->mod = NULL;
		cu_fail(c, "loading the kernels (copies only, PUT checksums from the pool)", r);
		return 0;
	}
	if (o->path != CUDA_PATH_COPY &&
	    (r = CU(c, cuModuleGetFunction)(&d->fn, d->mod, "kvb_copy_segs")) != CUDA_SUCCESS) {
		cu_fail(c, "the gather/scatter kernel (copies only)", r);
		d->fn = NULL;
	}
	r = CU(c, cuModuleGetFunction)(&d->crc_fn, d->mod, "kvb_crc_segs");
	if (r == CUDA_SUCCESS)
		r = CU(c, cuStreamCreate)(&d->crc_st, CU_STREAM_NON_BLOCKING);
	if (r != CUDA_SUCCESS) {
		cu_fail(c, "the checksum kernel (PUT checksums from the pool)", r);
		d->crc_fn = NULL;
	}
	return 0;
}

/*
 * Registers [host, host + len) with the driver and maps it on every device, as one chunk, in
 * address order. 0 or a negative errno, with nothing left registered.
 */
static int chunk_add(struct cuda_engine *c, void *host, uint64_t len)
{
	struct cuda_chunk ch = {.host = host, .len = len};
	CUresult r;
	int at;

	if (c->nchunks == c->chunk_cap) {
		uint32_t cap = c->chunk_cap ? 2 * c->chunk_cap : 64;
		struct cuda_chunk *n = realloc(c->chunks, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		c->chunks = n;
		c->chunk_cap = cap;
	}
	CU(c, cuCtxSetCurrent)(c->dev[0].ctx);
	r = CU(c, cuMemHostRegister)(host, len,
				     CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
	if (r != CUDA_SUCCESS)
		return cu_fail(c, "cuMemHostRegister of pool memory", r);
	for (uint32_t i = 0; i < c->ndev; i++) {
		CU(c, cuCtxSetCurrent)(c->dev[i].ctx);
		r = CU(c, cuMemHostGetDevicePointer)(&ch.dptr[i], host, 0);
		if (r != CUDA_SUCCESS) {
			CU(c, cuCtxSetCurrent)(c->dev[0].ctx);
			CU(c, cuMemHostUnregister)(host);
			return cu_fail(c, "pool device mapping", r);
		}
	}
	at = chunk_floor(c, host) + 1;
	memmove(&c->chunks[at + 1], &c->chunks[at], (c->nchunks - (uint32_t)at) * sizeof(ch));
	c->chunks[at] = ch;
	c->nchunks++;
	c->info.nchunks = c->nchunks;
	c->info.pinned_bytes += len;
	return 0;
}

/* Registers the pool in chunks of at most chunk_max bytes, timed. */
static int pin_pool(struct cuda_engine *c, const struct cuda_opts *o)
{
	uint64_t max = o->chunk_max ? o->chunk_max : CUDA_CHUNK_MAX;
	double t0 = clock_now();

	for (uint32_t a = 0; a < o->npool; a++) {
		for (uint64_t off = 0; off < o->pool[a].len; off += max) {
			int err = chunk_add(c, (uint8_t *)o->pool[a].base + off,
					    o->pool[a].len - off < max ? o->pool[a].len - off
								       : max);

			if (err)
				return err;
		}
	}
	c->info.pin_seconds = clock_now() - t0;
	if (o->npool)
		log_info("cuda: pinned the pool, %llu MiB in %u chunks, in %.3f s",
			 (unsigned long long)(c->info.pinned_bytes >> 20), c->nchunks,
			 c->info.pin_seconds);
	return 0;
}

int copy_cuda_pin(struct copy_engine *e, void *host, uint64_t len)
{
	struct cuda_engine *c = (struct cuda_engine *)e;
	double t0 = clock_now();
	int err = chunk_add(c, host, len);

	c->info.pin_seconds += clock_now() - t0;
	if (!err)
		c->info.pins++;
	return err;
}

int copy_cuda_unpin(struct copy_engine *e, void *host, uint64_t len)
{
	struct cuda_engine *c = (struct cuda_engine *)e;
	int i = chunk_floor(c, host);
	CUresult r;

	if (i < 0 || c->chunks[i].host != host || c->chunks[i].len != len) {
		log_warn("cuda: asked to unregister %llu bytes at %p, which are not a registered "
			 "chunk: left as they are",
			 (unsigned long long)len, host);
		return -ENOENT;
	}
	CU(c, cuCtxSetCurrent)(c->dev[0].ctx);
	r = CU(c, cuMemHostUnregister)(host);
	memmove(&c->chunks[i], &c->chunks[i + 1],
		(c->nchunks - (uint32_t)i - 1) * sizeof(*c->chunks));
	c->nchunks--;
	c->info.nchunks = c->nchunks;
	c->info.pinned_bytes -= len;
	c->info.unpins++;
	return r == CUDA_SUCCESS ? 0 : cu_fail(c, "cuMemHostUnregister of a slab", r);
}

struct copy_engine *copy_cuda_create(const struct cuda_opts *o, char *why, size_t whylen)
{
	struct cuda_engine *c = calloc(1, sizeof(*c));
	int count = 0, err;
	CUresult r;

	if (!c) {
		snprintf(why, whylen, "out of memory");
		return NULL;
	}
	c->api = o->api;
	c->path = o->path;
	c->e.name = "cuda";
	c->e.submit = cuda_submit;
	c->e.poll = cuda_poll;
	c->e.arm = cuda_arm;
	c->e.destroy = cuda_destroy;
	c->e.gpu_open = cuda_gpu_open;
	c->e.gpu_put = gpu_map_put;
	c->e.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (c->e.efd < 0) {
		snprintf(why, whylen, "eventfd: %s", strerror(errno));
		free(c);
		return NULL;
	}
	r = CU(c, cuInit)(0);
	if (r == CUDA_SUCCESS)
		r = CU(c, cuDeviceGetCount)(&count);
	if (r != CUDA_SUCCESS || count <= 0) {
		snprintf(why, whylen, "%s",
			 r != CUDA_SUCCESS ? kvb_cuda_strerror(c->api, r) : "no CUDA device");
		goto err;
	}
	c->ndev = count > CUDA_MAX_DEVS ? CUDA_MAX_DEVS : (uint32_t)count;
	for (uint32_t i = 0; i < c->ndev; i++) {
		err = dev_init(c, o, (int)i);
		if (err) {
			snprintf(why, whylen, "device %u: %s", i, strerror(-err));
			goto err;
		}
	}
	err = pin_pool(c, o);
	if (err) {
		snprintf(why, whylen, "registering the pool: %s", strerror(-err));
		goto err;
	}
	c->info.ndev = c->ndev;
	return &c->e;

err:
	cuda_destroy(&c->e);
	return NULL;
}

/* ---- the broker's side ---- */

struct copy_engine *copy_cuda_open(struct broker *b)
{
	struct cuda_range pool[POOL_MAX_ARENAS];
	struct kvb_cuda_api *api;
	struct cuda_opts o = {.path = b->cfg.gpu_path};
	struct copy_engine *e;
	char why[256];

	if (kvb_cuda_load(&api, why, sizeof(why))) {
		log_info("GPU copies off: %s", why);
		return NULL;
	}
	for (uint32_t i = 0; i < b->pool.narenas; i++)
		pool[i] = (struct cuda_range){b->pool.arena[i].base, b->pool.arena[i].size};
	o.api = api;
	o.pool = pool;
	/* [slab-pin] A sparse pool is registered slab by slab (xfer.c), never whole. */
	o.npool = b->pool.sparse ? 0 : b->pool.narenas;
	o.fatbin = copy_cuda_fatbin(&o.fatbin_len);
	e = copy_cuda_create(&o, why, sizeof(why));
	if (!e) {
		log_info("GPU copies off: %s", why);
		kvb_cuda_unload(api);
		return NULL;
	}
	((struct cuda_engine *)e)->owned_api = api;
	log_info("GPU copies on: %u device(s), kernel path %s%s", ((struct cuda_engine *)e)->ndev,
		 o.fatbin ? "built in" : "not built (copies only)",
		 b->pool.sparse ? ", pool memory registered slab by slab" : "");
	return e;
}

/* copy.h's gpu_open: the device by its uuid, then its mapping of the allocation. */
static int cuda_gpu_open(struct copy_engine *e, uint32_t owner, const struct copy_gpu_alloc *a,
			 struct gpu_map **gm, uint64_t *dptr, int32_t *dev)
{
	int d = cuda_dev_find(e, a->uuid), err;

	if (d < 0)
		return d;
	err = cuda_map_get(e, owner, d, a, gm, dptr);
	if (!err)
		*dev = d;
	return err;
}

cJSON *copy_cuda_stats_json(const struct broker *b)
{
	const struct cuda_engine *c = (const struct cuda_engine *)b->gpu;
	cJSON *o, *shapes;

	if (!c)
		return cJSON_CreateNull();
	o = cJSON_CreateObject();
	shapes = cJSON_CreateArray();
	cJSON_AddNumberToObject(o, "devices", c->ndev);
	cJSON_AddNumberToObject(o, "pin_seconds", c->info.pin_seconds);
	cJSON_AddNumberToObject(o, "pinned_bytes", (double)c->info.pinned_bytes);
	cJSON_AddNumberToObject(o, "pin_chunks", c->nchunks);
	cJSON_AddNumberToObject(o, "slab_pins", (double)c->info.pins);
	cJSON_AddNumberToObject(o, "slab_unpins", (double)c->info.unpins);
	cJSON_AddNumberToObject(o, "open_handles", c->info.nmaps);
	cJSON_AddNumberToObject(o, "jobs_copy", (double)c->info.jobs[CUDA_PATH_COPY]);
	cJSON_AddNumberToObject(o, "jobs_kernel", (double)c->info.jobs[CUDA_PATH_KERNEL]);
	cJSON_AddNumberToObject(o, "crc_gpu", (double)c->info.crc_jobs);
	cJSON_AddNumberToObject(o, "errors", (double)c->info.errors);
	for (int i = 0; i < CUDA_SHAPES; i++) {
		const struct shape *sh = &c->shapes[i];
		cJSON *x;

		if (!sh->used || sh->choice < 0)
			continue;
		x = cJSON_CreateObject();
		cJSON_AddNumberToObject(x, "device", sh->dev);
		cJSON_AddStringToObject(x, "dir", sh->dir == COPY_TO_POOL ? "d2h" : "h2d");
		cJSON_AddNumberToObject(x, "segments", sh->nsegs);
		cJSON_AddNumberToObject(x, "bytes", (double)sh->bytes);
		cJSON_AddStringToObject(x, "path", sh->choice ? "kernel" : "copy");
		cJSON_AddItemToArray(shapes, x);
	}
	cJSON_AddItemToObject(o, "shapes", shapes);
	return o;
}

#else /* !KVB_HAVE_CUDA: GPU copies are off, and say why */

struct copy_engine *copy_cuda_open(struct broker *b)
{
	(void)b;
	log_info("GPU copies off: built without CUDA headers");
	return NULL;
}

cJSON *copy_cuda_stats_json(const struct broker *b)
{
	(void)b;
	return cJSON_CreateNull();
}

int copy_cuda_pin(struct copy_engine *e, void *host, uint64_t len)
{
	(void)e, (void)host, (void)len;
	return -ENODEV;
}

int copy_cuda_unpin(struct copy_engine *e, void *host, uint64_t len)
{
	(void)e, (void)host, (void)len;
	return -ENODEV;
}

#endif /* KVB_HAVE_CUDA */
