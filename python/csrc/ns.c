// SPDX-License-Identifier: MIT
/*
 * ns.c - the Namespace type: page ops of one namespace (put, get, lookup, delete, prefetch,
 * acquire), their batches, and views.
 *
 * A miss is an answer, not an error: get() returns None, get_into()/get_many() False,
 * delete() False, acquire() None. Every other negative errno raises kvb.Error (a subclass).
 *
 * Copies: a source or destination inside a registered buffer (HostBuffer, GpuBuffer) is
 * copied by the broker, straight between its pool and that memory; anything else goes the C
 * API's way (PUT through the library's staging buffer, GET as ACQUIRE + one memcpy from the
 * read-only pool mapping + RELEASE). The module adds no copy of its own on any path.
 *
 * Batches: members in registered memory become one submit/reap round (batch.c); members in
 * other memory run as the synchronous calls, in the same GIL-free stretch.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvbpy.h"

PyTypeObject *kvbpy_NamespaceType;

#define NS(o) ((kvbpy_ns *)(o))

static PyObject *size_error(const char *what, size_t got, size_t pb)
{
	PyErr_Format(PyExc_ValueError, "%s is %zu bytes; a page of this namespace is %zu", what,
		     got, pb);
	return NULL;
}

static int nargs_check(const char *name, Py_ssize_t nargs, Py_ssize_t lo, Py_ssize_t hi)
{
	if (nargs >= lo && nargs <= hi)
		return 0;
	PyErr_Format(PyExc_TypeError, "%s() takes %zd to %zd arguments (%zd given)", name, lo, hi,
		     nargs);
	return -1;
}

static PyObject *ns_put(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	kvbpy_ns *ns = NS(self);
	kvbpy_client *cl = ns->cl;
	struct kvbpy_mem m;
	kvb_key k, pk;
	int err, has_parent = nargs == 3 && args[2] != Py_None;

	if (nargs_check("put", nargs, 2, 3) < 0 || kvbpy_key(args[0], &k) < 0 ||
	    (has_parent && kvbpy_key(args[2], &pk) < 0) || kvbpy_mem_get(cl, args[1], 0, &m) < 0)
		return NULL;
	if (m.len != ns->page_bytes) {
		kvbpy_mem_release(&m);
		return size_error("src", m.len, ns->page_bytes);
	}
	if (kvbpy_enter(cl) < 0) {
		kvbpy_mem_release(&m);
		return NULL;
	}
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_put_child(cl->c, ns->id, k, has_parent ? &pk : NULL, m.ptr, m.len);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	kvbpy_mem_release(&m);
	if (err < 0)
		return kvbpy_raise(err);
	return PyBool_FromLong(err == 0);
}

/* GET into obj; 1 hit, 0 miss, -1 error. */
static int get_into(kvbpy_ns *ns, const kvb_key *k, PyObject *obj)
{
	kvbpy_client *cl = ns->cl;
	struct kvbpy_mem m;
	int err;

	if (kvbpy_mem_get(cl, obj, 1, &m) < 0)
		return -1;
	if (m.len < ns->page_bytes) {
		kvbpy_mem_release(&m);
		size_error("out", m.len, ns->page_bytes);
		return -1;
	}
	if (kvbpy_enter(cl) < 0) {
		kvbpy_mem_release(&m);
		return -1;
	}
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_get(cl->c, ns->id, *k, m.ptr, ns->page_bytes);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	kvbpy_mem_release(&m);
	if (err == -ENOENT)
		return 0;
	if (err < 0) {
		kvbpy_raise(err);
		return -1;
	}
	return 1;
}

static PyObject *ns_get_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	kvb_key k;
	int r;

	if (nargs_check("get_into", nargs, 2, 2) < 0 || kvbpy_key(args[0], &k) < 0)
		return NULL;
	r = get_into(NS(self), &k, args[1]);
	return r < 0 ? NULL : PyBool_FromLong(r);
}

