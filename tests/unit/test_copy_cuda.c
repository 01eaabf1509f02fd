// SPDX-License-Identifier: MIT
/*
 * test_copy_cuda.c - the CUDA copy engine's logic against a fake driver table: no GPU needed.
 *
 * The fake driver keeps "device memory" in host memory (a device pointer is a host address),
 * so copies and the gather/scatter kernel really move bytes and the tests check them. Events
 * complete when a test says so (or at once with auto_complete), and report the elapsed time the
 * test chose for the path that ran, so path calibration is deterministic.
 *
 * Covered: device matching by UUID, no device, the pool registered in chunks, the per-client
 * handle cache (IPC and cuMem fds, sizes checked against the driver's), bounds checks before
 * anything is issued, coalescing, batched copies (and the fallback when the driver refuses
 * them), path choice by measurement, completion by events, errors
 * from the driver (a failed copy, a failed enqueue), and a client dying mid-copy: its handle
 * closes only after its copies completed. Skipped (77) in a build without the CUDA headers.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "broker.h"
#include "copy.h"
#include "copy_cuda.h"
#include "crccopy.h"
#include "cuda_api.h"
#include "../fake/crc_segs_emu.h"
#include "slot.h"

#ifdef KVB_HAVE_CUDA

/* ---- the fake driver ---- */

struct fstream {
	int last_path; /* what ran last on it: 0 copies, 1 kernel */
};

struct fevent {
	int done, path;
	CUstream st;
};

#define FMAX 16
static struct {
	int ndev;
	CUresult init_res;
	int auto_complete;
	CUresult query_res, memcpy_res;
	float ms[2];
	int registers, unregisters;
	size_t reg_len[FMAX];
	unsigned reg_flags;
	int ipc_opens, ipc_closes, imports, maps, unmaps, releases;
	int memcpys, launches, host_funcs, batches;
	int crc_launches, no_crc_fn, waits;
	CUresult crc_launch_res;
	CUresult batch_res;
	uint64_t alloc_base[FMAX], alloc_size[FMAX]; /* fake allocations (fd = index) */
	int nallocs;
	int closes_after_done; /* closes seen while the test's done() had run */
	struct fevent *events[256];
	int nevents;
} F;

