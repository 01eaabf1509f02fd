/* SPDX-License-Identifier: MIT */
/*
 * kvbpy.h - what the files of the extension module kvbroker._kvbroker share.
 *
 * The module is written against the limited API of CPython 3.11 (one abi3 wheel for every
 * later version) and links libkvbroker statically: setup.py compiles client/ and proto/ into
 * the same shared object with -fvisibility=hidden, so only PyInit__kvbroker is exported and an
 * engine that also loads libkvbroker.so sees no clash.
 *
 * Objects and ownership (every arrow a strong reference):
 *
 *   Namespace, HostBuffer, GpuBuffer, Lease, View  ->  Client
 *   View -> the Namespace and every buffer it spans;  GpuBuffer -> the tensor it came from
 *
 * so a Client outlives everything that refers to it, and kvb_close() runs only from close()
 * (or the Client's dealloc, when nothing refers to it any more). Memory the Client's mappings
 * own (leases into the pool) is tracked on the client: close() refuses (BufferError) while a
 * lease's memory is still exported, because kvb_close() unmaps it. Host buffers are memfds the
 * module maps itself and registers by fd, so their memory belongs to the HostBuffer object and
 * outlives the registration: close() never invalidates a numpy array over one.
 *
 * Threads: the GIL guards every field here. A call that blocks in libkvbroker counts itself in
 * (kvbpy_enter: busy++), drops the GIL, calls, takes the GIL back and counts itself out.
 * close() marks the client closing (new calls raise), then waits with the GIL released until
 * busy is 0: kvb_close() never races another call, which the C library forbids. Batches
 * (submit + reap) also hold batch_lock, see batch.c.
 *
 * fork(): a pthread_atfork child handler bumps kvbpy_fork_gen; a client whose connect-time
 * generation differs is the parent's, and every call on it raises ForkedClient. Its dealloc and
 * close() in the child forget it without touching the rings or the socket.
 *
 * Module state lives in globals (single-phase init): the module supports one interpreter.
 */
#ifndef KVBPY_H
#define KVBPY_H

#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbroker.h"

/* Exceptions (module.c). */
extern PyObject *kvbpy_Error, *kvbpy_BrokerGone, *kvbpy_NoBroker, *kvbpy_PoolFull;
extern PyObject *kvbpy_ClientClosed, *kvbpy_ForkedClient, *kvbpy_Timeout;

/* Types (each file's kvbpy_*_init creates its own). */
extern PyTypeObject *kvbpy_ClientType, *kvbpy_NamespaceType, *kvbpy_HostBufferType,
	*kvbpy_GpuBufferType, *kvbpy_LeaseType, *kvbpy_ViewType;

/* Bumped in the child by a pthread_atfork handler. */
extern volatile unsigned kvbpy_fork_gen;

/* Raises the kvb.Error subclass for a negative errno err with kvb_strerror's text; NULL. */
PyObject *kvbpy_raise(int err);
/* Same with our own text (errors the module detects itself). */
PyObject *kvbpy_raise_msg(PyObject *type, int err, const char *msg);
/* For a failed kvb_connect() to socket_path (NULL: the default): kvb_connect_error()'s text,
 * which names the socket, the cause and the fix. */
PyObject *kvbpy_raise_connect(int err, const char *socket_path);

/* A registered buffer: how a pointer maps to (buf id, offset) for batched ops. */
struct kvbpy_reg {
	struct kvbpy_reg *prev, *next;
	uintptr_t addr; /* host address, or device pointer for GPU buffers; 0: none known */
	size_t len;
	uint32_t id;
	int gpu;
	Py_ssize_t *lib_exports; /* memory kvb_buf_alloc_host() owns: its exports, else NULL */
};

/* A live lease: on the client's list so that close() can see its exports. */
struct kvbpy_lease_node {
	struct kvbpy_lease_node *prev, *next;
	Py_ssize_t *exports;
};

typedef struct {
	PyObject ob_base;
	kvb_client *c;			/* NULL: not connected or closed */
	unsigned gen;			/* kvbpy_fork_gen at connect */
	int control;			/* KVB_CONNECT_CONTROL */
	int closing;			/* close() waits for busy == 0 */
	long busy;			/* calls running without the GIL */
	struct kvbpy_reg regs;		/* list head of registered buffers */
	struct kvbpy_lease_node leases; /* list head of live leases */
	pthread_mutex_t batch_lock;	/* one submit/reap round at a time (batch.c) */
	struct kvb_completion *stash;	/* the caller's completions a batch reaped */
	size_t nstash, stash_cap;
	int cfd; /* kvb_completion_fd(), -1 until asked */
} kvbpy_client;

