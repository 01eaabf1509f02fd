// SPDX-License-Identifier: MIT
/*
 * buffers.c - HostBuffer, GpuBuffer and Lease: memory the broker copies into or out of, and
 * pinned pages read in place.
 *
 * HostBuffer: a memfd this module creates, seals (shrink, grow, seal) and maps MAP_SHARED,
 * registered with kvb_buf_register_host_fd() at its address, so kvb_put()/kvb_get() of memory
 * inside it are broker copies (zero-copy) and async ops address it by id. The mapping belongs
 * to the object: unregister() or the client's close() end the registration, not the memory,
 * so numpy arrays over it stay valid for as long as they live. Against a broker without
 * register-by-fd (ABI < 1.2) it falls back to kvb_buf_alloc_host(), whose memory the library
 * owns and unmaps at unregister or close: those refuse (BufferError) while it is exported.
 * register_host_fd() registers a caller's memfd, either at the caller's own mapping (mapped=)
 * or at one made here.
 *
 * GpuBuffer: kvb_buf_register_gpu() of a device range; holds the tensor it came from, so the
 * memory stays allocated for as long as it is registered (the C API's rule).
 *
 * Lease: a pinned page (kvb_acquire) exposed read-only through the buffer protocol. release()
 * refuses while its memory is exported; the with-statement's memoryview is released by
 * __exit__ first. A lease on a closed client is gone (kvb_close released it).
 *
 * Every object holds a strong reference to its Client. Cleanup in dealloc runs only while the
 * client is open, not closing and not the parent's of a fork.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvbpy.h"

PyTypeObject *kvbpy_HostBufferType, *kvbpy_GpuBufferType, *kvbpy_LeaseType;

typedef struct {
	PyObject ob_base;
	kvbpy_client *cl;
	struct kvbpy_reg reg; /* on cl's list while registered (reg.next != NULL) */
	void *map;	      /* our own mapping, or NULL */
	size_t map_len;
	char *data; /* what the buffer protocol exposes */
	size_t len;
	struct kvbpy_mem mapped; /* the caller's memory (register_host_fd(mapped=...)) */
	Py_ssize_t exports;
	int lib_owned; /* kvb_buf_alloc_host() memory: gone with the registration */
} hostbuf;

typedef struct {
	PyObject ob_base;
	kvbpy_client *cl;
	struct kvbpy_reg reg;
	PyObject *owner;
} gpubuf;

typedef struct {
	PyObject ob_base;
	kvbpy_client *cl;
	struct kvbpy_lease_node node; /* on cl's list while held */
	struct kvb_lease l;
	Py_ssize_t exports;
	PyObject *mv; /* the with-statement's memoryview, released by __exit__ */
} lease;

/* May the object call into the client for cleanup (dealloc)? */
static int cleanup_ok(const kvbpy_client *cl)
{
	return cl->c && !cl->closing && !kvbpy_forked(cl);
}

static int unregister_id(kvbpy_client *cl, struct kvbpy_reg *r, int raise)
{
	int err;

	if (!r->next)
		return 0;
	if (raise) {
		if (kvbpy_enter(cl) < 0)
			return -1;
	} else if (!cleanup_ok(cl)) {
		kvbpy_reg_del(r);
		return 0;
	} else {
		cl->busy++;
	}
	kvbpy_reg_del(r);
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_buf_unregister(cl->c, r->id);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (err < 0 && raise) {
		kvbpy_raise(err);
		return -1;
	}
	return 0;
}

/* ---- HostBuffer ---- */

static hostbuf *hostbuf_alloc(kvbpy_client *cl)
{
	hostbuf *b = PyObject_New(hostbuf, kvbpy_HostBufferType);

	if (!b)
		return NULL;
	b->cl = (kvbpy_client *)Py_NewRef((PyObject *)cl);
	memset(&b->reg, 0, sizeof(b->reg));
	memset(&b->mapped, 0, sizeof(b->mapped));
	b->map = NULL;
	b->map_len = 0;
	b->data = NULL;
	b->len = 0;
	b->exports = 0;
	b->lib_owned = 0;
	return b;
}

