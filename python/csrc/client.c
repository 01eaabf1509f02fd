// SPDX-License-Identifier: MIT
/*
 * client.c - the Client type: connect, close, nop, stats, namespaces, buffer registration,
 * the completion fd, and the low-level submit()/reap().
 *
 * Lifetime: tp_init connects, close() (also __exit__ and dealloc) disconnects once. close()
 * first marks the client closing, so no new call starts, then waits with the GIL released for
 * the calls in flight (busy) to return, and only then calls kvb_close(): the C library forbids
 * kvb_close() racing any other call. It refuses (BufferError, client left open) while memory
 * that kvb_close() would unmap is still exported: a lease's data, or a host buffer that came
 * from kvb_buf_alloc_host() (only on a broker without register-by-fd).
 *
 * In a forked child close() and dealloc forget the client without a word to the broker: its
 * socket, rings and leases are the parent's.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvbpy.h"

PyTypeObject *kvbpy_ClientType;

void kvbpy_reg_add(kvbpy_client *cl, struct kvbpy_reg *r)
{
	r->next = cl->regs.next;
	r->prev = &cl->regs;
	cl->regs.next->prev = r;
	cl->regs.next = r;
}

void kvbpy_reg_del(struct kvbpy_reg *r)
{
	if (!r->next)
		return;
	r->prev->next = r->next;
	r->next->prev = r->prev;
	r->next = r->prev = NULL;
}

const struct kvbpy_reg *kvbpy_reg_find(const kvbpy_client *cl, uintptr_t p, size_t len)
{
	for (const struct kvbpy_reg *r = cl->regs.next; r != &cl->regs; r = r->next)
		if (r->addr && p >= r->addr && len <= r->len && p - r->addr <= r->len - len)
			return r;
	return NULL;
}

static PyObject *client_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	kvbpy_client *cl = (kvbpy_client *)PyType_GenericNew(type, args, kw);

	if (!cl)
		return NULL;
	cl->regs.next = cl->regs.prev = &cl->regs;
	cl->leases.next = cl->leases.prev = &cl->leases;
	cl->cfd = -1;
	cl->gen = kvbpy_fork_gen;
	if (pthread_mutex_init(&cl->batch_lock, NULL)) {
		Py_DECREF(cl);
		return PyErr_NoMemory();
	}
	return (PyObject *)cl;
}

/* A str, bytes or os.PathLike argument as a C string owned by *keep (NULL for None). */
static int path_arg(PyObject *o, PyObject **keep, const char **out)
{
	*keep = NULL;
	*out = NULL;
	if (!o || o == Py_None)
		return 0;
	if (!PyUnicode_FSConverter(o, keep))
		return -1;
	*out = PyBytes_AsString(*keep);
	return *out ? 0 : -1;
}

static int client_init(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwl[] = {"socket",	 "name",      "gpu_busid",    "numa_node", "sq_entries",
			      "control", "reconnect", "reconnect_ms", NULL};
	kvbpy_client *cl = (kvbpy_client *)self;
	PyObject *sock = NULL, *name = NULL, *busid = NULL, *numa = Py_None;
	PyObject *ks = NULL, *kn = NULL, *kb = NULL;
	struct kvb_opts o;
	unsigned int sq = 0, reconnect_ms = 0;
	int control = 0, reconnect = 1, err;
	kvb_client *c = NULL;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O$OOOIppI:Client", kwl, &sock, &name, &busid,
					 &numa, &sq, &control, &reconnect, &reconnect_ms))
		return -1;
	if (cl->c) {
		PyErr_SetString(PyExc_RuntimeError, "Client is already connected");
		return -1;
	}
	memset(&o, 0, sizeof(o));
	if (path_arg(sock, &ks, &o.socket_path) < 0 || path_arg(name, &kn, &o.name) < 0 ||
	    path_arg(busid, &kb, &o.gpu_busid) < 0)
		goto err;
	if (numa != Py_None) {
		long n = PyLong_AsLong(numa);

		if (n == -1 && PyErr_Occurred())
			goto err;
		if (n < 0 || n > INT32_MAX) {
			PyErr_SetString(PyExc_ValueError, "numa_node must be >= 0");
			goto err;
		}
		o.numa_node = (int32_t)n;
		o.flags |= KVB_CONNECT_NUMA_NODE;
	}
	if (control)
		o.flags |= KVB_CONNECT_CONTROL;
	if (!reconnect) /* [RECONNECT] of client/conn.c: on by default, as in C */
		o.flags |= KVB_CONNECT_NO_RECONNECT;
	o.reconnect_ms = reconnect_ms;
	o.sq_entries = sq;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_connect(&o, &c);
		PyEval_RestoreThread(ts_);
	}
	if (err < 0)
		kvbpy_raise_connect(err, o.socket_path); /* before ks, which owns the path, goes */
	Py_XDECREF(ks);
	Py_XDECREF(kn);
	Py_XDECREF(kb);
	if (err < 0)
		return -1;
	cl->c = c;
	cl->gen = kvbpy_fork_gen;
	cl->control = control;
	cl->closing = 0;
	return 0;
