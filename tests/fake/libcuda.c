// SPDX-License-Identifier: MIT
/*
 * libcuda.c - a fake CUDA driver (built as libcuda.so.1) for end-to-end tests without a GPU.
 *
 * The broker and the client library dlopen "libcuda.so.1"; a test that puts this one first on
 * LD_LIBRARY_PATH gets one device whose "device memory" is host shared memory, so every path
 * of the real programs runs across real processes: export (legacy IPC handles, cuMem POSIX
 * fds), opening in the broker, the handle cache, bounds, views over GPU buffers, both copy
 * paths, completion, closing. What it cannot stand in for is the DMA itself.
 *
 * Device memory: cuMemAlloc and cuMemCreate make a memfd and map it shared; a device pointer is
 * the host address of that mapping. A legacy IPC handle carries (pid, fd, size): the broker's
 * cuIpcOpenMemHandle opens /proc/<pid>/fd/<fd> and maps it (same uid, the client dumpable).
 * A cuMem export is a dup of the memfd, which the broker imports and maps. Copies are memcpy,
 * done at once; events are always complete; the kernel walks its descriptor table on the host.
 * Every open and close of client memory is logged on stderr ("fake-cuda: ..."), which the tests
 * read from the broker's log. Not thread-safe beyond what the tests need (one loop thread).
 *
 * Pinned host memory: cuMemHostRegister and cuMemHostAlloc ranges are tracked as the driver
 * does. A registration overlapping another, an unregister of an address that is not a
 * registration's start, and a device pointer or a copy (DMA or kernel) touching host memory
 * outside every registration fail, each logged ("fake-cuda: BUG: ..."), where a real driver
 * would fail, fault the context or copy pages that are no longer the process's. Every
 * register and unregister logs the count left ("fake-cuda: host register ... (N pinned)").
 */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc_segs_emu.h"

#define FMAX 1024
#define FAKE_MAGIC 0x46414b45u /* "FAKE" */

enum { A_FREE = 0, A_ALLOC, A_IPC, A_VMM_MAPPED };

struct alloc {
	int kind;
	uint64_t base, size;
	int fd; /* the memfd (A_ALLOC), or the imported handle's fd (A_VMM_MAPPED) */
	CUmemGenericAllocationHandle h;
};

struct handle { /* cuMem handles: created or imported memfds */
	int used, fd;
	uint64_t size;
	int refs; /* the handle itself, retains, mappings: freed at 0 as the driver does */
};

struct ipc {
	uint32_t magic;
	int32_t pid, fd;
	uint64_t size;
};

static struct alloc A[FMAX];
static struct handle H[FMAX];

#define PMAX 16384 /* pinned host ranges: a sparse pool's slabs, descriptor rings */

struct pinned {
	uint8_t *base;
	uint64_t len; /* 0: a free entry */
};

static struct pinned P[PMAX];
static int npinned;

static struct pinned *pinned_find(const void *p, uint64_t len)
{
	const uint8_t *a = p;

	for (int i = 0; i < PMAX; i++)
		if (P[i].len && a >= P[i].base && (uint64_t)(a - P[i].base) < P[i].len &&
		    len <= P[i].len - (uint64_t)(a - P[i].base))
			return &P[i];
	return NULL;
}