static PyObject *ns_get(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	kvbpy_ns *ns = NS(self);
	kvbpy_client *cl = ns->cl;
	PyObject *b;
	kvb_key k;
	char *p;
	int err;

	if (nargs_check("get", nargs, 1, 2) < 0 || kvbpy_key(args[0], &k) < 0)
		return NULL;
	if (nargs == 2 && args[1] != Py_None) {
		int r = get_into(ns, &k, args[1]);

		if (r < 0)
			return NULL;
		return Py_NewRef(r ? args[1] : Py_None);
	}
	/* A fresh bytes object is ours until returned: filling it in place is safe. */
	b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)ns->page_bytes);
	if (!b)
		return NULL;
	p = PyBytes_AsString(b);
	if (kvbpy_enter(cl) < 0) {
		Py_DECREF(b);
		return NULL;
	}
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_get(cl->c, ns->id, k, p, ns->page_bytes);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (err < 0) {
		Py_DECREF(b);
		if (err == -ENOENT)
			return Py_NewRef(Py_None);
		return kvbpy_raise(err);
	}
	return b;
}

static PyObject *lookup_common(kvbpy_ns *ns, PyObject *keys, int tiers)
{
	kvbpy_client *cl = ns->cl;
	kvb_key *kv, *owned;
	uint8_t *t = NULL;
	Py_buffer view;
	size_t n, hits = 0;
	PyObject *res = NULL;
	int hv, err;

	if (kvbpy_keys(keys, &kv, &n, &owned, &view, &hv) < 0)
		return NULL;
	if (tiers && !(t = malloc(n + 1))) {
		PyErr_NoMemory();
		goto out;
	}
	if (kvbpy_enter(cl) < 0)
		goto out;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_lookup_tiers(cl->c, ns->id, kv, n, &hits, t);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (err < 0) {
		kvbpy_raise(err);
		goto out;
	}
	if (!tiers) {
		res = PyLong_FromSize_t(hits);
		goto out;
	}
	{
		PyObject *list = PyList_New((Py_ssize_t)n);

		for (size_t i = 0; list && i < n; i++) {
			PyObject *v = PyLong_FromLong(t[i]);

			if (!v || PyList_SetItem(list, (Py_ssize_t)i, v) < 0)
				Py_CLEAR(list);
		}
		if (list)
			res = Py_BuildValue("(nN)", (Py_ssize_t)hits, list);
	}
out:
	free(t);
	free(owned);
	if (hv)
		PyBuffer_Release(&view);
	return res;
}

static PyObject *ns_lookup(PyObject *self, PyObject *keys)
{
	return lookup_common(NS(self), keys, 0);
}

static PyObject *ns_lookup_tiers(PyObject *self, PyObject *keys)
{
	return lookup_common(NS(self), keys, 1);
}

static PyObject *ns_delete(PyObject *self, PyObject *key)
{
	kvbpy_ns *ns = NS(self);
	kvbpy_client *cl = ns->cl;
	kvb_key k;
	int err;

	if (kvbpy_key(key, &k) < 0 || kvbpy_enter(cl) < 0)
		return NULL;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_delete(cl->c, ns->id, k);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (err == -ENOENT)
		return Py_NewRef(Py_False);
	if (err < 0)
		return kvbpy_raise(err);
	return Py_NewRef(Py_True);
}

static PyObject *ns_acquire(PyObject *self, PyObject *key)
{
	kvbpy_ns *ns = NS(self);
	kvbpy_client *cl = ns->cl;
	struct kvb_lease l;
	kvb_key k;
	int err;

	if (kvbpy_key(key, &k) < 0 || kvbpy_enter(cl) < 0)
		return NULL;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_acquire(cl->c, ns->id, k, &l);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (err == -ENOENT)
		return Py_NewRef(Py_None);
	if (err < 0)
		return kvbpy_raise(err);
	return kvbpy_lease_new(cl, &l);
}

/* ---- batches ---- */

struct many {
	size_t n;
	kvb_key *keys, *owned;
	Py_buffer kview;
	int khv;
	struct kvbpy_mem *mem;
	struct kvb_op *ops;
	size_t *idx; /* ops[j] is member idx[j] */
	size_t nops;
	int32_t *res;
	uint32_t *flags;
};

static void many_free(struct many *b)
{
	for (size_t i = 0; b->mem && i < b->n; i++)
		kvbpy_mem_release(&b->mem[i]);
	free(b->mem);
	free(b->ops);
	free(b->idx);
	free(b->res);
	free(b->flags);
	free(b->owned);
	if (b->khv)
		PyBuffer_Release(&b->kview);
}