err:
	Py_XDECREF(ks);
	Py_XDECREF(kn);
	Py_XDECREF(kb);
	return -1;
}

/* Raises BufferError when kvb_close() would pull memory from under a live export. */
static int check_exports(kvbpy_client *cl)
{
	for (struct kvbpy_lease_node *n = cl->leases.next; n != &cl->leases; n = n->next)
		if (*n->exports) {
			PyErr_SetString(PyExc_BufferError,
					"cannot close: a lease's data is still referenced (release "
					"the memoryview, or leave its with block, first)");
			return -1;
		}
	for (struct kvbpy_reg *r = cl->regs.next; r != &cl->regs; r = r->next)
		if (r->lib_exports && *r->lib_exports) {
			PyErr_SetString(
				PyExc_BufferError,
				"cannot close: a host buffer owned by the client library is "
				"still referenced");
			return -1;
		}
	return 0;
}

/* Detaches; 0 or -1 with an exception (the client stays open then). */
static int client_detach(kvbpy_client *cl)
{
	kvb_client *c = cl->c;

	if (!c)
		return 0;
	if (kvbpy_forked(cl)) {
		cl->c = NULL; /* the parent's: leave it alone */
		return 0;
	}
	if (cl->closing)
		return 0; /* another thread is closing it */
	cl->closing = 1;
	while (cl->busy) {
		{
			PyThreadState *ts_ = PyEval_SaveThread();

			usleep(200);
			PyEval_RestoreThread(ts_);
		}
	}
	if (check_exports(cl) < 0) {
		cl->closing = 0;
		return -1;
	}
	/* Buffers and leases now refer to nothing: their own cleanup must not call in. */
	while (cl->regs.next != &cl->regs)
		kvbpy_reg_del(cl->regs.next);
	while (cl->leases.next != &cl->leases) {
		struct kvbpy_lease_node *n = cl->leases.next;

		n->prev->next = n->next;
		n->next->prev = n->prev;
		n->next = n->prev = NULL;
	}
	cl->c = NULL;
	cl->cfd = -1;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		kvb_close(c);
		PyEval_RestoreThread(ts_);
	}
	cl->closing = 0;
	return 0;
}

static void client_dealloc(PyObject *self)
{
	kvbpy_client *cl = (kvbpy_client *)self;
	PyTypeObject *tp = Py_TYPE(self);

	/* Nothing refers to us, so nothing is exported: the detach cannot fail. */
	if (client_detach(cl) < 0)
		PyErr_WriteUnraisable(self);
	pthread_mutex_destroy(&cl->batch_lock);
	free(cl->stash);
	((freefunc)PyType_GetSlot(tp, Py_tp_free))(self);
	Py_DECREF(tp);
}

static PyObject *client_close(PyObject *self, PyObject *unused)
{
	(void)unused;
	if (client_detach((kvbpy_client *)self) < 0)
		return NULL;
	return Py_NewRef(Py_None);
}

static PyObject *client_enter(PyObject *self, PyObject *unused)
{
	kvbpy_client *cl = (kvbpy_client *)self;

	(void)unused;
	if (kvbpy_enter(cl) < 0)
		return NULL;
	kvbpy_leave(cl);
	return Py_NewRef(self);
}

