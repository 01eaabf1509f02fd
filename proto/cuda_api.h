/* SPDX-License-Identifier: MIT */
/*
 * cuda_api.h - the CUDA driver API as a table of function pointers, filled at run time from
 * libcuda.so.1 (dlopen), so that one binary runs with and without a GPU and no CUDA library is
 * needed to build or link. Shared by the broker's CUDA copy engine, the client library's GPU
 * buffer registration and the GPU check; the cmocka tests fill a table with fakes instead.
 *
 * Only compiled with the CUDA headers (KVB_HAVE_CUDA, from $(CUDA_HOME)/include/cuda.h): the
 * pointer types come from the real prototypes, so a wrong signature does not compile. Each
 * entry is looked up under the versioned name cuda.h maps it to (cuMemcpyHtoDAsync ->
 * cuMemcpyHtoDAsync_v2), exactly as code linked against libcuda would bind.
 */
#ifndef KVB_PROTO_CUDA_API_H
#define KVB_PROTO_CUDA_API_H

#include <stddef.h>

#ifdef KVB_HAVE_CUDA
#include <cuda.h>

#define KVB_CUDA_FUNCS(X)                                                                          \
	X(cuInit)                                                                                  \
	X(cuGetErrorString)                                                                        \
	X(cuDeviceGetCount)                                                                        \
	X(cuDeviceGet)                                                                             \
	X(cuDeviceGetUuid)                                                                         \
	X(cuDevicePrimaryCtxRetain)                                                                \
	X(cuDevicePrimaryCtxRelease)                                                               \
	X(cuCtxSetCurrent)                                                                         \
	X(cuCtxSynchronize)                                                                        \
	X(cuStreamCreate)                                                                          \
	X(cuStreamDestroy)                                                                         \
	X(cuStreamSynchronize)                                                                     \
	X(cuStreamWaitEvent)                                                                       \
	X(cuEventCreate)                                                                           \
	X(cuEventDestroy)                                                                          \
	X(cuEventRecord)                                                                           \
	X(cuEventQuery)                                                                            \
	X(cuEventSynchronize)                                                                      \
	X(cuEventElapsedTime)                                                                      \
	X(cuLaunchHostFunc)                                                                        \
	X(cuMemcpyHtoDAsync)                                                                       \
	X(cuMemcpyDtoHAsync)                                                                       \
	X(cuMemcpyDtoDAsync)                                                                       \
	X(cuMemsetD8Async)                                                                         \
	X(cuMemAlloc)                                                                              \
	X(cuMemFree)                                                                               \
	X(cuMemHostRegister)                                                                       \
	X(cuMemHostUnregister)                                                                     \
	X(cuMemHostGetDevicePointer)                                                               \
	X(cuMemHostAlloc)                                                                          \
	X(cuMemFreeHost)                                                                           \
	X(cuMemGetAddressRange)                                                                    \
	X(cuPointerGetAttribute)                                                                   \
	X(cuIpcGetMemHandle)                                                                       \
	X(cuIpcOpenMemHandle)                                                                      \
	X(cuIpcCloseMemHandle)                                                                     \
	X(cuMemCreate)                                                                             \
	X(cuMemRelease)                                                                            \
	X(cuMemRetainAllocationHandle)                                                             \
	X(cuMemExportToShareableHandle)                                                            \
	X(cuMemImportFromShareableHandle)                                                          \
	X(cuMemGetAllocationGranularity)                                                           \
	X(cuMemAddressReserve)                                                                     \
	X(cuMemAddressFree)                                                                        \
	X(cuMemMap)                                                                                \
	X(cuMemUnmap)                                                                              \
	X(cuMemSetAccess)                                                                          \
	X(cuModuleLoadData)                                                                        \
	X(cuModuleUnload)                                                                          \
	X(cuModuleGetFunction)                                                                     \
	X(cuLaunchKernel)

/* Entry points newer drivers have and older ones lack: NULL when missing. */
#define KVB_CUDA_FUNCS_OPT(X) X(cuMemcpyBatchAsync) /* CUDA 13 (_v2) */

#define KVB_CUDA_PTR_(f) __typeof__(f) *f;
struct kvb_cuda_api {
	KVB_CUDA_FUNCS(KVB_CUDA_PTR_)
	KVB_CUDA_FUNCS_OPT(KVB_CUDA_PTR_)
	void *lib; /* dlopen handle; NULL for a table filled by hand (tests) */
};
#undef KVB_CUDA_PTR_

/* The text of a CUresult ("CUDA_ERROR_..." description), never NULL. */
const char *kvb_cuda_strerror(const struct kvb_cuda_api *api, CUresult r);

/* A negative errno for a CUresult: -ENODEV no device/driver, -ENOMEM, -EINVAL, else -EIO. */
int kvb_cuda_errno(CUresult r);
#endif /* KVB_HAVE_CUDA */

struct kvb_cuda_api;

/*
 * Loads libcuda.so.1 and every entry of the table. Returns 0, or -ENODEV with a reason in why
 * (no CUDA support compiled in, no driver library, a missing entry point). Does not call cuInit.
 * kvb_cuda_unload() closes the library (a NULL or hand-filled table is a no-op).
 */
int kvb_cuda_load(struct kvb_cuda_api **out, char *why, size_t whylen);
void kvb_cuda_unload(struct kvb_cuda_api *api);

#endif /* KVB_PROTO_CUDA_API_H */