static CUresult pin_add(void *p, uint64_t len, const char *how)
{
	const uint8_t *a = p;

	for (int i = 0; i < PMAX; i++)
		if (P[i].len && a < P[i].base + P[i].len && P[i].base < a + len) {
			fprintf(stderr,
				"fake-cuda: BUG: %s of %llu bytes overlaps a registration\n", how,
				(unsigned long long)len);
			return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
		}
	for (int i = 0; i < PMAX; i++)
		if (!P[i].len) {
			P[i] = (struct pinned){p, len};
			npinned++;
			return CUDA_SUCCESS;
		}
	return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult pin_del(void *p, const char *how)
{
	for (int i = 0; i < PMAX; i++)
		if (P[i].len && P[i].base == p) {
			uint64_t len = P[i].len;

			P[i].len = 0;
			npinned--;
			fprintf(stderr, "fake-cuda: %s %llu bytes (%d pinned)\n", how,
				(unsigned long long)len, npinned);
			return CUDA_SUCCESS;
		}
	fprintf(stderr, "fake-cuda: BUG: %s of host memory never registered\n", how);
	return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

static struct alloc *find(uint64_t p)
{
	for (int i = 0; i < FMAX; i++)
		if (A[i].kind != A_FREE && p >= A[i].base && p < A[i].base + A[i].size)
			return &A[i];
	return NULL;
}

static struct alloc *slot(void)
{
	for (int i = 0; i < FMAX; i++)
		if (A[i].kind == A_FREE)
			return &A[i];
	return NULL;
}

/* May a copy touch [p, p + len)? Device memory, or host memory inside one registration. */
static int dma_ok(uint64_t p, uint64_t len, const char *what)
{
	struct alloc *a = find(p);

	if ((a && len <= a->size - (p - a->base)) || pinned_find((const void *)(uintptr_t)p, len))
		return 1;
	fprintf(stderr, "fake-cuda: BUG: %s touches %llu bytes of unregistered host memory\n", what,
		(unsigned long long)len);
	return 0;
}

CUresult cuInit(unsigned int flags)
{
	(void)flags;
	return getenv("KVB_FAKE_CUDA_NODEV") ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **pStr)
{
	(void)error;
	*pStr = "fake CUDA error";
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
	*count = 1;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	*device = ordinal;
	return ordinal == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	memset(uuid->bytes, 0x5a + dev, sizeof(uuid->bytes));
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	*pctx = (CUcontext)(uintptr_t)(0x100 + dev);
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
	(void)dev;
	return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
	(void)ctx;
	return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void)
{
	return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	(void)Flags;
	*phStream = (CUstream)malloc(1);
	return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream hStream)
{
	free(hStream);
	return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
	(void)hStream;
	return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	(void)Flags;
	*phEvent = (CUevent)malloc(1);
	return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent hEvent)
{
	free(hEvent);
	return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	(void)hStream, (void)hEvent, (void)Flags;
	return CUDA_SUCCESS; /* work is done at once: every event has fired */
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
	(void)hEvent, (void)hStream;
	return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent hEvent)
{
	(void)hEvent;
	return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent hEvent)
{
	(void)hEvent;
	return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
	(void)hStart, (void)hEnd;
	*pMilliseconds = 1.0f;
	return CUDA_SUCCESS;
}

CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
	(void)hStream;
	fn(userData);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
			   CUstream hStream)
{
	(void)hStream;
	if (!dma_ok(dstDevice, ByteCount, "cuMemcpyHtoDAsync") ||
	    !dma_ok((uint64_t)(uintptr_t)srcHost, ByteCount, "cuMemcpyHtoDAsync"))
		return CUDA_ERROR_INVALID_VALUE;
	memcpy((void *)(uintptr_t)dstDevice, srcHost, ByteCount);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
	(void)hStream;
	if (!dma_ok((uint64_t)(uintptr_t)dstHost, ByteCount, "cuMemcpyDtoHAsync") ||
	    !dma_ok(srcDevice, ByteCount, "cuMemcpyDtoHAsync"))
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
			   CUstream hStream)
{
	(void)hStream;
	memcpy((void *)(uintptr_t)dstDevice, (const void *)(uintptr_t)srcDevice, ByteCount);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
			    CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs,
			    CUstream hStream)
{
	(void)attrs, (void)attrsIdxs, (void)numAttrs, (void)hStream;
	for (size_t i = 0; i < count; i++)
		if (!dma_ok(dsts[i], sizes[i], "cuMemcpyBatchAsync") ||
		    !dma_ok(srcs[i], sizes[i], "cuMemcpyBatchAsync"))
			return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < count; i++)
		memcpy((void *)(uintptr_t)dsts[i], (const void *)(uintptr_t)srcs[i], sizes[i]);
	return CUDA_SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
	(void)hStream;
	memset((void *)(uintptr_t)dstDevice, uc, N);
	return CUDA_SUCCESS;
}

static CUresult map_memfd(int fd, uint64_t size, void *at, uint64_t *base)
{
	void *p = mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | (at ? MAP_FIXED : 0), fd, 0);

	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*base = (uint64_t)(uintptr_t)p;
	return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
	struct alloc *a = slot();
	int fd = memfd_create("fake-cuda-mem", MFD_CLOEXEC);

	if (!a || fd < 0 || ftruncate(fd, (off_t)bytesize) < 0 ||
	    map_memfd(fd, bytesize, NULL, &a->base) != CUDA_SUCCESS) {
		if (fd >= 0)
			close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->kind = A_ALLOC;
	a->size = bytesize;
	a->fd = fd;
	*dptr = a->base;
	return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr dptr)
{
	struct alloc *a = find(dptr);

	if (!a || a->kind != A_ALLOC || a->base != dptr)
		return CUDA_ERROR_INVALID_VALUE;
	munmap((void *)(uintptr_t)a->base, a->size);
	close(a->fd);
	a->kind = A_FREE;
	return CUDA_SUCCESS;
}

CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
	CUresult r;

	(void)Flags;
	if (getenv("KVB_FAKE_CUDA_PIN_FAIL"))
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = pin_add(p, bytesize, "host register");
	if (r == CUDA_SUCCESS)
		fprintf(stderr, "fake-cuda: host register %llu bytes (%d pinned)\n",
			(unsigned long long)bytesize, npinned);
	return r;
}

CUresult cuMemHostUnregister(void *p)
{
	return pin_del(p, "host unregister");
}

CUresult cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
	(void)Flags;
	if (!pinned_find(p, 1)) {
		fprintf(stderr, "fake-cuda: BUG: device pointer of unregistered host memory\n");
		return CUDA_ERROR_INVALID_VALUE;
	}
	*pdptr = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
	(void)Flags;
	*pp = malloc(bytesize);
	if (*pp && pin_add(*pp, bytesize, "cuMemHostAlloc") != CUDA_SUCCESS) {
		free(*pp);
		*pp = NULL;
	}
	return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFreeHost(void *p)
{
	CUresult r = pin_del(p, "cuMemFreeHost");

	free(p);
	return r;
}

CUresult cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	struct alloc *a = find(dptr);

	if (!a)
		return CUDA_ERROR_INVALID_VALUE;
	if (pbase)
		*pbase = a->base;
	if (psize)
		*psize = a->size;
	return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	if (!find(ptr))
		return CUDA_ERROR_INVALID_VALUE;
	if (attribute == CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
		*(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
	else if (attribute == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
		*(int *)data = 0;
	else
		return CUDA_ERROR_NOT_SUPPORTED;
	return CUDA_SUCCESS;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	struct alloc *a = find(dptr);
	struct ipc h = {FAKE_MAGIC, (int32_t)getpid(), 0, 0};

	if (!a || a->kind != A_ALLOC || a->base != dptr)
		return CUDA_ERROR_INVALID_VALUE;
	h.fd = a->fd;
	h.size = a->size;
	memset(pHandle, 0, sizeof(*pHandle));
	memcpy(pHandle->reserved, &h, sizeof(h));
	return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	struct alloc *a = slot();
	struct ipc h;
	char path[64];
	int fd;

	(void)Flags;
	memcpy(&h, handle.reserved, sizeof(h));
	if (h.magic != FAKE_MAGIC || !a)
		return CUDA_ERROR_INVALID_HANDLE;
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "fake-cuda: open %s: %s\n", path, strerror(errno));
		return CUDA_ERROR_INVALID_HANDLE;
	}
	if (map_memfd(fd, h.size, NULL, &a->base) != CUDA_SUCCESS) {
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	close(fd);
	a->kind = A_IPC;
	a->size = h.size;
	*pdptr = a->base;
	fprintf(stderr, "fake-cuda: ipc open %llu bytes\n", (unsigned long long)h.size);
	return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	struct alloc *a = find(dptr);

	if (!a || a->kind != A_IPC)
		return CUDA_ERROR_INVALID_VALUE;
	munmap((void *)(uintptr_t)a->base, a->size);
	a->kind = A_FREE;
	fprintf(stderr, "fake-cuda: ipc close\n");
	return CUDA_SUCCESS;
}

static CUmemGenericAllocationHandle handle_new(int fd, uint64_t size)
{
	for (int i = 1; i < FMAX; i++) {
		if (!H[i].used) {
			H[i] = (struct handle){1, fd, size, 1};
			return (CUmemGenericAllocationHandle)i;
		}
	}
	return 0;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
		     const CUmemAllocationProp *prop, unsigned long long flags)
{
	int fd = memfd_create("fake-cuda-vmm", MFD_CLOEXEC);

	(void)prop, (void)flags;
	if (fd < 0 || ftruncate(fd, (off_t)size) < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*handle = handle_new(fd, size);
	return *handle ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static void handle_put(CUmemGenericAllocationHandle handle)
{
	if (--H[handle].refs)
		return;
	close(H[handle].fd);
	H[handle].used = 0;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	if (handle <= 0 || handle >= FMAX || !H[handle].used)
		return CUDA_ERROR_INVALID_VALUE;
	handle_put(handle);
	return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
				       CUmemAllocationGranularity_flags option)
{
	(void)prop, (void)option;
	*granularity = 2u << 20;
	return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
			     unsigned long long flags)
{
	void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	(void)alignment, (void)addr, (void)flags;
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*ptr = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	munmap((void *)(uintptr_t)ptr, size);
	return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
		  unsigned long long flags)
{
	struct alloc *a = slot();

	(void)flags;
	if (!a || handle <= 0 || handle >= FMAX || !H[handle].used || offset ||
	    size > H[handle].size)
		return CUDA_ERROR_INVALID_VALUE;
	if (map_memfd(H[handle].fd, size, (void *)(uintptr_t)ptr, &a->base) != CUDA_SUCCESS)
		return CUDA_ERROR_OUT_OF_MEMORY;
	a->kind = A_VMM_MAPPED;
	a->size = size;
	a->h = handle;
	H[handle].refs++;
	return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	struct alloc *a = find(ptr);

	if (!a || a->kind != A_VMM_MAPPED)
		return CUDA_ERROR_INVALID_VALUE;
	/* Back to a reservation, as the driver leaves it. */
	mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
	     0);
	a->kind = A_FREE;
	handle_put(a->h);
	fprintf(stderr, "fake-cuda: vmm unmap\n");
	return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	(void)ptr, (void)size, (void)desc, (void)count;
	return CUDA_SUCCESS;
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	struct alloc *a = find((uint64_t)(uintptr_t)addr);

	if (!a || a->kind != A_VMM_MAPPED)
		return CUDA_ERROR_INVALID_VALUE;
	*handle = a->h;
	H[a->h].refs++;
	return CUDA_SUCCESS;
}

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
				      CUmemAllocationHandleType handleType,
				      unsigned long long flags)
{
	(void)flags;
	if (handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || handle <= 0 ||
	    handle >= FMAX || !H[handle].used)
		return CUDA_ERROR_INVALID_VALUE;
	*(int *)shareableHandle = dup(H[handle].fd);
	return CUDA_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
					CUmemAllocationHandleType shHandleType)
{
	struct stat st;
	int fd = dup((int)(uintptr_t)osHandle);

	if (shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fd < 0 ||
	    fstat(fd, &st) < 0)
		return CUDA_ERROR_INVALID_VALUE;
	*handle = handle_new(fd, (uint64_t)st.st_size);
	fprintf(stderr, "fake-cuda: vmm import %llu bytes\n", (unsigned long long)st.st_size);
	return *handle ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* The broker's kernels, run on the host: the module is a token, each function another. */
static int fake_fn, fake_crc_fn;

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	(void)image;
	*module = (CUmodule)(uintptr_t)0x4d4f44;
	return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule hmod)
{
	(void)hmod;
	return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	(void)hmod;
	if (!strcmp(name, "kvb_copy_segs"))
		*hfunc = (CUfunction)&fake_fn;
	else if (!strcmp(name, "kvb_crc_segs"))
		*hfunc = (CUfunction)&fake_crc_fn;
	else
		return CUDA_ERROR_NOT_FOUND;
	return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
			unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
			unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
			void **kernelParams, void **extra)
{
	const uint64_t *t;
	unsigned n;

	(void)gridDimZ, (void)blockDimY, (void)blockDimZ, (void)sharedMemBytes, (void)hStream;
	(void)extra;
	t = (const uint64_t *)(uintptr_t) * (CUdeviceptr *)kernelParams[0];
	n = *(unsigned *)kernelParams[1];
	if (f == (CUfunction)&fake_crc_fn) {
		crc_segs_emu(t, n, gridDimX, gridDimY, blockDimX,
			     (uint32_t *)(uintptr_t) * (CUdeviceptr *)kernelParams[2]);
		fprintf(stderr, "fake-cuda: checksum kernel over %u segments\n", n);
		return CUDA_SUCCESS;
	}
	if (f != (CUfunction)&fake_fn)
		return CUDA_ERROR_INVALID_HANDLE;
	for (unsigned i = 0; i < n; i++)
		if (!dma_ok(t[3 * i], t[3 * i + 2], "the copy kernel") ||
		    !dma_ok(t[3 * i + 1], t[3 * i + 2], "the copy kernel"))
			return CUDA_ERROR_ILLEGAL_ADDRESS;
	for (unsigned i = 0; i < n; i++)
		memcpy((void *)(uintptr_t)t[3 * i], (const void *)(uintptr_t)t[3 * i + 1],
		       t[3 * i + 2]);
	fprintf(stderr, "fake-cuda: kernel over %u segments\n", n);
	return CUDA_SUCCESS;
}