static PyObject *client_exit(PyObject *self, PyObject *args)
{
	(void)args;
	return client_close(self, NULL);
}

static PyObject *client_closed(PyObject *self, void *unused)
{
	(void)unused;
	return PyBool_FromLong(((kvbpy_client *)self)->c == NULL);
}

static PyObject *client_nop(PyObject *self, PyObject *unused)
{
	kvbpy_client *cl = (kvbpy_client *)self;
	int err;

	(void)unused;
	if (kvbpy_enter(cl) < 0)
		return NULL;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_nop(cl->c);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (err < 0)
		return kvbpy_raise(err);
	return Py_NewRef(Py_None);
}

static PyObject *client_stats_json(PyObject *self, PyObject *unused)
{
	kvbpy_client *cl = (kvbpy_client *)self;
	char *json = NULL;
	PyObject *s;
	int err;

	(void)unused;
	if (kvbpy_enter(cl) < 0)
		return NULL;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_stats_json(cl->c, &json);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (err < 0)
		return kvbpy_raise(err);
	s = PyUnicode_FromString(json);
	free(json);
	return s;
}

/*
 * ns_open(layout): layout._c_args() gives (model, kind, tokens_per_page, tp_size, tp_rank,
 * components, page_format, pp_size, pp_rank, cp_size, cp_rank, dp_size, dp_rank), components
 * a tuple of (name, num_layers, bytes_per_token_layer, dtype) with enum kvb_dtype numbers: the
 * Python Layout class validates and normalizes, this only packs.
 */
static PyObject *client_ns_open(PyObject *self, PyObject *layout)
{
	kvbpy_client *cl = (kvbpy_client *)self;
	struct kvb_layout l;
	struct kvb_ns_ident id;
	const char *model, *fmt;
	PyObject *a, *comps;
	kvbpy_ns *ns;
	uint32_t nsid, nparts = 0;
	size_t pb;
	int err;

	a = PyObject_CallMethod(layout, "_c_args", NULL);
	if (!a)
		return NULL;
	memset(&l, 0, sizeof(l));
	memset(&id, 0, sizeof(id));
	if (!PyArg_ParseTuple(a, "sIIIIO!sIIIIII:ns_open", &model, &l.kind, &l.tokens_per_page,
			      &l.tp_size, &l.tp_rank, &PyTuple_Type, &comps, &fmt, &id.pp_size,
			      &id.pp_rank, &id.cp_size, &id.cp_rank, &id.dp_size, &id.dp_rank))
		goto err;
	if (strlen(model) >= KVB_MODEL_MAX || strlen(fmt) >= KVB_PAGE_FORMAT_MAX) {
		PyErr_SetString(PyExc_ValueError, "model or page_format too long");
		goto err;
	}
	strcpy(l.model, model);
	strcpy(id.page_format, fmt);
	if (PyTuple_Size(comps) < 1 || PyTuple_Size(comps) > KVB_MAX_COMPONENTS) {
		PyErr_SetString(PyExc_ValueError, "a layout has 1 to 4 components");
		goto err;
	}
	l.ncomponents = (uint32_t)PyTuple_Size(comps);
	for (uint32_t i = 0; i < l.ncomponents; i++) {
		const char *name;

		if (!PyArg_ParseTuple(PyTuple_GetItem(comps, i), "sIII:component", &name,
				      &l.comp[i].num_layers, &l.comp[i].bytes_per_token_layer,
				      &id.dtype[i]))
			goto err;
		if (strlen(name) >= KVB_COMP_NAME_MAX) {
			PyErr_SetString(PyExc_ValueError, "component name too long");
			goto err;
		}
		strcpy(l.comp[i].name, name);
		nparts += l.comp[i].num_layers;
	}
	if (kvbpy_enter(cl) < 0)
		goto err;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_ns_open2(cl->c, &l, &id, &nsid, &pb);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (err < 0) {
		kvbpy_raise(err);
		goto err;
	}
	Py_DECREF(a);
	ns = PyObject_New(kvbpy_ns, kvbpy_NamespaceType);
	if (!ns)
		return NULL;
	ns->cl = (kvbpy_client *)Py_NewRef(self);
	ns->layout = Py_NewRef(layout);
	ns->id = nsid;
	ns->page_bytes = pb;
	ns->nparts = nparts;
	ns->tokens_per_page = l.tokens_per_page;
	return (PyObject *)ns;
err:
	Py_DECREF(a);
	return NULL;
}

