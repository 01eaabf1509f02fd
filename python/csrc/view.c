// SPDX-License-Identifier: MIT
/*
 * view.c - the View type: where an engine's KV cache lives, described once (kvb_view_create2),
 * so that page ops name a token slot and the broker gathers or scatters every (component,
 * layer) range of the page itself: one op per page whatever the engine's memory layout.
 *
 * A part is (buf, stride, base=0, page_stride=0): buf a HostBuffer or GpuBuffer (or a buffer
 * id), token slot s at buf + base + (s // tokens_per_page) * page_stride
 * + (s % tokens_per_page) * stride, page_stride 0 meaning tokens_per_page * stride. The View
 * holds its buffers, so they stay registered while it exists. GETs take a layer range (a
 * range object), so an engine can load layer groups in order.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvbpy.h"

PyTypeObject *kvbpy_ViewType;

typedef struct {
	PyObject ob_base;
	kvbpy_ns *ns;
	PyObject *bufs; /* tuple: the buffers of the parts */
	uint32_t id;
	int alive;
} view;

#define VIEW(o) ((view *)(o))

PyObject *kvbpy_view_new(kvbpy_ns *ns, PyObject *parts)
{
	kvbpy_client *cl = ns->cl;
	Py_ssize_t n = PySequence_Size(parts);
	struct kvb_view_part2 *pv = NULL;
	PyObject *bufs = NULL;
	uint32_t id = 0;
	view *v = NULL;
	int err;

	if (n < 0)
		return NULL;
	if ((size_t)n != ns->nparts) {
		PyErr_Format(PyExc_ValueError,
			     "a view of this namespace has %u parts (one per component layer), "
			     "not %zd",
			     ns->nparts, n);
		return NULL;
	}
	pv = calloc((size_t)n + 1, sizeof(*pv));
	bufs = PyTuple_New(n);
	if (!pv || !bufs) {
		PyErr_NoMemory();
		goto err;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *p = PySequence_GetItem(parts, i), *buf, *t = NULL, *idv;
		unsigned long long base = 0, pstride = 0;
		unsigned int stride;
		int ok;

		if (!p)
			goto err;
		t = PySequence_Tuple(p);
		Py_DECREF(p);
		if (!t)
			goto err;
		ok = PyArg_ParseTuple(t, "OI|KK:ViewPart", &buf, &stride, &base, &pstride);
		if (ok) {
			idv = PyLong_Check(buf) ? Py_NewRef(buf)
						: PyObject_GetAttrString(buf, "id");
			ok = idv != NULL;
			if (ok) {
				unsigned long x = PyLong_AsUnsignedLong(idv);

				Py_DECREF(idv);
				ok = !(x == (unsigned long)-1 && PyErr_Occurred()) &&
				     x <= UINT32_MAX;
				pv[i].buf = (uint32_t)x;
			}
			if (ok)
				PyTuple_SetItem(bufs, i, Py_NewRef(buf));
		}
		Py_DECREF(t);
		if (!ok) {
			if (!PyErr_Occurred())
				PyErr_SetString(PyExc_ValueError, "ViewPart: bad buffer id");
			goto err;
		}
		pv[i].stride = stride;
		pv[i].base = base;
		pv[i].page_stride = pstride;
	}
	if (kvbpy_enter(cl) < 0)
		goto err;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_view_create2(cl->c, ns->id, pv, (size_t)n, 0, &id);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (err < 0) {
		kvbpy_raise(err);
		goto err;
	}
	free(pv);
	v = PyObject_New(view, kvbpy_ViewType);
	if (!v) {
		Py_DECREF(bufs);
		if (cl->c)
			kvb_view_destroy(cl->c, id);
		return NULL;
	}
	v->ns = (kvbpy_ns *)Py_NewRef((PyObject *)ns);
	v->bufs = bufs;
	v->id = id;
	v->alive = 1;
	return (PyObject *)v;
err:
	free(pv);
	Py_XDECREF(bufs);
	return NULL;
}

static int view_enter(view *v)
{
	if (!v->alive) {
		kvbpy_raise_msg(kvbpy_Error, EBADF, "view is destroyed");
		return -1;
	}
	return kvbpy_enter(v->ns->cl);
}

static PyObject *view_destroy(PyObject *self, PyObject *unused)
{
	view *v = VIEW(self);
	kvbpy_client *cl = v->ns->cl;
	int err;

	(void)unused;
	if (!v->alive)
		return Py_NewRef(Py_None);
	if (!cl->c) { /* closed: the broker dropped it */
		v->alive = 0;
		return Py_NewRef(Py_None);
	}
	if (kvbpy_enter(cl) < 0)
		return NULL;
	v->alive = 0;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_view_destroy(cl->c, v->id);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (err < 0)
		return kvbpy_raise(err);
	return Py_NewRef(Py_None);
}

