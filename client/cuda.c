// SPDX-License-Identifier: MIT
/*
 * cuda.c - kvb_buf_register_gpu(): exports a client's GPU allocation to the broker.
 *
 * The driver API comes from libcuda.so.1, loaded at the first call (proto/cuda_api.c), so
 * libkvbroker has no CUDA link dependency and a process without a GPU gets -ENODEV. The pointer
 * may lie anywhere inside an allocation (a caching allocator's segment): cuMemGetAddressRange
 * gives the allocation's base and size, which is what is exported, with the offset and length
 * registered. cuMemAlloc memory goes as a legacy IPC handle (cuIpcGetMemHandle); memory of the
 * virtual-memory API, which legacy IPC cannot export, is recognised by
 * cuMemRetainAllocationHandle succeeding on it and goes as a POSIX fd
 * (cuMemExportToShareableHandle) passed with the message. The device is named by its UUID:
 * ordinals differ between processes (CUDA_VISIBLE_DEVICES), UUIDs do not.
 *
 * Runs with the client lock held (kvb_* entry points take it), except the one-time load.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"
#include "internal.h"

#ifdef KVB_HAVE_CUDA
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static struct kvb_cuda_api *cuda;
static int load_err;

/* Once per process: the library stays loaded (engines keep using CUDA anyway). */
static void load(void)
{
	char why[256];

	load_err = kvb_cuda_load(&cuda, why, sizeof(why));
	if (!load_err && cuda->cuInit(0) != CUDA_SUCCESS)
		load_err = -ENODEV;
}

/* Fills the registration of [p, p + len) and, for cuMem memory, *fd. */
static int gpu_export(const struct kvb_cuda_api *api, CUdeviceptr p, size_t len,
		      struct kvb_msg_buf_reg_gpu *m, int *fd)
{
	CUmemGenericAllocationHandle h;
	CUipcMemHandle ipc;
	CUdeviceptr base = 0;
	unsigned int mtype = 0;
	size_t size = 0;
	CUdevice dev;
	CUuuid uuid;
	int ord = -1;
	CUresult r;

	if (api->cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) !=
		    CUDA_SUCCESS ||
	    mtype != CU_MEMORYTYPE_DEVICE ||
	    api->cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) !=
		    CUDA_SUCCESS ||
	    api->cuMemGetAddressRange(&base, &size, p) != CUDA_SUCCESS)
		return -EINVAL;
	if (p - base > size || len > size - (p - base))
		return -EFAULT;
	r = api->cuDeviceGet(&dev, ord);
	if (r == CUDA_SUCCESS)
		r = api->cuDeviceGetUuid(&uuid, dev);
	if (r != CUDA_SUCCESS)
		return kvb_cuda_errno(r);
	memset(m, 0, sizeof(*m));
	memcpy(m->uuid, uuid.bytes, sizeof(m->uuid));
	m->alloc_base = base;
	m->alloc_size = size;
	m->off = p - base;
	m->len = len;
	if (api->cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)base) == CUDA_SUCCESS) {
		/* Virtual-memory API: only a shareable handle can cross processes. */
		r = api->cuMemExportToShareableHandle(fd, h,
						      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
		api->cuMemRelease(h);
		if (r != CUDA_SUCCESS)
			return -EOPNOTSUPP; /* not created with POSIX fd handles requested */
		m->kind = KVB_BUF_GPU_FD;
		return 0;
	}
	r = api->cuIpcGetMemHandle(&ipc, base);
	if (r != CUDA_SUCCESS)
		return r == CUDA_ERROR_INVALID_VALUE ? -EOPNOTSUPP : kvb_cuda_errno(r);
	memcpy(m->handle, ipc.reserved, sizeof(m->handle));
	m->kind = KVB_BUF_GPU_IPC;
	return 0;
}
#endif

int kvb_buf_register_gpu(kvb_client *c, void *dev_ptr, size_t len, uint32_t *buf)
{
#ifdef KVB_HAVE_CUDA
	struct kvb_msg_buf_reg_gpu m;
	struct kvb_msg_id id;
	struct kvbc_reply r;
	struct kvbc_buf *b;
	int err, fd = -1;
#endif

	if (!c || !dev_ptr || !len || !buf)
		return -EINVAL;
#ifdef KVB_HAVE_CUDA
	pthread_once(&load_once, load);
	if (load_err)
		return load_err;
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	err = kvbc_enter(c);
	if (err)
		goto err_free;
	if (c->broker_minor < 1) {
		err = -ENODEV; /* a broker from before GPU buffers: it would end the session */
		goto err_leave;
	}
	err = gpu_export(cuda, (CUdeviceptr)(uintptr_t)dev_ptr, len, &m, &fd);
	if (err)
		goto err_leave;
	err = kvbc_ctl(c, KVB_MSG_BUF_REG_GPU, &m, sizeof(m), fd, &r);
	if (err < 0)
		goto err_leave;
	err = kvbc_reply_body(&r, &id, sizeof(id));
	kvbc_reply_free(&r);
	if (err)
		goto err_leave;
	b->addr = dev_ptr;
	b->len = len;
	b->id = kvbc_buf_cid(c, id.id);
	b->bid = id.id;
	b->fd = -1;
	b->gpu = 1;
	b->gpu_base = m.alloc_base;
	b->gpu_size = m.alloc_size;
	b->next = c->bufs;
	c->bufs = b;
	*buf = id.id;
	b = NULL;
err_leave:
	kvbc_leave(c);
	if (fd >= 0)
		close(fd);
err_free:
	free(b);
	return err;
#else
	return -ENODEV; /* built without the CUDA headers */
#endif
}

/*
 * [RECONNECT] The new broker knows nothing of the old one's GPU registrations: export the
 * buffer's allocation again from the device pointer we kept (a legacy IPC handle of the same
 * allocation, or a fresh POSIX fd of cuMem memory: keeping the first fd open would pin the
 * allocation after the caller freed it) and register it under the same caller id. The
 * allocation must still be the one registered (same base and size): one the caller freed, or
 * replaced at that address, is not ours to register, and a broker without GPU copies refuses;
 * either way that buffer alone is lost (-EBADF on its ops), not the reconnect.
 */
int kvbc_gpu_again(struct kvb_client *c, struct kvbc_buf *b)
{
#ifdef KVB_HAVE_CUDA
	struct kvb_msg_buf_reg_gpu m;
	struct kvb_msg_id id;
	struct kvbc_reply r;
	int err, fd = -1;

	b->bid = UINT32_MAX;
	if (!cuda || load_err || c->broker_minor < 1)
		return 0;
	err = gpu_export(cuda, (CUdeviceptr)(uintptr_t)b->addr, b->len, &m, &fd);
	if (err || m.alloc_base != b->gpu_base || m.alloc_size != b->gpu_size) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	err = kvbc_ctl(c, KVB_MSG_BUF_REG_GPU, &m, sizeof(m), fd, &r);
	if (fd >= 0)
		close(fd);
	if (err >= 0) {
		err = kvbc_reply_body(&r, &id, sizeof(id));
		kvbc_reply_free(&r);
		if (!err)
			b->bid = id.id;
		return err;
	}
	/* The transport's errors fail the reconnect; the broker's refusal loses the buffer. */
	return kvbc_transport_err(err) ? err : 0;
#else
	(void)c;
	b->bid = UINT32_MAX;
	return 0;
#endif
}