static PyObject *client_completion_fd(PyObject *self, PyObject *unused)
{
	kvbpy_client *cl = (kvbpy_client *)self;
	int fd;

	(void)unused;
	if (kvbpy_enter(cl) < 0)
		return NULL;
	if (cl->cfd < 0) {
		{
			PyThreadState *ts_ = PyEval_SaveThread();

			fd = kvb_completion_fd(cl->c);
			PyEval_RestoreThread(ts_);
		}
		if (fd >= 0)
			cl->cfd = fd;
	} else {
		fd = cl->cfd;
	}
	kvbpy_leave(cl);
	if (fd < 0)
		return kvbpy_raise(fd);
	return PyLong_FromLong(fd);
}

/* submit(ops): ops are Op tuples (opcode, flags, ns, buf, key, off, layer_first, layer_count,
 * user_data[, parent]); a parent key (not None) sets OPF_PARENT [chain]. Returns how many were
 * queued. */
static PyObject *client_submit(PyObject *self, PyObject *ops)
{
	kvbpy_client *cl = (kvbpy_client *)self;
	struct kvb_op *v;
	kvb_key *par;
	Py_ssize_t n = PySequence_Size(ops);
	int err;

	if (n < 0)
		return NULL;
	v = calloc((size_t)n + 1, sizeof(*v));
	par = calloc((size_t)n + 1, sizeof(*par));
	if (!v || !par) {
		free(v);
		free(par);
		return PyErr_NoMemory();
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *o = PySequence_GetItem(ops, i), *key, *parent = Py_None;
		unsigned long long off, ud;
		unsigned int lf, lc;
		int ok;

		if (!o)
			goto err;
		ok = PyArg_ParseTuple(o, "IIIIOKIIK|O:Op", &v[i].opcode, &v[i].flags, &v[i].ns,
				      &v[i].buf, &key, &off, &lf, &lc, &ud, &parent) &&
		     kvbpy_key(key, &v[i].key) == 0 &&
		     (parent == Py_None || kvbpy_key(parent, &par[i]) == 0);
		if (ok && parent != Py_None)
			v[i].flags |= KVB_OPF_PARENT;
		Py_DECREF(o);
		if (!ok)
			goto err;
		if (lf > UINT16_MAX || lc > UINT16_MAX || ud >= KVBPY_TAG) {
			PyErr_SetString(PyExc_ValueError,
					"Op: layer fields are 16 bits, user_data below 2**63");
			goto err;
		}
		v[i].off = off;
		v[i].layer_first = (uint16_t)lf;
		v[i].layer_count = (uint16_t)lc;
		v[i].user_data = ud;
	}
	if (kvbpy_enter(cl) < 0)
		goto err;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_submit_parents(cl->c, v, par, (size_t)n);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	free(v);
	free(par);
	if (err < 0)
		return kvbpy_raise(err);
	return PyLong_FromLong(err);
err:
	free(v);
	free(par);
	return NULL;
}

static PyObject *completion_tuple(kvbpy_client *cl, const struct kvb_completion *c)
{
	PyObject *lease = Py_None;

	if (c->lease.data && c->res >= 0) {
		lease = kvbpy_lease_new(cl, &c->lease);
		if (!lease)
			return NULL;
	} else {
		Py_INCREF(lease);
	}
	return Py_BuildValue("(KiIN)", (unsigned long long)c->user_data, c->res, c->flags, lease);
}