static size_t page_size(void)
{
	long pg = sysconf(_SC_PAGESIZE);

	return pg > 0 ? (size_t)pg : 4096;
}

PyObject *kvbpy_alloc_host(PyObject *self, PyObject *arg)
{
	kvbpy_client *cl = (kvbpy_client *)self;
	Py_ssize_t n = PyLong_AsSsize_t(arg);
	size_t pg = page_size(), size;
	void *p = MAP_FAILED;
	uint32_t id = 0;
	int err = 0, lib = 0;
	hostbuf *b;

	if (n == -1 && PyErr_Occurred())
		return NULL;
	if (n <= 0 || (size_t)n > SIZE_MAX - pg) {
		PyErr_SetString(PyExc_ValueError, "alloc_host: nbytes must be >= 1");
		return NULL;
	}
	size = ((size_t)n + pg - 1) & ~(pg - 1);
	if (kvbpy_enter(cl) < 0)
		return NULL;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		int fd = memfd_create("kvbroker-py", MFD_CLOEXEC | MFD_ALLOW_SEALING);

		if (fd < 0 || ftruncate(fd, (off_t)size) < 0 ||
		    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
			err = -errno;
		} else {
			p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			if (p == MAP_FAILED)
				err = -errno;
			else
				err = kvb_buf_register_host_fd(cl->c, fd, 0, size, p, 0, &id);
			if (err < 0 && p != MAP_FAILED) {
				munmap(p, size);
				p = MAP_FAILED;
			}
		}
		if (fd >= 0)
			close(fd);
		if (err == -EOPNOTSUPP) {
			/* A broker before ABI 1.2: the library's own buffer, tied to the registration. */
			void *q = kvb_buf_alloc_host(cl->c, size, &id);

			err = q ? 0 : errno ? -errno : -ENOMEM;
			p = q ? q : MAP_FAILED;
			lib = 1;
		}
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (err < 0)
		return kvbpy_raise(err);
	b = hostbuf_alloc(cl);
	if (!b) {
		if (cl->c) /* (out of memory; GC may have run close() meanwhile) */
			kvb_buf_unregister(cl->c, id); /* unmaps it too when it is the library's */
		if (!lib)
			munmap(p, size);
		return NULL;
	}
	b->data = p;
	b->len = (size_t)n;
	b->lib_owned = lib;
	if (!lib) {
		b->map = p;
		b->map_len = size;
	}
	b->reg.addr = (uintptr_t)p;
	b->reg.len = size;
	b->reg.id = id;
	b->reg.lib_exports = lib ? &b->exports : NULL;
	kvbpy_reg_add(cl, &b->reg);
	return (PyObject *)b;
}

PyObject *kvbpy_register_host_fd(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwl[] = {"fd", "nbytes", "offset", "seal", "mapped", "fdcopy", NULL};
	kvbpy_client *cl = (kvbpy_client *)self;
	unsigned long long off = 0;
	PyObject *mapped = Py_None;
	Py_ssize_t n;
	int fd, seal = 0, fdcopy = 0, err;
	uint32_t id = 0;
	struct stat st;
	hostbuf *b;
	void *addr;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "in|K$pOp:register_host_fd", kwl, &fd, &n, &off,
					 &seal, &mapped, &fdcopy))
		return NULL;
	if (n <= 0 || off > (unsigned long long)INT64_MAX - (unsigned long long)n) {
		PyErr_SetString(PyExc_ValueError, "register_host_fd: nbytes must be >= 1");
		return NULL;
	}
	b = hostbuf_alloc(cl);
	if (!b)
		return NULL;
	b->len = (size_t)n;
	if (mapped != Py_None) {
		if (kvbpy_mem_get(cl, mapped, 1, &b->mapped) < 0)
			goto err;
		if (b->mapped.gpu || b->mapped.len < (size_t)n) {
			PyErr_SetString(PyExc_ValueError,
					"mapped: host memory of at least nbytes expected");
			goto err;
		}
		b->data = b->mapped.ptr;
	} else {
		size_t pg = page_size(), delta = (size_t)(off & (pg - 1));
		void *p;

		/* Mapping past the file's end would SIGBUS here: check before the broker does. */
		if (fstat(fd, &st) < 0) {
			PyErr_SetFromErrno(PyExc_OSError);
			goto err;
		}
		if ((unsigned long long)st.st_size < off + (unsigned long long)n) {
			kvbpy_raise_msg(kvbpy_Error, EFAULT, "range runs past the file's size");
			goto err;
		}
		p = mmap(NULL, (size_t)n + delta, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
			 (off_t)(off - delta));
		if (p == MAP_FAILED) {
			PyErr_SetFromErrno(PyExc_OSError);
			goto err;
		}
		b->map = p;
		b->map_len = (size_t)n + delta;
		b->data = (char *)p + delta;
	}
	addr = b->data;
	if (kvbpy_enter(cl) < 0)
		goto err;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_buf_register_host_fd(
			cl->c, fd, off, (size_t)n, addr,
			(seal ? KVB_BUF_SEAL : 0) | (fdcopy ? KVB_BUF_FDCOPY : 0), &id);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (err < 0) {
		kvbpy_raise(err);
		goto err;
	}
	b->reg.addr = (uintptr_t)addr;
	b->reg.len = (size_t)n;
	b->reg.id = id;
	kvbpy_reg_add(cl, &b->reg);
	return (PyObject *)b;