static void view_dealloc(PyObject *self)
{
	view *v = VIEW(self);
	kvbpy_client *cl = v->ns->cl;
	PyTypeObject *tp = Py_TYPE(self);

	if (v->alive && cl->c && !cl->closing && !kvbpy_forked(cl)) {
		cl->busy++;
		{
			PyThreadState *ts_ = PyEval_SaveThread();

			kvb_view_destroy(cl->c, v->id);
			PyEval_RestoreThread(ts_);
		}
		kvbpy_leave(cl);
	}
	Py_DECREF(v->bufs);
	Py_DECREF(v->ns);
	PyObject_Free(self);
	Py_DECREF(tp);
}

/* A layer range (range object, step 1) as (first, count); None: all. */
static int layers_arg(PyObject *o, uint32_t *first, uint32_t *count)
{
	uint32_t start, stop, step;

	*first = *count = 0;
	if (!o || o == Py_None)
		return 0;
	if (!PyObject_TypeCheck(o, &PyRange_Type)) {
		PyErr_SetString(PyExc_TypeError, "layers: a range (step 1) or None");
		return -1;
	}
	if (kvbpy_attr_u32(o, "start", &start) < 0 || kvbpy_attr_u32(o, "stop", &stop) < 0 ||
	    kvbpy_attr_u32(o, "step", &step) < 0)
		return -1;
	if (step != 1 || stop <= start || stop - start > UINT16_MAX || start > UINT16_MAX) {
		PyErr_SetString(PyExc_ValueError, "layers: a non-empty range with step 1");
		return -1;
	}
	*first = start;
	*count = stop - start;
	return 0;
}

static PyObject *view_put(PyObject *self, PyObject *args)
{
	view *v = VIEW(self);
	unsigned long long slot;
	PyObject *key, *parent = Py_None;
	kvb_key k, pk;
	int err;

	if (!PyArg_ParseTuple(args, "OK|O:put", &key, &slot, &parent) || kvbpy_key(key, &k) < 0 ||
	    (parent != Py_None && kvbpy_key(parent, &pk) < 0) || view_enter(v) < 0)
		return NULL;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_view_put_child(v->ns->cl->c, v->id, k, parent != Py_None ? &pk : NULL,
					 slot);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(v->ns->cl);
	if (err < 0)
		return kvbpy_raise(err);
	return PyBool_FromLong(err == 0);
}

static PyObject *view_get(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwl[] = {"key", "slot", "layers", NULL};
	view *v = VIEW(self);
	unsigned long long slot;
	PyObject *key, *layers = Py_None;
	uint32_t lf, lc;
	kvb_key k;
	int err;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OK|O:get", kwl, &key, &slot, &layers) ||
	    kvbpy_key(key, &k) < 0 || layers_arg(layers, &lf, &lc) < 0 || view_enter(v) < 0)
		return NULL;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvb_view_get(v->ns->cl->c, v->id, k, slot, lf, lc);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(v->ns->cl);
	if (err == -ENOENT)
		return Py_NewRef(Py_False);
	if (err < 0)
		return kvbpy_raise(err);
	return Py_NewRef(Py_True);
}

/* put_many(keys, slots) / get_many(keys, slots, layers=None): one submit/reap round. */
static PyObject *view_many(view *v, PyObject *keys, PyObject *slots, PyObject *layers,
			   PyObject *parents, int put)
{
	kvbpy_client *cl = v->ns->cl;
	kvb_key *kv = NULL, *owned = NULL, *par = NULL;
	uint8_t *has = NULL;
	struct kvb_op *ops = NULL;
	int32_t *res = NULL;
	uint32_t *flags = NULL, lf = 0, lc = 0;
	PyObject *list = NULL;
	Py_buffer kview;
	Py_ssize_t ns_;
	size_t n = 0;
	int hv = 0, err;

	if (layers_arg(layers, &lf, &lc) < 0 || kvbpy_keys(keys, &kv, &n, &owned, &kview, &hv) < 0)
		return NULL;
	ns_ = PySequence_Size(slots);
	if (ns_ < 0)
		goto out;
	if ((size_t)ns_ != n) {
		PyErr_Format(PyExc_ValueError, "%zu keys but %zd slots", n, ns_);
		goto out;
	}
	if (kvbpy_parents(parents, n, &par, &has) < 0) /* [chain] */
		goto out;
	ops = calloc(n + 1, sizeof(*ops));
	res = calloc(n + 1, sizeof(*res));
	flags = calloc(n + 1, sizeof(*flags));
	if (!ops || !res || !flags) {
		PyErr_NoMemory();
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		PyObject *s = PySequence_GetItem(slots, (Py_ssize_t)i);
		unsigned long long x;

		if (!s)
			goto out;
		x = PyLong_AsUnsignedLongLong(s);
		Py_DECREF(s);
		if (PyErr_Occurred())
			goto out;
		ops[i].opcode = put ? KVB_OP_PUT : KVB_OP_GET;
		ops[i].flags = KVB_OPF_VIEW | (has && has[i] ? KVB_OPF_PARENT : 0);
		ops[i].buf = v->id;
		ops[i].key = kv[i];
		ops[i].off = x;
		ops[i].layer_first = (uint16_t)lf;
		ops[i].layer_count = (uint16_t)lc;
	}
	if (view_enter(v) < 0)
		goto out;
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		err = kvbpy_batch_run(cl, ops, n, par, res, flags);
		PyEval_RestoreThread(ts_);
	}
	kvbpy_leave(cl);
	if (err < 0) {
		kvbpy_raise(err);
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		if (res[i] < 0 && (put || res[i] != -ENOENT)) {
			kvbpy_raise(res[i]);
			goto out;
		}
	list = PyList_New((Py_ssize_t)n);
	for (size_t i = 0; list && i < n; i++) {
		int b = put ? !(flags[i] & KVB_CQEF_EXISTED) : res[i] >= 0;

		if (PyList_SetItem(list, (Py_ssize_t)i, PyBool_FromLong(b)) < 0)
			Py_CLEAR(list);
	}
out:
	free(ops);
	free(res);
	free(flags);
	free(owned);
	free(par);
	free(has);
	if (hv)
		PyBuffer_Release(&kview);
	return list;
}