/* reap(max=64, min=1, timeout_ms=-1) -> list of (user_data, res, flags, lease or None). */
static PyObject *client_reap(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwl[] = {"max", "min", "timeout_ms", NULL};
	kvbpy_client *cl = (kvbpy_client *)self;
	Py_ssize_t max = 64, min = 1;
	int tmo = -1, err = 0;
	struct kvb_completion *out;
	size_t got = 0;
	PyObject *list;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|nni:reap", kwl, &max, &min, &tmo))
		return NULL;
	if (max < 1 || min < 0 || min > max) {
		PyErr_SetString(PyExc_ValueError, "reap: need 0 <= min <= max, max >= 1");
		return NULL;
	}
	out = calloc((size_t)max, sizeof(*out));
	if (!out)
		return PyErr_NoMemory();
	if (kvbpy_enter(cl) < 0) {
		free(out);
		return NULL;
	}
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		pthread_mutex_lock(&cl->batch_lock);
		got = cl->nstash < (size_t)max ? cl->nstash : (size_t)max;
		if (got) { /* the caller's completions a batch reaped come first */
			memcpy(out, cl->stash, got * sizeof(*out));
			memmove(cl->stash, cl->stash + got, (cl->nstash - got) * sizeof(*out));
			cl->nstash -= got;
		}
		if (got < (size_t)max) {
			size_t want = got >= (size_t)min ? 0 : (size_t)min - got;

			err = kvb_reap(cl->c, out + got, (size_t)max - got, want,
				       got >= (size_t)min ? 0 : tmo);
			if (err >= 0) {
				got += (size_t)err;
				err = 0;
			} else if (err == -ETIMEDOUT) {
				err = 0; /* what has come is returned; the rest stays queued */
			}
		}
		pthread_mutex_unlock(&cl->batch_lock);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (err < 0 && !got) {
		free(out);
		return kvbpy_raise(err);
	}
	list = PyList_New((Py_ssize_t)got);
	for (size_t i = 0; list && i < got; i++) {
		PyObject *t = completion_tuple(cl, &out[i]);

		if (!t || PyList_SetItem(list, (Py_ssize_t)i, t) < 0)
			Py_CLEAR(list);
	}
	free(out);
	return list;
}

/* locate(obj) -> (buf_id, offset, nbytes) of memory inside a registered buffer, or None. */
static PyObject *client_locate(PyObject *self, PyObject *obj)
{
	kvbpy_client *cl = (kvbpy_client *)self;
	const struct kvbpy_reg *r;
	struct kvbpy_mem m;
	PyObject *res;

	if (kvbpy_mem_get(cl, obj, 0, &m) < 0)
		return NULL;
	r = kvbpy_reg_find(cl, (uintptr_t)m.ptr, m.len);
	if (r)
		res = Py_BuildValue("(IKn)", r->id,
				    (unsigned long long)((uintptr_t)m.ptr - r->addr),
				    (Py_ssize_t)m.len);
	else
		res = Py_NewRef(Py_None);
	kvbpy_mem_release(&m);
	return res;
}