err:
	Py_DECREF(b);
	return NULL;
}

static int hostbuf_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
	hostbuf *b = (hostbuf *)self;

	if (!b->data || (b->lib_owned && !b->reg.next)) {
		PyErr_SetString(PyExc_BufferError,
				"host buffer memory is gone (unregistered, or its client closed)");
		return -1;
	}
	if (PyBuffer_FillInfo(view, self, b->data, (Py_ssize_t)b->len, 0, flags) < 0)
		return -1;
	b->exports++;
	return 0;
}

static void hostbuf_releasebuffer(PyObject *self, Py_buffer *view)
{
	(void)view;
	((hostbuf *)self)->exports--;
}

static PyObject *hostbuf_unregister(PyObject *self, PyObject *unused)
{
	hostbuf *b = (hostbuf *)self;

	(void)unused;
	if (b->lib_owned && b->exports && b->reg.next) {
		PyErr_SetString(PyExc_BufferError,
				"cannot unregister: the buffer's memory is still referenced");
		return NULL;
	}
	if (unregister_id(b->cl, &b->reg, 1) < 0)
		return NULL;
	return Py_NewRef(Py_None);
}

static void hostbuf_dealloc(PyObject *self)
{
	hostbuf *b = (hostbuf *)self;
	PyTypeObject *tp = Py_TYPE(self);

	unregister_id(b->cl, &b->reg, 0);
	if (b->map)
		munmap(b->map, b->map_len);
	kvbpy_mem_release(&b->mapped);
	Py_DECREF(b->cl);
	PyObject_Free(self);
	Py_DECREF(tp);
}

static PyObject *hostbuf_numpy(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwl[] = {"dtype", NULL};
	PyObject *dtype = NULL, *np, *r;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:numpy", kwl, &dtype))
		return NULL;
	np = PyImport_ImportModule("numpy");
	if (!np)
		return NULL;
	if (!dtype || dtype == Py_None)
		r = PyObject_CallMethod(np, "frombuffer", "(Os)", self, "uint8");
	else
		r = PyObject_CallMethod(np, "frombuffer", "(OO)", self, dtype);
	Py_DECREF(np);
	return r;
}

static PyObject *self_enter(PyObject *self, PyObject *unused)
{
	(void)unused;
	return Py_NewRef(self);
}

static PyObject *hostbuf_exit(PyObject *self, PyObject *args)
{
	(void)args;
	return hostbuf_unregister(self, NULL);
}

static PyObject *hostbuf_get_id(PyObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromUnsignedLong(((hostbuf *)self)->reg.id);
}

static PyObject *hostbuf_get_nbytes(PyObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromSize_t(((hostbuf *)self)->len);
}

static PyObject *hostbuf_get_address(PyObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromVoidPtr(((hostbuf *)self)->data);
}

static PyObject *hostbuf_get_registered(PyObject *self, void *unused)
{
	(void)unused;
	return PyBool_FromLong(((hostbuf *)self)->reg.next != NULL);
}

