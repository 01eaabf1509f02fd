/* SPDX-License-Identifier: MIT */
/*
 * copy_cuda.h - the CUDA copy engine as the rest of the broker sees it: open it (libcuda.so.1
 * loaded at run time, so one binary runs with and without a GPU), register clients' GPU
 * buffers with it, drop them. Everything else goes through copy.h. Loop thread only.
 */
#ifndef KVB_BROKER_COPY_CUDA_H
#define KVB_BROKER_COPY_CUDA_H

#include <stdint.h>

#include "wire.h"

struct broker;
struct session;
struct gpu_map;
struct copy_engine;
struct cJSON;

/*
 * The engine for b's pool (registered with the driver, in chunks), or NULL after logging why
 * GPU copies are off: no CUDA support compiled in, no libcuda.so.1, no device, an error.
 */
struct copy_engine *copy_cuda_open(struct broker *b);

/*
 * BUF_REG_GPU: opens (or reuses) the client's allocation on the device with m->uuid and puts
 * the range into a free buffer slot of s, id into *id. fd: the cuMem allocation's fd (KVB_BUF_GPU_FD)
 * or -1; the caller closes it. Errors: -ENODEV GPU copies off or no device with that UUID,
 * -EINVAL malformed, -EFAULT range outside the allocation, -EMFILE no buffer slot, -EIO the
 * driver refused the handle.
 */
int gpu_buf_reg(struct broker *b, struct session *s, const struct kvb_msg_buf_reg_gpu *m, int fd,
		uint32_t *id);

/* Drops one buffer's reference on its mapping; the last closes the handle. */
void gpu_map_put(struct copy_engine *e, struct gpu_map *gm);

/* The "gpu" member of the copy statistics: devices, pin time, paths. */
struct cJSON *copy_cuda_stats_json(const struct broker *b);

#endif /* KVB_BROKER_COPY_CUDA_H */