/* The batch's error, else its first member's other than a miss, raised: -1; 0 when none. */
static int many_raise(int err, const struct many *b)
{
	for (size_t i = 0; err >= 0 && i < b->n; i++)
		if (b->res[i] < 0 && b->res[i] != -ENOENT)
			err = b->res[i];
	if (err >= 0)
		return 0;
	kvbpy_raise(err);
	return -1;
}

static int many_alloc(struct many *b, PyObject *keys, PyObject *bufs, const char *what)
{
	Py_ssize_t nb = bufs ? PySequence_Size(bufs) : -2;

	memset(b, 0, sizeof(*b));
	if (kvbpy_keys(keys, &b->keys, &b->n, &b->owned, &b->kview, &b->khv) < 0)
		return -1;
	if (nb == -1)
		return -1;
	if (bufs && (size_t)nb != b->n) {
		PyErr_Format(PyExc_ValueError, "%zu keys but %zd %s", b->n, nb, what);
		return -1;
	}
	b->mem = calloc(b->n + 1, sizeof(*b->mem));
	b->ops = calloc(b->n + 1, sizeof(*b->ops));
	b->idx = calloc(b->n + 1, sizeof(*b->idx));
	b->res = calloc(b->n + 1, sizeof(*b->res));
	b->flags = calloc(b->n + 1, sizeof(*b->flags));
	if (!b->mem || !b->ops || !b->idx || !b->res || !b->flags) {
		PyErr_NoMemory();
		return -1;
	}
	return 0;
}

/* put_many / get_many: put 1 for PUT, 0 for GET. */
static PyObject *ns_many(kvbpy_ns *ns, PyObject *keys, PyObject *bufs, PyObject *parents, int put)
{
	kvbpy_client *cl = ns->cl;
	PyObject *list = NULL;
	kvb_key *par = NULL, *opar = NULL;
	uint8_t *has = NULL;
	struct many b;
	int err = 0;

	if (many_alloc(&b, keys, bufs, put ? "sources" : "destinations") < 0)
		goto out;
	/* [chain] PUTs naming their parents (put_many(keys, srcs, parents)). */
	if (kvbpy_parents(parents, b.n, &par, &has) < 0)
		goto out;
	if (par && !(opar = calloc(b.n + 1, sizeof(*opar)))) {
		PyErr_NoMemory();
		goto out;
	}
	for (size_t i = 0; i < b.n; i++) {
		PyObject *o = PySequence_GetItem(bufs, (Py_ssize_t)i);
		const struct kvbpy_reg *r;
		int rc;

		if (!o)
			goto out;
		rc = kvbpy_mem_get(cl, o, !put, &b.mem[i]);
		Py_DECREF(o);
		if (rc < 0)
			goto out;
		if (put ? b.mem[i].len != ns->page_bytes : b.mem[i].len < ns->page_bytes) {
			size_error(put ? "a source" : "a destination", b.mem[i].len,
				   ns->page_bytes);
			goto out;
		}
		b.res[i] = 1; /* not run yet */
		r = kvbpy_reg_find(cl, (uintptr_t)b.mem[i].ptr, ns->page_bytes);
		if (r) {
			struct kvb_op *op = &b.ops[b.nops];

			op->opcode = put ? KVB_OP_PUT : KVB_OP_GET;
			op->ns = ns->id;
			op->buf = r->id;
			op->key = b.keys[i];
			op->off = (uint64_t)((uintptr_t)b.mem[i].ptr - r->addr);
			if (has && has[i]) {
				op->flags = KVB_OPF_PARENT;
				opar[b.nops] = par[i];
			}
			b.idx[b.nops++] = i;
		}
	}
	if (kvbpy_enter(cl) < 0)
		goto out;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		{
			int32_t *rr = calloc(b.nops + 1, sizeof(*rr));
			uint32_t *ff = calloc(b.nops + 1, sizeof(*ff));

			if (!rr || !ff) {
				err = -ENOMEM;
			} else {
				err = kvbpy_batch_run(cl, b.ops, b.nops, opar, rr, ff);
				for (size_t j = 0; !err && j < b.nops; j++) {
					b.res[b.idx[j]] = rr[j];
					b.flags[b.idx[j]] = ff[j];
				}
			}
			free(rr);
			free(ff);
			/* Members outside registered memory: the synchronous calls. */
			for (size_t i = 0, j = 0; !err && i < b.n; i++) {
				if (j < b.nops && b.idx[j] == i) {
					j++;
					continue;
				}
				if (put) {
					int r = kvb_put_child(cl->c, ns->id, b.keys[i],
							      has && has[i] ? &par[i] : NULL,
							      b.mem[i].ptr, b.mem[i].len);

					b.res[i] = r < 0 ? r : 0;
					b.flags[i] = r == 1 ? KVB_CQEF_EXISTED : 0;
				} else {
					b.res[i] = kvb_get(cl->c, ns->id, b.keys[i], b.mem[i].ptr,
							   ns->page_bytes);
				}
			}
		}
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (many_raise(err, &b) < 0)
		goto out;
	list = PyList_New((Py_ssize_t)b.n);
	for (size_t i = 0; list && i < b.n; i++) {
		int v = put ? !(b.flags[i] & KVB_CQEF_EXISTED) : b.res[i] >= 0;

		if (PyList_SetItem(list, (Py_ssize_t)i, PyBool_FromLong(v)) < 0)
			Py_CLEAR(list);
	}
out:
	free(par);
	free(opar);
	free(has);
	many_free(&b);
	return list;
}