static Py_ssize_t hostbuf_len(PyObject *self)
{
	return (Py_ssize_t)((hostbuf *)self)->len;
}

static PyMethodDef hostbuf_methods[] = {
	{"unregister", hostbuf_unregister, METH_NOARGS,
	 "unregister() -> None\n--\n\nEnds the registration (idempotent). The memory stays "
	 "usable as plain memory,\nexcept on a pre-1.2 broker, where it is the library's and is "
	 "unmapped."},
	{"numpy", (PyCFunction)(void (*)(void))hostbuf_numpy, METH_VARARGS | METH_KEYWORDS,
	 "numpy(dtype=None) -> numpy.ndarray\n--\n\nA writable numpy array over the buffer "
	 "(uint8 unless dtype), no copy."},
	{"__enter__", self_enter, METH_NOARGS, "Returns the buffer."},
	{"__exit__", hostbuf_exit, METH_VARARGS, "Unregisters the buffer."},
	{NULL, NULL, 0, NULL},
};

static PyGetSetDef hostbuf_getset[] = {
	{"id", hostbuf_get_id, NULL, "The broker's buffer id (for Op.buf).", NULL},
	{"nbytes", hostbuf_get_nbytes, NULL, "Usable bytes.", NULL},
	{"address", hostbuf_get_address, NULL, "Address of the first byte in this process.", NULL},
	{"registered", hostbuf_get_registered, NULL, "True until unregister() or client close.",
	 NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot hostbuf_slots[] = {
	{Py_tp_doc, "Host memory registered with the broker (Client.alloc_host, "
		    "Client.register_host_fd).\nWritable buffer protocol: memoryview(buf), "
		    "buf.numpy(). Puts from it and gets into it\nare copied by the broker "
		    "directly."},
	{Py_tp_dealloc, hostbuf_dealloc},
	{Py_tp_methods, hostbuf_methods},
	{Py_tp_getset, hostbuf_getset},
	{Py_bf_getbuffer, hostbuf_getbuffer},
	{Py_bf_releasebuffer, hostbuf_releasebuffer},
	{Py_sq_length, hostbuf_len},
	{0, NULL},
};

static PyType_Spec hostbuf_spec = {
	.name = "kvbroker._kvbroker.HostBuffer",
	.basicsize = sizeof(hostbuf),
	.flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
	.slots = hostbuf_slots,
};

/* ---- GpuBuffer ---- */

PyObject *kvbpy_register_gpu(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwl[] = {"memory", "nbytes", NULL};
	kvbpy_client *cl = (kvbpy_client *)self;
	PyObject *mem, *nbo = Py_None, *owner = NULL;
	unsigned long long p;
	long long nb = -1;
	uint32_t id = 0;
	gpubuf *g;
	int err;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:register_gpu", kwl, &mem, &nbo))
		return NULL;
	if (nbo != Py_None) {
		nb = PyLong_AsLongLong(nbo);
		if (nb == -1 && PyErr_Occurred())
			return NULL;
	}
	if (PyLong_Check(mem)) {
		p = PyLong_AsUnsignedLongLong(mem);
		if (PyErr_Occurred())
			return NULL;
		if (nb < 0) {
			PyErr_SetString(PyExc_TypeError,
					"register_gpu(ptr, nbytes): nbytes needed");
			return NULL;
		}
	} else {
		PyObject *v = PyObject_CallMethod(mem, "data_ptr", NULL);

		if (!v)
			return NULL;
		p = PyLong_AsUnsignedLongLong(v);
		Py_DECREF(v);
		if (PyErr_Occurred())
			return NULL;
		if (nb < 0) {
			v = PyObject_GetAttrString(mem, "nbytes");
			if (!v)
				return NULL;
			nb = PyLong_AsLongLong(v);
			Py_DECREF(v);
			if (nb == -1 && PyErr_Occurred())
				return NULL;
		}
		owner = mem;
	}
	if (nb <= 0) {
		PyErr_SetString(PyExc_ValueError, "register_gpu: nbytes must be >= 1");
		return NULL;
	}
	if (kvbpy_enter(cl) < 0)
		return NULL;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_buf_register_gpu(cl->c, (void *)(uintptr_t)p, (size_t)nb, &id);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (err < 0)
		return kvbpy_raise(err);
	g = PyObject_New(gpubuf, kvbpy_GpuBufferType);
	if (!g) {
		if (cl->c)
			kvb_buf_unregister(cl->c, id);
		return NULL;
	}
	g->cl = (kvbpy_client *)Py_NewRef(self);
	memset(&g->reg, 0, sizeof(g->reg));
	g->reg.addr = (uintptr_t)p;
	g->reg.len = (size_t)nb;
	g->reg.id = id;
	g->reg.gpu = 1;
	g->owner = owner ? Py_NewRef(owner) : NULL;
	kvbpy_reg_add(cl, &g->reg);
	return (PyObject *)g;
}

static PyObject *gpubuf_unregister(PyObject *self, PyObject *unused)
{
	(void)unused;
	if (unregister_id(((gpubuf *)self)->cl, &((gpubuf *)self)->reg, 1) < 0)
		return NULL;
	return Py_NewRef(Py_None);
}

static void gpubuf_dealloc(PyObject *self)
{
	gpubuf *g = (gpubuf *)self;
	PyTypeObject *tp = Py_TYPE(self);

	unregister_id(g->cl, &g->reg, 0);
	Py_XDECREF(g->owner);
	Py_DECREF(g->cl);
	PyObject_Free(self);
	Py_DECREF(tp);
}

static PyObject *gpubuf_exit(PyObject *self, PyObject *args)
{
	(void)args;
	return gpubuf_unregister(self, NULL);
}

static PyObject *gpubuf_get_id(PyObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromUnsignedLong(((gpubuf *)self)->reg.id);
}

static PyObject *gpubuf_get_nbytes(PyObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromSize_t(((gpubuf *)self)->reg.len);
}

static PyObject *gpubuf_get_ptr(PyObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromUnsignedLongLong(((gpubuf *)self)->reg.addr);
}

static PyObject *gpubuf_get_registered(PyObject *self, void *unused)
{
	(void)unused;
	return PyBool_FromLong(((gpubuf *)self)->reg.next != NULL);
}

static PyMethodDef gpubuf_methods[] = {
	{"unregister", gpubuf_unregister, METH_NOARGS,
	 "unregister() -> None\n--\n\nEnds the registration (idempotent); copies in flight "
	 "finish first, in the broker."},
	{"__enter__", self_enter, METH_NOARGS, "Returns the buffer."},
	{"__exit__", gpubuf_exit, METH_VARARGS, "Unregisters the buffer."},
	{NULL, NULL, 0, NULL},
};

static PyGetSetDef gpubuf_getset[] = {
	{"id", gpubuf_get_id, NULL, "The broker's buffer id (for Op.buf, ViewPart.buf).", NULL},
	{"nbytes", gpubuf_get_nbytes, NULL, "Registered bytes.", NULL},
	{"ptr", gpubuf_get_ptr, NULL, "The device pointer of the first byte.", NULL},
	{"registered", gpubuf_get_registered, NULL, "True until unregister() or client close.",
	 NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot gpubuf_slots[] = {
	{Py_tp_doc, "GPU memory registered with the broker (Client.register_gpu). Holds the "
		    "tensor it came\nfrom, so the memory stays allocated while registered."},
	{Py_tp_dealloc, gpubuf_dealloc},
	{Py_tp_methods, gpubuf_methods},
	{Py_tp_getset, gpubuf_getset},
	{0, NULL},
};

static PyType_Spec gpubuf_spec = {
	.name = "kvbroker._kvbroker.GpuBuffer",
	.basicsize = sizeof(gpubuf),
	.flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
	.slots = gpubuf_slots,
};

/* ---- Lease ---- */

PyObject *kvbpy_lease_new(kvbpy_client *cl, const struct kvb_lease *l)
{
	lease *o = PyObject_New(lease, kvbpy_LeaseType);

	if (!o) {
		struct kvb_lease tmp = *l;

		if (cl->c && !kvbpy_forked(cl))
			kvb_release(cl->c, &tmp);
		return NULL;
	}
	o->cl = (kvbpy_client *)Py_NewRef((PyObject *)cl);
	o->l = *l;
	o->exports = 0;
	o->mv = NULL;
	o->node.exports = &o->exports;
	o->node.next = cl->leases.next;
	o->node.prev = &cl->leases;
	cl->leases.next->prev = &o->node;
	cl->leases.next = &o->node;
	return (PyObject *)o;
}

static int lease_held(const lease *o)
{
	return o->node.next != NULL;
}

static void lease_unlink(lease *o)
{
	if (!o->node.next)
		return;
	o->node.prev->next = o->node.next;
	o->node.next->prev = o->node.prev;
	o->node.next = o->node.prev = NULL;
}

static PyObject *lease_release(PyObject *self, PyObject *unused)
{
	lease *o = (lease *)self;
	kvbpy_client *cl = o->cl;
	int err;

	(void)unused;
	if (o->mv) {
		PyObject *r = PyObject_CallMethod(o->mv, "release", NULL);

		if (!r)
			return NULL; /* BufferError: someone still holds a view of it */
		Py_DECREF(r);
		Py_CLEAR(o->mv);
	}
	if (!lease_held(o))
		return Py_NewRef(Py_None);
	if (o->exports) {
		PyErr_SetString(PyExc_BufferError,
				"cannot release: the lease's data is still referenced");
		return NULL;
	}
	if (kvbpy_enter(cl) < 0)
		return NULL;
	lease_unlink(o);
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_release(cl->c, &o->l);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	o->l.data = NULL;
	if (err < 0)
		return kvbpy_raise(err);
	return Py_NewRef(Py_None);
}

static void lease_dealloc(PyObject *self)
{
	lease *o = (lease *)self;
	kvbpy_client *cl = o->cl;
	PyTypeObject *tp = Py_TYPE(self);

	if (lease_held(o)) {
		lease_unlink(o);
		if (cleanup_ok(cl)) {
			cl->busy++;
			{
				PyThreadState *ts_ = PyEval_SaveThread();

				kvb_release(cl->c, &o->l);
				PyEval_RestoreThread(ts_);
			}
			kvbpy_leave(cl);
		}
	}
	Py_XDECREF(o->mv);
	Py_DECREF(cl);
	PyObject_Free(self);
	Py_DECREF(tp);
}

static int lease_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
	lease *o = (lease *)self;

	if (!lease_held(o)) {
		PyErr_SetString(PyExc_BufferError, "lease released (or its client closed)");
		return -1;
	}
	if (PyBuffer_FillInfo(view, self, (void *)(uintptr_t)o->l.data, (Py_ssize_t)o->l.len, 1,
			      flags) < 0)
		return -1;
	o->exports++;
	return 0;
}

static void lease_releasebuffer(PyObject *self, Py_buffer *view)
{
	(void)view;
	((lease *)self)->exports--;
}

static PyObject *lease_data(PyObject *self, void *unused)
{
	(void)unused;
	return PyMemoryView_FromObject(self);
}

static PyObject *lease_enter(PyObject *self, PyObject *unused)
{
	lease *o = (lease *)self;

	(void)unused;
	if (!o->mv) {
		o->mv = PyMemoryView_FromObject(self);
		if (!o->mv)
			return NULL;
	}
	return Py_NewRef(o->mv);
}

static PyObject *lease_exit(PyObject *self, PyObject *args)
{
	(void)args;
	return lease_release(self, NULL);
}

static PyObject *lease_get_id(PyObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromUnsignedLongLong(((lease *)self)->l.id);
}

static PyObject *lease_get_nbytes(PyObject *self, void *unused)
{
	(void)unused;
	return PyLong_FromSize_t(((lease *)self)->l.len);
}

static PyObject *lease_get_held(PyObject *self, void *unused)
{
	(void)unused;
	return PyBool_FromLong(lease_held((lease *)self));
}

/*
 * The library's copy out of the page (kvb_lease_copy): streaming stores where numpy's or
 * bytes' memcpy would read the destination first. The GIL is dropped for the copy; the lease
 * counts as exported meanwhile, so that neither release() nor the client's close() pulls the
 * page from under it.
 */
static PyObject *lease_copy_into(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"dst", "offset", NULL};
	lease *o = (lease *)self;
	Py_ssize_t off = 0;
	Py_buffer dst;
	int err;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "w*|n:copy_into", kwlist, &dst, &off))
		return NULL;
	if (!lease_held(o) || off < 0 || (size_t)off > o->l.len ||
	    (size_t)dst.len > o->l.len - (size_t)off) {
		PyErr_Format(PyExc_ValueError,
			     lease_held(o) ? "%zd bytes from offset %zd: outside the %zu-byte page"
					   : "lease released (or its client closed)",
			     dst.len, off, o->l.len);
		PyBuffer_Release(&dst);
		return NULL;
	}
	o->exports++;
	Py_BEGIN_ALLOW_THREADS;
	err = kvb_lease_copy(&o->l, (size_t)off, dst.buf, (size_t)dst.len);
	Py_END_ALLOW_THREADS;
	o->exports--;
	PyBuffer_Release(&dst);
	if (err < 0)
		return kvbpy_raise(err);
	return PyLong_FromSsize_t(dst.len);
}

