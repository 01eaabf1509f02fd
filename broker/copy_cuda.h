/* SPDX-License-Identifier: MIT */
/*
 * copy_cuda.h - the CUDA copy engine as the rest of the broker sees it: open it (libcuda.so.1
 * loaded at run time, so one binary runs with and without a GPU). Copies, and the clients'
 * GPU allocations it opens, go through copy.h (copy_gpu_open, copy_gpu_put): the control path
 * decodes a registration, the engine knows no message and no session. Loop thread only.
 */
#ifndef KVB_BROKER_COPY_CUDA_H
#define KVB_BROKER_COPY_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "copy.h"

struct broker;
struct gpu_map;
struct copy_engine;
struct cJSON;

/*
 * The engine for b's pool (registered with the driver in chunks of at most 64 GiB), or NULL
 * after logging why GPU copies are off: built without CUDA headers, no libcuda.so.1, no device,
 * a driver error.
 */
struct copy_engine *copy_cuda_open(struct broker *b);

/*
 * [slab-pin] Registers [host, host + len) of the pool (a sparse pool's slab) for copies, on
 * every device: 0, or a negative errno with nothing registered. _unpin undoes exactly one
 * such registration (same host and len): -ENOENT, logged, for one never made. No job may be
 * in flight on the range (the store pins a page while it is copied, and gives back only
 * slabs without pinned pages).
 */
int copy_cuda_pin(struct copy_engine *e, void *host, uint64_t len);
int copy_cuda_unpin(struct copy_engine *e, void *host, uint64_t len);

/* The engine's copy_gpu_put (copy.h); the tests call it directly. */
void gpu_map_put(struct copy_engine *e, struct gpu_map *gm);

/* The "gpu" member of the copy statistics: devices, pin time, paths, calibrated shapes. */
struct cJSON *copy_cuda_stats_json(const struct broker *b);

/* copy_kernels.c: the embedded gather/scatter kernel fatbin, NULL (len 0) when not built. */
const void *copy_cuda_fatbin(size_t *len);

/* ---- below: the engine proper, for copy_cuda_open() and the cmocka tests ---- */

enum { CUDA_PATH_AUTO = -1, CUDA_PATH_COPY = 0, CUDA_PATH_KERNEL = 1 };

struct kvb_cuda_api;

struct cuda_range {
	void *base;
	uint64_t len;
};

struct cuda_opts {
	const struct kvb_cuda_api *api;
	const struct cuda_range *pool; /* the pool's arenas */
	uint32_t npool;
	uint64_t chunk_max; /* cuMemHostRegister at most this much at once (0: 64 GiB) */
	int path;	    /* CUDA_PATH_*: AUTO measures per page shape */
	const void *fatbin; /* gather/scatter kernel, or NULL (copies only) */
	size_t fatbin_len;
};

struct cuda_info {
	uint32_t ndev, nchunks, nmaps, nclosing, shapes;
	uint64_t pins, unpins; /* [slab-pin] slabs registered and unregistered */
	uint64_t pinned_bytes;
	double pin_seconds;
	uint64_t jobs[2];  /* by path */
	uint64_t crc_jobs; /* PUT checksums computed on the GPU [gpu-crc] */
	uint64_t errors;
};

/* Initialises the driver, every device and the pool registration; NULL with why filled. */
struct copy_engine *copy_cuda_create(const struct cuda_opts *o, char *why, size_t whylen);
/* The index of the device with this UUID, or -ENODEV. */
int cuda_dev_find(struct copy_engine *e, const uint8_t uuid[16]);
/* Opens (or takes another reference on) owner's allocation m on device dev: *dptr is the device
 * address of the allocation's base in our context. */
int cuda_map_get(struct copy_engine *e, uint32_t owner, int dev, const struct copy_gpu_alloc *m,
		 struct gpu_map **out, uint64_t *dptr);
void copy_cuda_info(struct copy_engine *e, struct cuda_info *out);
/* The path chosen for a page shape, or -1 while it is still being measured (or unknown). */
int cuda_shape_path(struct copy_engine *e, int dev, uint32_t dir, uint32_t nsegs, uint64_t bytes);

#endif /* KVB_BROKER_COPY_CUDA_H */