/*
 * Counts a call in: raises ClientClosed or ForkedClient (returns -1) when the client cannot be
 * used from here. With the GIL; pair with kvbpy_leave().
 */
int kvbpy_enter(kvbpy_client *cl);
static inline void kvbpy_leave(kvbpy_client *cl)
{
	cl->busy--;
}
/* True in a forked child of the process that connected cl. */
static inline int kvbpy_forked(const kvbpy_client *cl)
{
	return cl->gen != kvbpy_fork_gen;
}

void kvbpy_reg_add(kvbpy_client *cl, struct kvbpy_reg *r);
void kvbpy_reg_del(struct kvbpy_reg *r);
/* The registered buffer holding [p, p + len), or NULL. */
const struct kvbpy_reg *kvbpy_reg_find(const kvbpy_client *cl, uintptr_t p, size_t len);

/*
 * Memory of a Python object, for a source or destination: any C-contiguous buffer-protocol
 * object, or an object with data_ptr() and nbytes (torch tensors: CPU ones as host memory,
 * CUDA ones only inside a GPU buffer registered on this client, as libkvbroker would otherwise
 * treat the device pointer as host memory). Released with kvbpy_mem_release().
 */
struct kvbpy_mem {
	Py_buffer view;
	int has_view;
	PyObject *ref; /* the object, for the data_ptr() path */
	void *ptr;
	size_t len;
	int gpu;
};
int kvbpy_mem_get(kvbpy_client *cl, PyObject *obj, int writable, struct kvbpy_mem *m);
void kvbpy_mem_release(struct kvbpy_mem *m);

/* Keys: a 32-byte bytes-like object. Returns 0 or -1 with ValueError/TypeError set. */
int kvbpy_key(PyObject *obj, kvb_key *key);
/*
 * Keys of a lookup: a sequence of keys, or one bytes-like object of n * 32 bytes (used in
 * place). *keys points into *owned (malloc'd, free it) or into view (release it).
 */
int kvbpy_keys(PyObject *obj, kvb_key **keys, size_t *n, kvb_key **owned, Py_buffer *view,
	       int *has_view);

/*
 * Runs ops[0..n) to completion with submit and reap: res[i] and flags[i] get op i's result;
 * parents (NULL: none) holds the parent key of each op with KVB_OPF_PARENT (kvb_submit_parents).
 * Call without the GIL; takes cl->batch_lock. Completions of the caller's own submit() that it
 * reaps meanwhile are stashed for reap(). Returns 0, or the negative errno that broke the batch
 * (broker gone, ring protocol).
 */
int kvbpy_batch_run(kvbpy_client *cl, struct kvb_op *ops, size_t n, const kvb_key *parents,
		    int32_t *res, uint32_t *flags);
/*
 * [chain] Parents of n PUTs: None (*out NULL), or a sequence of n entries, each a 32-byte key or
 * None. *out: n keys (malloc'd, free it), (*has)[i] 1 where entry i is a key. -1 with an
 * exception set.
 */
int kvbpy_parents(PyObject *obj, size_t n, kvb_key **out, uint8_t **has);
#define KVBPY_TAG (1ull << 63) /* user_data of the module's own batch ops */

/* Client methods that live in buffers.c. */
PyObject *kvbpy_alloc_host(PyObject *self, PyObject *arg);
PyObject *kvbpy_register_host_fd(PyObject *self, PyObject *args, PyObject *kw);
PyObject *kvbpy_register_gpu(PyObject *self, PyObject *args, PyObject *kw);

/* A Lease object for a held lease (takes it over). */
PyObject *kvbpy_lease_new(kvbpy_client *cl, const struct kvb_lease *l);

/* Namespace object (ns.c). */
typedef struct {
	PyObject ob_base;
	kvbpy_client *cl;
	PyObject *layout;
	uint32_t id;
	size_t page_bytes;
	uint32_t nparts;
	uint32_t tokens_per_page;
} kvbpy_ns;

/* Parses "view parts" and creates a View object (view.c). */
PyObject *kvbpy_view_new(kvbpy_ns *ns, PyObject *parts);

int kvbpy_client_init_type(PyObject *m);
int kvbpy_ns_init_type(PyObject *m);
int kvbpy_buffers_init_type(PyObject *m);
int kvbpy_view_init_type(PyObject *m);
int kvbpy_keys_init(PyObject *m);
int kvbpy_hostmap_init(PyObject *m); /* hostmap.c: remap_onto_memfd, punch_hole */

/* Integer attribute of obj (Layout fields); -1 with an exception set when missing or bad. */
int kvbpy_attr_u32(PyObject *obj, const char *name, uint32_t *out);

#endif /* KVBPY_H */