static Py_ssize_t lease_len(PyObject *self)
{
	return (Py_ssize_t)((lease *)self)->l.len;
}

static PyMethodDef lease_methods[] = {
	{"release", lease_release, METH_NOARGS,
	 "release() -> None\n--\n\nUnpins the page (idempotent). BufferError while its data is "
	 "still referenced."},
	{"copy_into", (PyCFunction)(void (*)(void))lease_copy_into, METH_VARARGS | METH_KEYWORDS,
	 "copy_into(dst, offset=0) -> int\n--\n\nCopies dst's whole buffer (its nbytes) of the "
	 "page from offset into the writable buffer dst with the library's copy (kvb_lease_copy: "
	 "streaming stores, the GIL dropped) and returns that count. ValueError past the page's "
	 "end."},
	{"__enter__", lease_enter, METH_NOARGS,
	 "Returns a read-only memoryview of the page, released again by __exit__."},
	{"__exit__", lease_exit, METH_VARARGS, "Releases the memoryview and the lease."},
	{NULL, NULL, 0, NULL},
};

static PyGetSetDef lease_getset[] = {
	{"data", lease_data, NULL, "A read-only memoryview of the page (zero-copy).", NULL},
	{"id", lease_get_id, NULL, "The lease's capability id.", NULL},
	{"nbytes", lease_get_nbytes, NULL, "The page's size.", NULL},
	{"held", lease_get_held, NULL, "True until release() or client close.", NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot lease_slots[] = {
	{Py_tp_doc, "A pinned page read in place (Namespace.acquire). `with ns.acquire(key) as "
		    "mv:` gives a\nread-only memoryview of the page, valid inside the block."},
	{Py_tp_dealloc, lease_dealloc},
	{Py_tp_methods, lease_methods},
	{Py_tp_getset, lease_getset},
	{Py_bf_getbuffer, lease_getbuffer},
	{Py_bf_releasebuffer, lease_releasebuffer},
	{Py_sq_length, lease_len},
	{0, NULL},
};

static PyType_Spec lease_spec = {
	.name = "kvbroker._kvbroker.Lease",
	.basicsize = sizeof(lease),
	.flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
	.slots = lease_slots,
};

int kvbpy_buffers_init_type(PyObject *m)
{
	kvbpy_HostBufferType = (PyTypeObject *)PyType_FromSpec(&hostbuf_spec);
	kvbpy_GpuBufferType = (PyTypeObject *)PyType_FromSpec(&gpubuf_spec);
	kvbpy_LeaseType = (PyTypeObject *)PyType_FromSpec(&lease_spec);
	if (!kvbpy_HostBufferType || !kvbpy_GpuBufferType || !kvbpy_LeaseType)
		return -1;
	if (PyModule_AddObjectRef(m, "HostBuffer", (PyObject *)kvbpy_HostBufferType) < 0 ||
	    PyModule_AddObjectRef(m, "GpuBuffer", (PyObject *)kvbpy_GpuBufferType) < 0 ||
	    PyModule_AddObjectRef(m, "Lease", (PyObject *)kvbpy_LeaseType) < 0)
		return -1;
	return 0;
}
