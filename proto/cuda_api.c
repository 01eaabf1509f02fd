// SPDX-License-Identifier: MIT
/*
 * cuda_api.c - loads the CUDA driver API table of cuda_api.h from libcuda.so.1 at run time.
 * Without the CUDA headers at build time only kvb_cuda_load() exists, and it says so.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_api.h"

#ifdef KVB_HAVE_CUDA
#include <dlfcn.h>

#define KVB_STR_(x) #x
#define KVB_XSTR_(x) KVB_STR_(x)

int kvb_cuda_load(struct kvb_cuda_api **out, char *why, size_t whylen)
{
	struct kvb_cuda_api *api = calloc(1, sizeof(*api));
	const char *missing = NULL;

	if (!api) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	api->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!api->lib) {
		snprintf(why, whylen, "no CUDA driver: %s", dlerror());
		free(api);
		return -ENODEV;
	}
	/* The string is the versioned name cuda.h maps f to (e.g. cuMemAlloc_v2). */
#define KVB_CUDA_LOAD_(f)                                                                          \
	if (!missing && !(*(void **)&api->f = dlsym(api->lib, KVB_XSTR_(f))))                      \
		missing = KVB_XSTR_(f);
	KVB_CUDA_FUNCS(KVB_CUDA_LOAD_)
#undef KVB_CUDA_LOAD_
#define KVB_CUDA_LOAD_OPT_(f) *(void **)&api->f = dlsym(api->lib, KVB_XSTR_(f));
	KVB_CUDA_FUNCS_OPT(KVB_CUDA_LOAD_OPT_)
#undef KVB_CUDA_LOAD_OPT_
	if (missing) {
		snprintf(why, whylen, "CUDA driver too old: no %s in libcuda.so.1", missing);
		kvb_cuda_unload(api);
		return -ENODEV;
	}
	*out = api;
	return 0;
}

void kvb_cuda_unload(struct kvb_cuda_api *api)
{
	if (api && api->lib) {
		dlclose(api->lib);
		free(api);
	}
}

const char *kvb_cuda_strerror(const struct kvb_cuda_api *api, CUresult r)
{
	static __thread char buf[48];
	const char *s = NULL;

	if (r == CUDA_ERROR_STUB_LIBRARY)
		return "libcuda.so.1 is the toolkit's stub library, not a driver";
	if (api && api->cuGetErrorString && api->cuGetErrorString(r, &s) == CUDA_SUCCESS && s)
		return s;
	snprintf(buf, sizeof(buf), "CUDA error %d", (int)r);
	return buf;
}

int kvb_cuda_errno(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS:
		return 0;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_INVALID_DEVICE:
	case CUDA_ERROR_NOT_INITIALIZED:
	case CUDA_ERROR_DEINITIALIZED:
	case CUDA_ERROR_STUB_LIBRARY:
		return -ENODEV;
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_INVALID_VALUE:
	case CUDA_ERROR_INVALID_HANDLE:
		return -EINVAL;
	case CUDA_ERROR_NOT_SUPPORTED:
		return -EOPNOTSUPP;
	default:
		return -EIO;
	}
}
#else
int kvb_cuda_load(struct kvb_cuda_api **out, char *why, size_t whylen)
{
	*out = NULL;
	snprintf(why, whylen, "built without CUDA headers");
	return -ENODEV;
}

void kvb_cuda_unload(struct kvb_cuda_api *api)
{
	(void)api;
}
#endif