static PyMethodDef client_methods[] = {
	{"close", client_close, METH_NOARGS,
	 "close() -> None\n--\n\nDetaches from the broker (idempotent). Waits for calls other "
	 "threads have in flight\n(a reap() without a timeout among them). Raises BufferError, "
	 "leaving the client open,\nwhile a lease's memory is still referenced."},
	{"__enter__", client_enter, METH_NOARGS, "Returns the client."},
	{"__exit__", client_exit, METH_VARARGS, "Closes the client."},
	{"nop", client_nop, METH_NOARGS,
	 "nop() -> None\n--\n\nA round trip through the rings (health check, latency)."},
	{"stats_json", client_stats_json, METH_NOARGS,
	 "stats_json() -> str\n--\n\nThe broker's statistics as a JSON document (stats() parses "
	 "it)."},
	{"ns_open", client_ns_open, METH_O,
	 "ns_open(layout) -> Namespace\n--\n\nOpens (creating on first use) the namespace of a "
	 "Layout. Every rank of an MLA model\ngets the same namespace; MHA ranks one each."},
	{"alloc_host", kvbpy_alloc_host, METH_O,
	 "alloc_host(nbytes) -> HostBuffer\n--\n\nnbytes (rounded up to whole pages) of shared "
	 "memory the broker copies to and from\ndirectly: puts from it and gets into it are "
	 "zero-copy. Writable buffer protocol."},
	{"register_host_fd", (PyCFunction)(void (*)(void))kvbpy_register_host_fd,
	 METH_VARARGS | METH_KEYWORDS,
	 "register_host_fd(fd, nbytes, offset=0, *, seal=False, mapped=None, fdcopy=False) -> "
	 "HostBuffer\n--\n\n"
	 "Registers [offset, offset + nbytes) of a tmpfs memfd this process owns (SGLang's shm\n"
	 "host pool). mapped: an object whose memory is those bytes mapped MAP_SHARED here (a\n"
	 "tensor or buffer over the engine's own mapping): put/get of memory inside it is then\n"
	 "zero-copy; None maps the range anew. seal=True adds F_SEAL_SHRINK when missing\n"
	 "(without it an unsealed fd is refused, EPERM). fdcopy=True accepts a file that cannot\n"
	 "be sealed (SGLang's memfd without MFD_ALLOW_SEALING, /dev/shm files): the broker then\n"
	 "copies with pread/pwrite on it (one kernel copy), never mapping it; seal=True as well\n"
	 "takes the mapped path whenever the file allows."},
	{"register_gpu", (PyCFunction)(void (*)(void))kvbpy_register_gpu,
	 METH_VARARGS | METH_KEYWORDS,
	 "register_gpu(memory, nbytes=None) -> GpuBuffer\n--\n\nRegisters GPU memory: a CUDA "
	 "tensor (data_ptr(), nbytes; kept alive by the buffer)\nor an int device pointer with "
	 "nbytes. The broker then copies pages straight between\nits pool and that memory "
	 "(views over it, put/get of CUDA tensors inside it)."},
	{"completion_fd", client_completion_fd, METH_NOARGS,
	 "completion_fd() -> int\n--\n\nA file descriptor that polls readable while completions "
	 "of submit()'s ops wait\n(level-triggered; never read or close it). On readable, call "
	 "reap(max, 0, 0)\nuntil it returns []."},
	{"submit", client_submit, METH_O,
	 "submit(ops) -> int\n--\n\nQueues Op tuples (low level; see Op) and rings the broker "
	 "once. Returns how many\nwere queued (fewer when the ring is full: reap and retry)."},
	{"reap", (PyCFunction)(void (*)(void))client_reap, METH_VARARGS | METH_KEYWORDS,
	 "reap(max=64, min=1, timeout_ms=-1) -> list\n--\n\nUp to max completions of submit()'s "
	 "ops, as (user_data, res, flags, lease)\ntuples, waiting (GIL released) until min "
	 "arrived or timeout_ms passed (then\nwhat has come, maybe []). res < 0 is a negative "
	 "errno. Reapers take turns: while\none waits, put_many()/get_many() of other threads on "
	 "this client wait too."},
	{"locate", client_locate, METH_O,
	 "locate(obj) -> tuple[int, int, int] | None\n--\n\n(buffer id, offset, nbytes) when "
	 "obj's memory lies inside a buffer registered on\nthis client, else None: what an Op "
	 "for it needs."},
	{NULL, NULL, 0, NULL},
};

static PyGetSetDef client_getset[] = {
	{"closed", client_closed, NULL, "True once close() ran (or connect never did).", NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot client_slots[] = {
	{Py_tp_doc, "Client(socket=None, *, name=None, gpu_busid=None, numa_node=None, "
		    "sq_entries=0, control=False)\n--\n\n"
		    "A connection to the node's kvbrokerd (kvb_connect). socket: the broker's "
		    "socket path\n(None: $KVB_SOCKET, then the default). A context manager; "
		    "close() is idempotent.\nSafe to share between threads; a child after fork() "
		    "must connect again."},
	{Py_tp_new, client_new},
	{Py_tp_init, client_init},
	{Py_tp_dealloc, client_dealloc},
	{Py_tp_methods, client_methods},
	{Py_tp_getset, client_getset},
	{0, NULL},
};

static PyType_Spec client_spec = {
	.name = "kvbroker._kvbroker.Client",
	.basicsize = sizeof(kvbpy_client),
	.flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
	.slots = client_slots,
};

int kvbpy_client_init_type(PyObject *m)
{
	kvbpy_ClientType = (PyTypeObject *)PyType_FromSpec(&client_spec);
	if (!kvbpy_ClientType)
		return -1;
	return PyModule_AddObjectRef(m, "Client", (PyObject *)kvbpy_ClientType);
}