static PyObject *view_put_many(PyObject *self, PyObject *args)
{
	PyObject *keys, *slots, *parents = Py_None;

	if (!PyArg_ParseTuple(args, "OO|O:put_many", &keys, &slots, &parents))
		return NULL;
	return view_many(VIEW(self), keys, slots, NULL, parents, 1);
}

static PyObject *view_get_many(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwl[] = {"keys", "slots", "layers", NULL};
	PyObject *keys, *slots, *layers = Py_None;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O:get_many", kwl, &keys, &slots, &layers))
		return NULL;
	return view_many(VIEW(self), keys, slots, layers, Py_None, 0);
}

static PyObject *view_self(PyObject *self, PyObject *unused)
{
	(void)unused;
	return Py_NewRef(self);
}

static PyObject *view_exit(PyObject *self, PyObject *args)
{
	(void)args;
	return view_destroy(self, NULL);
}

static PyObject *view_get_id(PyObject *self, void *u)
{
	(void)u;
	return PyLong_FromUnsignedLong(VIEW(self)->id);
}

static PyObject *view_get_ns(PyObject *self, void *u)
{
	(void)u;
	return Py_NewRef((PyObject *)VIEW(self)->ns);
}

#define FC(f) (PyCFunction)(void (*)(void))(f)

static PyMethodDef view_methods[] = {
	{"put", view_put, METH_VARARGS,
	 "put(key, slot, parent=None) -> bool\n--\n\nStores the page whose tokens are slots "
	 "[slot, slot + tokens_per_page). True: stored;\nFalse: already stored. Every layer "
	 "(all or nothing). parent: as Namespace.put()."},
	{"get", FC(view_get), METH_VARARGS | METH_KEYWORDS,
	 "get(key, slot, layers=None) -> bool\n--\n\nLoads a page into slots [slot, slot + "
	 "tokens_per_page); layers: a range of layers\n(of every component), None all. False "
	 "when not stored."},
	{"put_many", view_put_many, METH_VARARGS,
	 "put_many(keys, slots, parents=None) -> list[bool]\n--\n\nput() of many pages in one "
	 "submit/reap round (GIL released); parents as Namespace.put_many()."},
	{"get_many", FC(view_get_many), METH_VARARGS | METH_KEYWORDS,
	 "get_many(keys, slots, layers=None) -> list[bool]\n--\n\nget() of many pages in one "
	 "submit/reap round (GIL released)."},
	{"destroy", view_destroy, METH_NOARGS,
	 "destroy() -> None\n--\n\nDrops the view "
	 "(idempotent)."},
	{"__enter__", view_self, METH_NOARGS, "Returns the view."},
	{"__exit__", view_exit, METH_VARARGS, "Destroys the view."},
	{NULL, NULL, 0, NULL},
};

static PyGetSetDef view_getset[] = {
	{"id", view_get_id, NULL, "The broker's view id (Op.buf with OPF_VIEW).", NULL},
	{"namespace", view_get_ns, NULL, "The Namespace it is a view of.", NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot view_slots[] = {
	{Py_tp_doc, "A view of the engine's KV memory (Namespace.view): page ops by token slot."},
	{Py_tp_dealloc, view_dealloc},
	{Py_tp_methods, view_methods},
	{Py_tp_getset, view_getset},
	{0, NULL},
};

static PyType_Spec view_spec = {
	.name = "kvbroker._kvbroker.View",
	.basicsize = sizeof(view),
	.flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
	.slots = view_slots,
};

int kvbpy_view_init_type(PyObject *m)
{
	kvbpy_ViewType = (PyTypeObject *)PyType_FromSpec(&view_spec);
	if (!kvbpy_ViewType)
		return -1;
	return PyModule_AddObjectRef(m, "View", (PyObject *)kvbpy_ViewType);
}