static PyObject *ns_put_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	if (nargs_check("put_many", nargs, 2, 3) < 0)
		return NULL;
	return ns_many(NS(self), args[0], args[1], nargs == 3 ? args[2] : Py_None, 1);
}

static PyObject *ns_get_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
	if (nargs_check("get_many", nargs, 2, 2) < 0)
		return NULL;
	return ns_many(NS(self), args[0], args[1], Py_None, 0);
}

static PyObject *ns_prefetch(PyObject *self, PyObject *keys)
{
	kvbpy_ns *ns = NS(self);
	kvbpy_client *cl = ns->cl;
	struct many b;
	PyObject *r = NULL;
	int err;

	if (many_alloc(&b, keys, NULL, NULL) < 0)
		goto out;
	for (size_t i = 0; i < b.n; i++) {
		b.ops[i].opcode = KVB_OP_PREFETCH;
		b.ops[i].ns = ns->id;
		b.ops[i].key = b.keys[i];
	}
	if (kvbpy_enter(cl) < 0)
		goto out;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvbpy_batch_run(cl, b.ops, b.n, NULL, b.res, b.flags);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (many_raise(err, &b) < 0)
		goto out;
	r = Py_NewRef(Py_None);
out:
	many_free(&b);
	return r;
}

static PyObject *ns_view(PyObject *self, PyObject *parts)
{
	return kvbpy_view_new(NS(self), parts);
}

static void ns_dealloc(PyObject *self)
{
	PyTypeObject *tp = Py_TYPE(self);

	Py_DECREF(NS(self)->cl);
	Py_DECREF(NS(self)->layout);
	PyObject_Free(self);
	Py_DECREF(tp);
}

static PyObject *ns_repr(PyObject *self)
{
	return PyUnicode_FromFormat("<kvbroker.Namespace id=%u page_bytes=%zu>", NS(self)->id,
				    NS(self)->page_bytes);
}

static PyObject *ns_get_id(PyObject *self, void *u)
{
	(void)u;
	return PyLong_FromUnsignedLong(NS(self)->id);
}

static PyObject *ns_get_page_bytes(PyObject *self, void *u)
{
	(void)u;
	return PyLong_FromSize_t(NS(self)->page_bytes);
}

static PyObject *ns_get_layout(PyObject *self, void *u)
{
	(void)u;
	return Py_NewRef(NS(self)->layout);
}

static PyObject *ns_get_client(PyObject *self, void *u)
{
	(void)u;
	return Py_NewRef((PyObject *)NS(self)->cl);
}

static PyObject *ns_get_nparts(PyObject *self, void *u)
{
	(void)u;
	return PyLong_FromUnsignedLong(NS(self)->nparts);
}

#define FC(f) (PyCFunction)(void (*)(void))(f)