static CUresult f_init(unsigned f)
{
	(void)f;
	return F.init_res;
}
static CUresult f_err_string(CUresult r, const char **s)
{
	(void)r;
	*s = "fake error";
	return CUDA_SUCCESS;
}
static CUresult f_dev_count(int *n)
{
	*n = F.ndev;
	return CUDA_SUCCESS;
}
static CUresult f_dev_get(CUdevice *d, int ord)
{
	*d = ord;
	return CUDA_SUCCESS;
}
static CUresult f_dev_uuid(CUuuid *u, CUdevice d)
{
	memset(u->bytes, 0xa0 + d, sizeof(u->bytes));
	return CUDA_SUCCESS;
}
static CUresult f_ctx_retain(CUcontext *c, CUdevice d)
{
	*c = (CUcontext)(uintptr_t)(0x1000 + d);
	return CUDA_SUCCESS;
}
static CUresult f_ctx_release(CUdevice d)
{
	(void)d;
	return CUDA_SUCCESS;
}
static CUresult f_ctx_set(CUcontext c)
{
	(void)c;
	return CUDA_SUCCESS;
}
static CUresult f_stream_create(CUstream *s, unsigned f)
{
	(void)f;
	*s = (CUstream)calloc(1, sizeof(struct fstream));
	return CUDA_SUCCESS;
}
static CUresult f_stream_destroy(CUstream s)
{
	free(s);
	return CUDA_SUCCESS;
}
static CUresult f_stream_wait(CUstream s, CUevent e, unsigned f)
{
	(void)s, (void)e, (void)f;
	F.waits++;
	return CUDA_SUCCESS;
}
static CUresult f_stream_sync(CUstream s)
{
	for (int i = 0; i < F.nevents; i++)
		if (F.events[i] && F.events[i]->st == s)
			F.events[i]->done = 1;
	return CUDA_SUCCESS;
}
static CUresult f_event_create(CUevent *e, unsigned f)
{
	struct fevent *ev = calloc(1, sizeof(*ev));

	(void)f;
	F.events[F.nevents++] = ev;
	*e = (CUevent)ev;
	return CUDA_SUCCESS;
}
static CUresult f_event_destroy(CUevent e)
{
	for (int i = 0; i < F.nevents; i++)
		if (F.events[i] == (struct fevent *)e)
			F.events[i] = NULL;
	free(e);
	return CUDA_SUCCESS;
}
static CUresult f_event_record(CUevent e, CUstream s)
{
	struct fevent *ev = (struct fevent *)e;

	ev->st = s;
	ev->done = F.auto_complete;
	ev->path = ((struct fstream *)s)->last_path;
	return CUDA_SUCCESS;
}
static CUresult f_event_query(CUevent e)
{
	if (!((struct fevent *)e)->done)
		return CUDA_ERROR_NOT_READY;
	return F.query_res;
}
static CUresult f_event_sync(CUevent e)
{
	((struct fevent *)e)->done = 1;
	return F.query_res;
}
static CUresult f_event_elapsed(float *ms, CUevent a, CUevent b)
{
	(void)a;
	*ms = F.ms[((struct fevent *)b)->path];
	return CUDA_SUCCESS;
}
static CUresult f_host_func(CUstream s, CUhostFn fn, void *arg)
{
	(void)s;
	fn(arg); /* rings the engine's eventfd */
	F.host_funcs++;
	return CUDA_SUCCESS;
}
static CUresult f_htod(CUdeviceptr d, const void *h, size_t n, CUstream s)
{
	if (F.memcpy_res != CUDA_SUCCESS)
		return F.memcpy_res;
	memcpy((void *)(uintptr_t)d, h, n);
	F.memcpys++;
	((struct fstream *)s)->last_path = 0;
	return CUDA_SUCCESS;
}
static CUresult f_dtoh(void *h, CUdeviceptr d, size_t n, CUstream s)
{
	if (F.memcpy_res != CUDA_SUCCESS)
		return F.memcpy_res;
	memcpy(h, (const void *)(uintptr_t)d, n);
	F.memcpys++;
	((struct fstream *)s)->last_path = 0;
	return CUDA_SUCCESS;
}
static CUresult f_batch(CUdeviceptr *d, CUdeviceptr *src, size_t *n, size_t count,
			CUmemcpyAttributes *attrs, size_t *idx, size_t nattrs, CUstream s)
{
	assert_int_equal(nattrs, 1);
	assert_int_equal(idx[0], 0);
	assert_int_equal(attrs[0].srcAccessOrder, CU_MEMCPY_SRC_ACCESS_ORDER_STREAM);
	if (F.batch_res != CUDA_SUCCESS)
		return F.batch_res;
	for (size_t i = 0; i < count; i++)
		memcpy((void *)(uintptr_t)d[i], (const void *)(uintptr_t)src[i], n[i]);
	F.batches++;
	((struct fstream *)s)->last_path = 0;
	return CUDA_SUCCESS;
}
static CUresult f_host_register(void *p, size_t n, unsigned flags)
{
	(void)p;
	F.reg_len[F.registers++ % FMAX] = n;
	F.reg_flags = flags;
	return CUDA_SUCCESS;
}
static CUresult f_host_unregister(void *p)
{
	(void)p;
	F.unregisters++;
	return CUDA_SUCCESS;
}
static CUresult f_host_devptr(CUdeviceptr *d, void *p, unsigned f)
{
	(void)f;
	*d = (CUdeviceptr)(uintptr_t)p; /* the fake maps host memory at the same address */
	return CUDA_SUCCESS;
}
static CUresult f_host_alloc(void **p, size_t n, unsigned f)
{
	(void)f;
	*p = malloc(n);
	return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult f_free_host(void *p)
{
	free(p);
	return CUDA_SUCCESS;
}
static CUresult f_addr_range(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	for (int i = 0; i < F.nallocs; i++) {
		if (p >= F.alloc_base[i] && p < F.alloc_base[i] + F.alloc_size[i]) {
			*base = F.alloc_base[i];
			*size = F.alloc_size[i];
			return CUDA_SUCCESS;
		}
	}
	return CUDA_ERROR_INVALID_VALUE;
}
static CUresult f_ipc_open(CUdeviceptr *p, CUipcMemHandle h, unsigned f)
{
	int i;

	(void)f;
	memcpy(&i, h.reserved, sizeof(i));
	if (i < 0 || i >= F.nallocs)
		return CUDA_ERROR_INVALID_HANDLE;
	*p = F.alloc_base[i];
	F.ipc_opens++;
	return CUDA_SUCCESS;
}
static CUresult f_ipc_close(CUdeviceptr p)
{
	(void)p;
	F.ipc_closes++;
	return CUDA_SUCCESS;
}
/* An fd is the index of a fake allocation; reserving returns where it lives. */
static int last_import;
static CUresult f_import(CUmemGenericAllocationHandle *h, void *os, CUmemAllocationHandleType t)
{
	(void)t;
	last_import = (int)(uintptr_t)os;
	*h = (CUmemGenericAllocationHandle)(uintptr_t)os;
	F.imports++;
	return CUDA_SUCCESS;
}
static CUresult f_reserve(CUdeviceptr *p, size_t n, size_t a, CUdeviceptr want,
			  unsigned long long f)
{
	(void)n, (void)a, (void)want, (void)f;
	*p = F.alloc_base[last_import];
	return CUDA_SUCCESS;
}
static CUresult f_map(CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h,
		      unsigned long long f)
{
	(void)p, (void)off, (void)f;
	if (h >= (uint64_t)F.nallocs || n > F.alloc_size[h])
		return CUDA_ERROR_INVALID_VALUE;
	F.maps++;
	return CUDA_SUCCESS;
}
static CUresult f_set_access(CUdeviceptr p, size_t n, const CUmemAccessDesc *d, size_t c)
{
	(void)p, (void)n, (void)d, (void)c;
	return CUDA_SUCCESS;
}
static CUresult f_unmap(CUdeviceptr p, size_t n)
{
	(void)p, (void)n;
	F.unmaps++;
	return CUDA_SUCCESS;
}
static CUresult f_addr_free(CUdeviceptr p, size_t n)
{
	(void)p, (void)n;
	return CUDA_SUCCESS;
}
static CUresult f_release(CUmemGenericAllocationHandle h)
{
	(void)h;
	F.releases++;
	return CUDA_SUCCESS;
}
static CUresult f_module_load(CUmodule *m, const void *img)
{
	(void)img;
	*m = (CUmodule)(uintptr_t)0x77;
	return CUDA_SUCCESS;
}
static CUresult f_module_unload(CUmodule m)
{
	(void)m;
	return CUDA_SUCCESS;
}
#define FN_COPY ((CUfunction)(uintptr_t)0x88)
#define FN_CRC ((CUfunction)(uintptr_t)0x99)
static CUresult f_module_fn(CUfunction *fn, CUmodule m, const char *name)
{
	(void)m;
	if (!strcmp(name, "kvb_crc_segs")) {
		if (F.no_crc_fn)
			return CUDA_ERROR_NOT_FOUND;
		*fn = FN_CRC;
		return CUDA_SUCCESS;
	}
	assert_string_equal(name, "kvb_copy_segs");
	*fn = FN_COPY;
	return CUDA_SUCCESS;
}
/* The kernels, on the host: each walks the descriptor table it was given. */
static CUresult f_launch(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
			 unsigned by, unsigned bz, unsigned sh, CUstream s, void **args, void **ex)
{
	const uint64_t *t = (const uint64_t *)(uintptr_t) * (CUdeviceptr *)args[0];
	unsigned n = *(unsigned *)args[1];

	(void)gz, (void)by, (void)bz, (void)sh, (void)ex;
	if (fn == FN_CRC) {
		if (F.crc_launch_res)
			return F.crc_launch_res;
		crc_segs_emu(t, n, gx, gy, bx, (uint32_t *)(uintptr_t) * (CUdeviceptr *)args[2]);
		F.crc_launches++;
		return CUDA_SUCCESS;
	}
	for (unsigned i = 0; i < n; i++)
		memcpy((void *)(uintptr_t)t[3 * i], (const void *)(uintptr_t)t[3 * i + 1],
		       t[3 * i + 2]);
	F.launches++;
	((struct fstream *)s)->last_path = 1;
	return CUDA_SUCCESS;
}

static struct kvb_cuda_api api;

static void fake_reset(void)
{
	for (int i = 0; i < F.nevents; i++)
		free(F.events[i]);
	memset(&F, 0, sizeof(F));
	F.ndev = 2;
	F.auto_complete = 1;
	F.ms[0] = F.ms[1] = 1.0f;
	memset(&api, 0, sizeof(api));
	api.cuInit = f_init;
	api.cuGetErrorString = f_err_string;
	api.cuDeviceGetCount = f_dev_count;
	api.cuDeviceGet = f_dev_get;
	api.cuDeviceGetUuid = f_dev_uuid;
	api.cuDevicePrimaryCtxRetain = f_ctx_retain;
	api.cuDevicePrimaryCtxRelease = f_ctx_release;
	api.cuCtxSetCurrent = f_ctx_set;
	api.cuStreamCreate = f_stream_create;
	api.cuStreamDestroy = f_stream_destroy;
	api.cuStreamSynchronize = f_stream_sync;
	api.cuStreamWaitEvent = f_stream_wait;
	api.cuEventCreate = f_event_create;
	api.cuEventDestroy = f_event_destroy;
	api.cuEventRecord = f_event_record;
	api.cuEventQuery = f_event_query;
	api.cuEventSynchronize = f_event_sync;
	api.cuEventElapsedTime = f_event_elapsed;
	api.cuLaunchHostFunc = f_host_func;
	api.cuMemcpyHtoDAsync = f_htod;
	api.cuMemcpyDtoHAsync = f_dtoh;
	api.cuMemHostRegister = f_host_register;
	api.cuMemHostUnregister = f_host_unregister;
	api.cuMemHostGetDevicePointer = f_host_devptr;
	api.cuMemHostAlloc = f_host_alloc;
	api.cuMemFreeHost = f_free_host;
	api.cuMemGetAddressRange = f_addr_range;
	api.cuIpcOpenMemHandle = f_ipc_open;
	api.cuIpcCloseMemHandle = f_ipc_close;
	api.cuMemImportFromShareableHandle = f_import;
	api.cuMemAddressReserve = f_reserve;
	api.cuMemMap = f_map;
	api.cuMemSetAccess = f_set_access;
	api.cuMemUnmap = f_unmap;
	api.cuMemAddressFree = f_addr_free;
	api.cuMemRelease = f_release;
	api.cuModuleLoadData = f_module_load;
	api.cuModuleUnload = f_module_unload;
	api.cuModuleGetFunction = f_module_fn;
	api.cuLaunchKernel = f_launch;
}

/* ---- fixture: a 1 MiB pool, two devices, two fake GPU allocations ---- */

#define POOL (1u << 20)
#define GPUMEM (256u << 10)

struct fx {
	uint8_t *pool;
	uint8_t *gpu[2];
	struct copy_engine *e;
	struct cuda_range range;
	int done, res;
	int closes_at_done;
};

static struct fx X;

static void on_done(struct copy_job *j)
{
	X.done++;
	X.res = j->res;
	X.closes_at_done = F.ipc_closes;
}

static struct copy_engine *make_engine(int path, uint64_t chunk_max)
{
	static const uint8_t fatbin[16] = {1};
	struct cuda_opts o = {.api = &api,
			      .pool = &X.range,
			      .npool = 1,
			      .chunk_max = chunk_max,
			      .path = path,
			      .fatbin = fatbin,
			      .fatbin_len = sizeof(fatbin)};
	char why[128];

	return copy_cuda_create(&o, why, sizeof(why));
}

static int setup(void **state)
{
	fake_reset();
	memset(&X, 0, sizeof(X));
	X.pool = calloc(1, POOL);
	X.range = (struct cuda_range){X.pool, POOL};
	for (int i = 0; i < 2; i++) {
		X.gpu[i] = calloc(1, GPUMEM);
		F.alloc_base[i] = (uint64_t)(uintptr_t)X.gpu[i];
		F.alloc_size[i] = GPUMEM;
	}
	F.nallocs = 2;
	X.e = make_engine(CUDA_PATH_AUTO, 0);
	*state = &X;
	return X.e ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	if (X.e)
		X.e->destroy(X.e);
	free(X.pool);
	free(X.gpu[0]);
	free(X.gpu[1]);
	return 0;
}

static struct copy_gpu_alloc ipc_msg(int alloc)
{
	struct copy_gpu_alloc m = {.kind = COPY_GPU_IPC,
				   .key = 0x7f0000000000ull + (uint64_t)alloc,
				   .size = GPUMEM,
				   .fd = -1};

	memcpy(m.handle, &alloc, sizeof(alloc));
	memset(m.uuid, 0xa0, sizeof(m.uuid));
	return m;
}

static struct copy_job *job_new(int dev, uint32_t dir, uint32_t nsegs)
{
	struct copy_job *j = calloc(1, sizeof(*j) + nsegs * sizeof(struct copy_seg));

	j->segs = (struct copy_seg *)(j + 1);
	j->dev = dev;
	j->dir = dir;
	j->done = on_done;
	return j;
}

static void seg(struct copy_job *j, void *dst, const void *src, uint64_t len)
{
	j->segs[j->nsegs++] = (struct copy_seg){dst, src, len};
	j->bytes += len;
}

/* Every event recorded so far fires. */
static void fire_all(void)
{
	for (int i = 0; i < F.nevents; i++)
		if (F.events[i])
			F.events[i]->done = 1;
}

/* ---- tests ---- */

static void test_copy_cuda_device_by_uuid(void **state)
{
	uint8_t u[16];

	(void)state;
	memset(u, 0xa1, sizeof(u));
	assert_int_equal(cuda_dev_find(X.e, u), 1);
	memset(u, 0xa0, sizeof(u));
	assert_int_equal(cuda_dev_find(X.e, u), 0);
	memset(u, 0xa7, sizeof(u));
	assert_int_equal(cuda_dev_find(X.e, u), -ENODEV);
}

static void test_copy_cuda_no_device(void **state)
{
	char why[128];
	struct cuda_opts o = {.api = &api, .pool = &X.range, .npool = 1};

	(void)state;
	F.ndev = 0;
	assert_null(copy_cuda_create(&o, why, sizeof(why)));
	assert_string_equal(why, "no CUDA device");
	F.ndev = 1;
	F.init_res = CUDA_ERROR_NO_DEVICE;
	assert_null(copy_cuda_create(&o, why, sizeof(why)));
	assert_string_equal(why, "fake error");
}

static void test_copy_cuda_pool_pinned_in_chunks(void **state)
{
	struct cuda_info in;
	struct copy_engine *e;

	(void)state;
	F.registers = F.unregisters = 0;
	e = make_engine(CUDA_PATH_AUTO, 384u << 10);
	assert_non_null(e);
	assert_int_equal(F.registers, 3);
	assert_int_equal(F.reg_len[0], 384u << 10);
	assert_int_equal(F.reg_len[1], 384u << 10);
	assert_int_equal(F.reg_len[2], POOL - (768u << 10));
	assert_int_equal(F.reg_flags, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
	copy_cuda_info(e, &in);
	assert_int_equal(in.nchunks, 3);
	assert_int_equal(in.pinned_bytes, POOL);
	assert_int_equal(in.ndev, 2);
	e->destroy(e);
	assert_int_equal(F.unregisters, 3);
}

static void test_copy_cuda_handle_cache(void **state)
{
	struct copy_gpu_alloc m = ipc_msg(0);
	struct gpu_map *a, *b, *c;
	uint64_t pa, pb, pc;

	(void)state;
	assert_int_equal(cuda_map_get(X.e, 7, 0, &m, &a, &pa), 0);
	assert_int_equal(cuda_map_get(X.e, 7, 0, &m, &b, &pb), 0);
	assert_ptr_equal(a, b); /* one open per client and allocation */
	assert_int_equal(pa, (uint64_t)(uintptr_t)X.gpu[0]);
	assert_int_equal(F.ipc_opens, 1);
	assert_int_equal(cuda_map_get(X.e, 8, 0, &m, &c, &pc), 0);
	assert_ptr_not_equal(a, c); /* another client opens its own */
	assert_int_equal(F.ipc_opens, 2);
	gpu_map_put(X.e, a);
	assert_int_equal(F.ipc_closes, 0);
	gpu_map_put(X.e, b);
	assert_int_equal(F.ipc_closes, 1);
	gpu_map_put(X.e, c);
	assert_int_equal(F.ipc_closes, 2);

	/* A claimed size past the driver's: refused, closed again. */
	m.size = 2 * GPUMEM;
	assert_int_equal(cuda_map_get(X.e, 7, 0, &m, &a, &pa), -EFAULT);
	assert_int_equal(F.ipc_closes, 3);
	/* A bad handle: the driver's error. */
	m = ipc_msg(9);
	assert_int_equal(cuda_map_get(X.e, 7, 0, &m, &a, &pa), -EINVAL);
}

static void test_copy_cuda_fd_import(void **state)
{
	struct copy_gpu_alloc m = ipc_msg(1);
	struct gpu_map *a;
	uint64_t pa = 0;

	(void)state;
	m.kind = COPY_GPU_FD;
	m.fd = 1;
	assert_int_equal(cuda_map_get(X.e, 7, 1, &m, &a, &pa), 0);
	assert_int_equal(pa, (uint64_t)(uintptr_t)X.gpu[1]);
	assert_int_equal(F.imports, 1);
	assert_int_equal(F.maps, 1);
	gpu_map_put(X.e, a);
	assert_int_equal(F.unmaps, 1);
	assert_int_equal(F.releases, 1);
	/* Larger than the allocation: cuMemMap refuses, everything is undone. */
	m.size = 2 * GPUMEM;
	assert_int_equal(cuda_map_get(X.e, 7, 1, &m, &a, &pa), -EINVAL);
	assert_int_equal(F.releases, 2);
	assert_int_equal(F.unmaps, 1);
}

static void test_copy_cuda_get_coalesced_by_events(void **state)
{
	struct copy_gpu_alloc m = ipc_msg(0);
	struct copy_job *j = job_new(0, COPY_FROM_POOL, 4);
	struct gpu_map *gm;
	uint64_t base;

	(void)state;
	assert_int_equal(cuda_map_get(X.e, 7, 0, &m, &gm, &base), 0);
	for (int i = 0; i < 4096; i++)
		X.pool[i] = (uint8_t)(i * 7);
	/* Four contiguous parts: one copy. */
	for (int i = 0; i < 4; i++)
		seg(j, (void *)(uintptr_t)(base + 100 + 1024u * i), X.pool + 1024 * i, 1024);
	F.auto_complete = 0;
	assert_int_equal(X.e->submit(X.e, j), COPY_QUEUED);
	assert_int_equal(j->nsegs, 1);
	assert_int_equal(F.memcpys, 1);
	assert_int_equal(X.e->inflight, 1);
	assert_int_equal(X.e->poll(X.e), 0); /* the event has not fired */
	assert_int_equal(X.done, 0);
	X.e->destroy(X.e); /* waits for the event: completes the job */
	X.e = NULL;
	assert_int_equal(X.done, 1);
	assert_int_equal(X.res, 0);
	assert_memory_equal(X.gpu[0] + 100, X.pool, 4096);
	free(j);
}

static void test_copy_cuda_completion_order(void **state)
{
	struct copy_gpu_alloc m = ipc_msg(0);
	struct copy_job *j = job_new(0, COPY_TO_POOL, 1);
	struct gpu_map *gm;
	uint64_t base;

	(void)state;
	assert_int_equal(cuda_map_get(X.e, 7, 0, &m, &gm, &base), 0);
	memset(X.gpu[0], 0x5c, 512);
	seg(j, X.pool + 8192, (void *)(uintptr_t)base, 512);
	F.auto_complete = 0;
	assert_int_equal(X.e->submit(X.e, j), COPY_QUEUED);
	assert_int_equal(X.e->poll(X.e), 0);
	/* No host callback per job; one behind the last job when the loop goes to sleep. */
	assert_int_equal(F.host_funcs, 0);
	X.e->arm(X.e);
	X.e->arm(X.e);
	assert_int_equal(F.host_funcs, 1);
	fire_all();
	assert_int_equal(X.e->poll(X.e), 1);
	assert_int_equal(X.done, 1);
	assert_int_equal(X.res, 0);
	assert_int_equal(X.e->inflight, 0);
	assert_int_equal(X.pool[8192], 0x5c);
	assert_int_equal(X.pool[8192 + 511], 0x5c);
	gpu_map_put(X.e, gm);
	free(j);
}

static void test_copy_cuda_bounds(void **state)
{
	struct copy_gpu_alloc m = ipc_msg(0);
	struct copy_job *j = job_new(0, COPY_FROM_POOL, 2);
	struct gpu_map *gm;
	uint64_t base;

	(void)state;
	assert_int_equal(cuda_map_get(X.e, 7, 0, &m, &gm, &base), 0);
	/* Past the end of the client's allocation, by one byte. */
	seg(j, (void *)(uintptr_t)(base + GPUMEM - 64), X.pool, 65);
	assert_int_equal(X.e->submit(X.e, j), -EFAULT);
	/* Outside the pool. */
	j->nsegs = 0;
	seg(j, (void *)(uintptr_t)base, X.pool + POOL - 8, 16);
	assert_int_equal(X.e->submit(X.e, j), -EFAULT);
	/* On another device than the one the allocation was opened on. */
	j->nsegs = 0;
	j->dev = 1;
	seg(j, (void *)(uintptr_t)base, X.pool, 16);
	assert_int_equal(X.e->submit(X.e, j), -EFAULT);
	j->dev = 5;
	assert_int_equal(X.e->submit(X.e, j), -EINVAL);
	/* An unregistered allocation is out of range too. */
	gpu_map_put(X.e, gm);
	j->dev = 0;
	assert_int_equal(X.e->submit(X.e, j), -EFAULT);
	assert_int_equal(F.memcpys, 0);
	assert_int_equal(F.launches, 0);
	assert_int_equal(X.e->inflight, 0);
	free(j);
}

/*
 * [slab-pin] A sparse pool: nothing registered at creation, slabs pinned and unpinned one by
 * one (out of address order), and every job checked against the slabs registered now.
 */
static void test_copy_cuda_slab_pins(void **state)
{
	static const uint8_t fatbin[16] = {1};
	struct cuda_opts o = {.api = &api,
			      .path = CUDA_PATH_AUTO,
			      .fatbin = fatbin,
			      .fatbin_len = sizeof(fatbin)};
	struct copy_gpu_alloc m = ipc_msg(0);
	struct copy_job *j = job_new(0, COPY_FROM_POOL, 1);
	const uint64_t S = 64u << 10;
	struct copy_engine *e;
	struct cuda_info in;
	struct gpu_map *gm;
	uint64_t base;
	char why[128];

	(void)state;
	F.registers = F.unregisters = 0;
	e = copy_cuda_create(&o, why, sizeof(why));
	assert_non_null(e);
	assert_int_equal(F.registers, 0);
	assert_int_equal(copy_cuda_pin(e, X.pool + 2 * S, S), 0);
	assert_int_equal(copy_cuda_pin(e, X.pool, S), 0);
	assert_int_equal(copy_cuda_pin(e, X.pool + 8 * S, S), 0);
	assert_int_equal(F.registers, 3);
	assert_int_equal(F.reg_flags, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
	copy_cuda_info(e, &in);
	assert_int_equal(in.nchunks, 3);
	assert_int_equal(in.pinned_bytes, 3 * S);
	assert_int_equal(in.pins, 3);
	assert_int_equal(cuda_map_get(e, 7, 0, &m, &gm, &base), 0);
	/* Inside a slab, at either end of the table: copied. */
	seg(j, (void *)(uintptr_t)base, X.pool + 16, 16);
	assert_int_equal(e->submit(e, j), COPY_QUEUED);
	j->nsegs = 0;
	seg(j, (void *)(uintptr_t)base, X.pool + 9 * S - 16, 16);
	assert_int_equal(e->submit(e, j), COPY_QUEUED);
	fire_all();
	assert_int_equal(e->poll(e), 2);
	/* Between slabs, and across a slab's end: refused, nothing copied. */
	j->nsegs = 0;
	seg(j, (void *)(uintptr_t)base, X.pool + S + 64, 16);
	assert_int_equal(e->submit(e, j), -EFAULT);
	j->nsegs = 0;
	seg(j, (void *)(uintptr_t)base, X.pool + 3 * S - 8, 16);
	assert_int_equal(e->submit(e, j), -EFAULT);
	/* A slab unpinned is out of range at once; only exact registrations are undone. */
	assert_int_equal(copy_cuda_unpin(e, X.pool, S), 0);
	assert_int_equal(F.unregisters, 1);
	j->nsegs = 0;
	seg(j, (void *)(uintptr_t)base, X.pool + 16, 16);
	assert_int_equal(e->submit(e, j), -EFAULT);
	assert_int_equal(copy_cuda_unpin(e, X.pool, S), -ENOENT);
	assert_int_equal(copy_cuda_unpin(e, X.pool + 2 * S, S / 2), -ENOENT);
	assert_int_equal(copy_cuda_unpin(e, X.pool + 3 * S, S), -ENOENT);
	assert_int_equal(F.unregisters, 1);
	copy_cuda_info(e, &in);
	assert_int_equal(in.nchunks, 2);
	assert_int_equal(in.pinned_bytes, 2 * S);
	assert_int_equal(in.unpins, 1);
	gpu_map_put(e, gm);
	e->destroy(e);
	assert_int_equal(F.unregisters, 3); /* the rest with the engine */
	free(j);
}

/* A page of 8 parts, each in its own place: 8 segments after coalescing. */
static struct copy_job *scattered(uint64_t base, uint32_t dir, uint32_t part)
{
	struct copy_job *j = job_new(0, dir, 8);

	for (uint32_t i = 0; i < 8; i++) {
		void *gpu = (void *)(uintptr_t)(base + i * 2 * part);
		uint8_t *pool = X.pool + i * part;

		if (dir == COPY_FROM_POOL)
			seg(j, gpu, pool, part);
		else
			seg(j, pool, gpu, part);
	}
	return j;
}

static void test_copy_cuda_path_by_measurement(void **state)
{
	struct copy_gpu_alloc m = ipc_msg(0);
	struct gpu_map *gm;
	uint64_t base;
	int kernel_runs = 0;

	(void)state;
	assert_int_equal(cuda_map_get(X.e, 7, 0, &m, &gm, &base), 0);
	/* H2D of 8 x 4 KiB: the kernel is faster. */
	F.ms[CUDA_PATH_COPY] = 2.0f;
	F.ms[CUDA_PATH_KERNEL] = 0.5f;
	for (int r = 0; r < 12; r++) {
		struct copy_job *j = scattered(base, COPY_FROM_POOL, 4096);
		int launches = F.launches;

		for (int i = 0; i < 8 * 4096; i++)
			X.pool[i] = (uint8_t)(r + i);
		memset(X.gpu[0], 0, GPUMEM);
		assert_int_equal(X.e->submit(X.e, j), COPY_QUEUED);
		assert_int_equal(X.e->poll(X.e), 1);
		assert_int_equal(X.res, 0);
		kernel_runs += F.launches - launches;
		for (uint32_t i = 0; i < 8; i++)
			assert_memory_equal(X.gpu[0] + i * 8192, X.pool + i * 4096, 4096);
		free(j);
	}
	assert_int_equal(cuda_shape_path(X.e, 0, COPY_FROM_POOL, 8, 8 * 4096), CUDA_PATH_KERNEL);
	/* 4 runs of each path measured, then the kernel every time. */
	assert_int_equal(kernel_runs, 4 + 4);

	/* D2H of 8 x 8 KiB, where the copy engines win. */
	F.ms[CUDA_PATH_COPY] = 0.2f;
	F.ms[CUDA_PATH_KERNEL] = 0.9f;
	for (int r = 0; r < 10; r++) {
		struct copy_job *j = scattered(base, COPY_TO_POOL, 8192);

		memset(X.gpu[0], r + 1, GPUMEM);
		assert_int_equal(X.e->submit(X.e, j), COPY_QUEUED);
		assert_int_equal(X.e->poll(X.e), 1);
		assert_int_equal(X.pool[8 * 8192 - 1], r + 1);
		free(j);
	}
	assert_int_equal(cuda_shape_path(X.e, 0, COPY_TO_POOL, 8, 8 * 8192), CUDA_PATH_COPY);
	/* One segment never measures: copies. */
	assert_int_equal(cuda_shape_path(X.e, 0, COPY_FROM_POOL, 1, 4096), -1);
	gpu_map_put(X.e, gm);
}

/*
 * [gpu-crc] A PUT whose segments tile its slot from the start gets the slot's crc32c from the
 * checksum kernel (the fake runs it block by block), the bytes past the page read from the
 * slot; segments that leave a gap, a missing kernel or a refused launch leave has_crc 0 (the
 * loop then reads the slot) and the PUT itself unharmed.
 */
static void test_copy_cuda_put_checksum(void **state)
{
	/*
	 * Parts of several sizes, one spanning several blocks' chunks; sources 16-byte aligned
	 * (the kernel's 4-bytes-at-a-time loop) or not (its byte loop).
	 */
	static const uint32_t part[4] = {4096, 1000, 200704, 24}, pad[4] = {0, 3, 8, 13};
	const uint64_t slot_len = 256u << 10;
	struct copy_gpu_alloc m = ipc_msg(0);
	struct gpu_map *gm;
	struct copy_job *j;
	uint64_t base, off = 0;
	uint8_t *slot = X.pool + 65536;

	(void)state;
	assert_int_equal(cuda_map_get(X.e, 7, 0, &m, &gm, &base), 0);
	for (uint32_t i = 0; i < GPUMEM; i++)
		X.gpu[0][i] = (uint8_t)(i * 2654435761u >> 13);
	memset(slot, 0xee, slot_len); /* the tail past the page: stale bytes, checksummed too */
	for (int round = 0; round < 4; round++) {
		j = job_new(0, COPY_TO_POOL, 4);
		off = 0;
		/* Round 1 leaves a 16-byte gap between parts 1 and 2. */
		for (int i = 0; i < 4; i++) {
			seg(j, slot + off + (round == 1 && i == 2 ? 16 : 0),
			    (void *)(uintptr_t)(base + off + pad[i]), part[i]);
			off += part[i];
		}
		j->crc_at = slot;
		j->crc_len = slot_len;
		F.crc_launch_res = round == 2 ? CUDA_ERROR_LAUNCH_FAILED : CUDA_SUCCESS;
		assert_int_equal(X.e->submit(X.e, j), COPY_QUEUED);
		assert_int_equal(X.e->poll(X.e), 1);
		assert_int_equal(X.res, 0);
		if (round == 0 || round == 3) {
			assert_int_equal(j->has_crc, 1);
			assert_int_equal(j->crc, slot_crc32c(slot, slot_len));
			assert_memory_equal(slot + 4096, X.gpu[0] + 4096 + 3, 1000);
		} else {
			assert_int_equal(j->has_crc, 0);
		}
		free(j);
	}
	/* Rounds 0 and 3: a launch each, and the job's stream waited for it; round 2's refusal
	 * left the kernel in place. */
	assert_int_equal(F.crc_launches, 2);
	assert_int_equal(F.waits, 2);
	gpu_map_put(X.e, gm);

	/* A driver without the function: copies, and no checksum. */
	X.e->destroy(X.e);
	F.no_crc_fn = 1;
	X.e = make_engine(CUDA_PATH_AUTO, 0);
	assert_non_null(X.e);
	assert_int_equal(cuda_map_get(X.e, 7, 0, &m, &gm, &base), 0);
	j = job_new(0, COPY_TO_POOL, 1);
	seg(j, slot, (void *)(uintptr_t)base, 4096);
	j->crc_at = slot;
	j->crc_len = slot_len;
	assert_int_equal(X.e->submit(X.e, j), COPY_QUEUED);
	assert_int_equal(X.e->poll(X.e), 1);
	assert_int_equal(X.res, 0);
	assert_int_equal(j->has_crc, 0);
	assert_int_equal(F.crc_launches, 2);
	free(j);
	gpu_map_put(X.e, gm);
}

static void test_copy_cuda_forced_kernel_path(void **state)
{
	struct copy_gpu_alloc m = ipc_msg(0);
	struct copy_engine *e = make_engine(CUDA_PATH_KERNEL, 0);
	struct copy_job *j;
	struct gpu_map *gm;
	uint64_t base;

	(void)state;
	assert_non_null(e);
	assert_int_equal(cuda_map_get(e, 7, 0, &m, &gm, &base), 0);
	j = scattered(base, COPY_FROM_POOL, 1000); /* unaligned parts: the byte loop */
	memset(X.pool, 0x42, 8000);
	assert_int_equal(e->submit(e, j), COPY_QUEUED);
	assert_int_equal(F.launches, 1);
	assert_int_equal(F.memcpys, 0);
	assert_int_equal(e->poll(e), 1);
	assert_int_equal(X.gpu[0][7 * 2000 + 999], 0x42);
	assert_int_equal(X.gpu[0][7 * 2000 + 1000], 0);
	gpu_map_put(e, gm);
	e->destroy(e);
	free(j);
}

static void test_copy_cuda_batched_copies(void **state)
{
	struct copy_gpu_alloc m = ipc_msg(0);
	struct copy_engine *e;
	struct copy_job *j;
	struct gpu_map *gm;
	uint64_t base;

	(void)state;
	api.cuMemcpyBatchAsync = f_batch;
	e = make_engine(CUDA_PATH_COPY, 0);
	assert_non_null(e);
	assert_int_equal(cuda_map_get(e, 7, 0, &m, &gm, &base), 0);
	/* Eight scattered parts: one batch call, no single copies. */
	j = scattered(base, COPY_FROM_POOL, 4096);
	memset(X.pool, 0x31, 8 * 4096);
	assert_int_equal(e->submit(e, j), COPY_QUEUED);
	assert_int_equal(F.batches, 1);
	assert_int_equal(F.memcpys, 0);
	assert_int_equal(e->poll(e), 1);
	assert_int_equal(X.res, 0);
	assert_int_equal(X.gpu[0][7 * 8192 + 4095], 0x31);
	/* A driver that refuses the batch: the same job goes one copy per segment, and so do later
	 * jobs. */
	F.batch_res = CUDA_ERROR_NOT_SUPPORTED;
	memset(X.pool, 0x32, 8 * 4096);
	free(j);
	j = scattered(base, COPY_FROM_POOL, 4096);
	assert_int_equal(e->submit(e, j), COPY_QUEUED);
	assert_int_equal(F.memcpys, 8);
	assert_int_equal(e->poll(e), 1);
	assert_int_equal(X.res, 0);
	assert_int_equal(X.gpu[0][7 * 8192 + 4095], 0x32);
	F.batch_res = CUDA_SUCCESS;
	free(j);
	j = scattered(base, COPY_FROM_POOL, 4096);
	assert_int_equal(e->submit(e, j), COPY_QUEUED);
	assert_int_equal(F.batches, 1);
	assert_int_equal(F.memcpys, 16);
	assert_int_equal(e->poll(e), 1);
	gpu_map_put(e, gm);
	e->destroy(e);
	free(j);
}

static void test_copy_cuda_driver_errors(void **state)
{
	struct copy_gpu_alloc m = ipc_msg(0);
	struct copy_job *j = job_new(0, COPY_FROM_POOL, 1);
	struct gpu_map *gm;
	uint64_t base;

	(void)state;
	assert_int_equal(cuda_map_get(X.e, 7, 0, &m, &gm, &base), 0);
	seg(j, (void *)(uintptr_t)base, X.pool, 64);
	/* The copy faults on the device: the job completes with -EIO. */
	F.query_res = CUDA_ERROR_ILLEGAL_ADDRESS;
	assert_int_equal(X.e->submit(X.e, j), COPY_QUEUED);
	assert_int_equal(X.e->poll(X.e), 1);
	assert_int_equal(X.res, -EIO);
	/* The enqueue fails: still completes through the event, with the driver's error. */
	F.query_res = CUDA_SUCCESS;
	F.memcpy_res = CUDA_ERROR_INVALID_VALUE;
	assert_int_equal(X.e->submit(X.e, j), COPY_QUEUED);
	assert_int_equal(X.e->poll(X.e), 1);
	assert_int_equal(X.res, -EINVAL);
	assert_int_equal(X.done, 2);
	gpu_map_put(X.e, gm);
	free(j);
}

static void test_copy_cuda_client_dies_mid_copy(void **state)
{
	struct copy_gpu_alloc m = ipc_msg(0);
	struct copy_job *j = job_new(0, COPY_TO_POOL, 1);
	struct cuda_info in;
	struct gpu_map *gm;
	uint64_t base;

	(void)state;
	assert_int_equal(cuda_map_get(X.e, 7, 0, &m, &gm, &base), 0);
	seg(j, X.pool, (void *)(uintptr_t)base, 4096);
	F.auto_complete = 0;
	assert_int_equal(X.e->submit(X.e, j), COPY_QUEUED);
	/* The client is gone: its last buffer drops the map while the copy is in flight. */
	gpu_map_put(X.e, gm);
	copy_cuda_info(X.e, &in);
	assert_int_equal(in.nclosing, 1);
	assert_int_equal(F.ipc_closes, 0);
	assert_int_equal(X.e->poll(X.e), 0);
	assert_int_equal(F.ipc_closes, 0);
	/* No new copy may use it meanwhile. */
	{
		struct copy_job *k = job_new(0, COPY_TO_POOL, 1);

		seg(k, X.pool, (void *)(uintptr_t)base, 16);
		assert_int_equal(X.e->submit(X.e, k), -EFAULT);
		free(k);
	}
	fire_all();
	assert_int_equal(X.e->poll(X.e), 1);
	assert_int_equal(X.done, 1);
	assert_int_equal(X.closes_at_done, 0); /* the copy completed first ... */
	assert_int_equal(F.ipc_closes, 1);     /* ... then the handle closed */
	copy_cuda_info(X.e, &in);
	assert_int_equal(in.nclosing, 0);
	assert_int_equal(in.nmaps, 0);
	free(j);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_copy_cuda_device_by_uuid, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_cuda_no_device, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_cuda_pool_pinned_in_chunks, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_copy_cuda_handle_cache, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_cuda_fd_import, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_cuda_get_coalesced_by_events, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_copy_cuda_completion_order, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_cuda_bounds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_cuda_slab_pins, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_cuda_path_by_measurement, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_copy_cuda_forced_kernel_path, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_cuda_put_checksum, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_cuda_batched_copies, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_cuda_driver_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_copy_cuda_client_dies_mid_copy, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

int main(void)
{
	printf("built without the CUDA headers: nothing to test\n");
	return 77;
}

#endif