static PyMethodDef ns_methods[] = {
	{"put", FC(ns_put), METH_FASTCALL,
	 "put(key, src, parent=None) -> bool\n--\n\nStores a page of exactly page_bytes from "
	 "src (any buffer, or a tensor). True: stored;\nFalse: the key was already stored "
	 "(nothing copied). parent: the key of the page before it\nin its chain: the broker "
	 "then evicts the chain tail first (ABI 1.4; ignored by older\nbrokers)."},
	{"get", FC(ns_get), METH_FASTCALL,
	 "get(key, out=None) -> bytes | out | None\n--\n\nFetches a page: into a new bytes "
	 "object, or into out (>= page_bytes, writable),\nwhich is then returned. None when the "
	 "page is not stored."},
	{"get_into", FC(ns_get_into), METH_FASTCALL,
	 "get_into(key, out) -> bool\n--\n\nFetches a page into out (>= page_bytes). False when "
	 "not stored."},
	{"lookup", ns_lookup, METH_O,
	 "lookup(keys) -> int\n--\n\nHow many leading keys are stored (any tier), in one round "
	 "trip. keys: a sequence of\n32-byte keys, or one bytes-like object of n * 32 bytes."},
	{"lookup_tiers", ns_lookup_tiers, METH_O,
	 "lookup_tiers(keys) -> tuple[int, list[int]]\n--\n\n(leading hits, each key's tier: "
	 "TIER_RAM, TIER_DISK, TIER_REMOTE or TIER_NONE;\nany other value a newer broker reports "
	 "means stored somewhere)."},
	{"delete", ns_delete, METH_O,
	 "delete(key) -> bool\n--\n\nDrops a page (freed once no lease holds it). False when not "
	 "stored."},
	{"prefetch", ns_prefetch, METH_O,
	 "prefetch(keys) -> None\n--\n\nPromotes disk-resident pages to RAM ahead of GETs; keys "
	 "not stored are skipped."},
	{"acquire", ns_acquire, METH_O,
	 "acquire(key) -> Lease | None\n--\n\nPins a RAM-resident page for zero-copy reads: "
	 "`with ns.acquire(k) as mv:` gives a\nread-only memoryview. None when not stored."},
	{"put_many", FC(ns_put_many), METH_FASTCALL,
	 "put_many(keys, srcs, parents=None) -> list[bool]\n--\n\nput() of many pages: one "
	 "submit/reap round for sources in registered memory,\nGIL released throughout. Raises "
	 "on the first error other than a miss. parents: None,\nor one parent key (or None) per "
	 "key."},
	{"get_many", FC(ns_get_many), METH_FASTCALL,
	 "get_many(keys, outs) -> list[bool]\n--\n\nget_into() of many pages, batched as "
	 "put_many(). False: not stored."},
	{"view", ns_view, METH_O,
	 "view(parts) -> View\n--\n\nA view of the engine's KV memory: one ViewPart(buf, stride, "
	 "base=0, page_stride=0)\nper (component, layer), component-major. See View."},
	{NULL, NULL, 0, NULL},
};

static PyGetSetDef ns_getset[] = {
	{"id", ns_get_id, NULL, "The broker's namespace id.", NULL},
	{"page_bytes", ns_get_page_bytes, NULL, "Bytes of one page.", NULL},
	{"layout", ns_get_layout, NULL, "The Layout it was opened with.", NULL},
	{"client", ns_get_client, NULL, "The Client it belongs to.", NULL},
	{"nparts", ns_get_nparts, NULL, "(component, layer) pairs: the parts of a view.", NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot ns_slots[] = {
	{Py_tp_doc, "A namespace (Client.ns_open): the pages of one KV layout and identity."},
	{Py_tp_dealloc, ns_dealloc},
	{Py_tp_repr, ns_repr},
	{Py_tp_methods, ns_methods},
	{Py_tp_getset, ns_getset},
	{0, NULL},
};

static PyType_Spec ns_spec = {
	.name = "kvbroker._kvbroker.Namespace",
	.basicsize = sizeof(kvbpy_ns),
	.flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
	.slots = ns_slots,
};

int kvbpy_ns_init_type(PyObject *m)
{
	kvbpy_NamespaceType = (PyTypeObject *)PyType_FromSpec(&ns_spec);
	if (!kvbpy_NamespaceType)
		return -1;
	return PyModule_AddObjectRef(m, "Namespace", (PyObject *)kvbpy_NamespaceType);
}
