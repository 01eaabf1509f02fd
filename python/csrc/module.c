// SPDX-License-Identifier: MIT
/*
 * module.c - kvbroker._kvbroker: module init, the exception hierarchy, errno mapping, the fork
 * generation, and the small helpers every type uses (enter, keys, integer attributes).
 *
 * Exceptions: kvb.Error subclasses OSError, so errno and strerror are the usual attributes
 * (strerror is kvb_strerror()'s text, which says what the code means to kvbroker; for a failed
 * connect, kvb_connect_error()'s, which names the socket, the cause and the fix). Some errnos
 * get a subclass that also derives from the matching builtin, so both `except kvb.BrokerGone`
 * and `except ConnectionResetError` work. A miss (-ENOENT from a page op) is never raised: the
 * calls return None/False for it.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kvbpy.h"

PyObject *kvbpy_Error, *kvbpy_BrokerGone, *kvbpy_NoBroker, *kvbpy_PoolFull;
PyObject *kvbpy_ClientClosed, *kvbpy_ForkedClient, *kvbpy_Timeout;
volatile unsigned kvbpy_fork_gen;

static void atfork_child(void)
{
	kvbpy_fork_gen++;
}

static PyObject *err_type(int err)
{
	switch (err) {
	case ECONNRESET:
		return kvbpy_BrokerGone;
	case ECONNREFUSED:
	case ENOENT:
		return kvbpy_NoBroker; /* only connect() raises these: page ops report misses */
	case ENOSPC:
		return kvbpy_PoolFull;
	case ETIMEDOUT:
		return kvbpy_Timeout;
	default:
		return kvbpy_Error;
	}
}

PyObject *kvbpy_raise_msg(PyObject *type, int err, const char *msg)
{
	PyObject *e = PyObject_CallFunction(type, "is", err < 0 ? -err : err, msg);

	if (e) {
		PyErr_SetObject(type, e);
		Py_DECREF(e);
	}
	return NULL;
}

PyObject *kvbpy_raise(int err)
{
	if (err < 0)
		err = -err;
	return kvbpy_raise_msg(err_type(err), err, kvb_strerror(-err));
}

PyObject *kvbpy_raise_connect(int err, const char *socket_path)
{
	char msg[1024];

	if (err < 0)
		err = -err;
	return kvbpy_raise_msg(err_type(err), err,
			       kvb_connect_error(-err, socket_path, msg, sizeof(msg)));
}

int kvbpy_enter(kvbpy_client *cl)
{
	if (kvbpy_forked(cl) && cl->c) {
		kvbpy_raise_msg(kvbpy_ForkedClient, ECHILD,
				"client used in a child after fork(): connect again in the child");
		return -1;
	}
	if (!cl->c || cl->closing) {
		kvbpy_raise_msg(kvbpy_ClientClosed, EBADF, "client is closed");
		return -1;
	}
	cl->busy++;
	return 0;
}

int kvbpy_attr_u32(PyObject *obj, const char *name, uint32_t *out)
{
	PyObject *v = PyObject_GetAttrString(obj, name);
	unsigned long x;

	if (!v)
		return -1;
	x = PyLong_AsUnsignedLong(v);
	Py_DECREF(v);
	if (x == (unsigned long)-1 && PyErr_Occurred())
		return -1;
	if (x > UINT32_MAX) {
		PyErr_Format(PyExc_OverflowError, "%s does not fit in 32 bits", name);
		return -1;
	}
	*out = (uint32_t)x;
	return 0;
}

static PyObject *mod_version(PyObject *self, PyObject *unused)
{
	unsigned v = kvb_version();

	(void)self;
	(void)unused;
	return PyUnicode_FromFormat("%u.%u.%u", v >> 16, (v >> 8) & 0xff, v & 0xff);
}

static PyObject *mod_strerror(PyObject *self, PyObject *arg)
{
	long err = PyLong_AsLong(arg);

	(void)self;
	if (err == -1 && PyErr_Occurred())
		return NULL;
	if (err < -4095 || err > 4095) {
		PyErr_SetString(PyExc_ValueError, "not an errno");
		return NULL;
	}
	return PyUnicode_FromString(kvb_strerror((int)err));
}

static PyObject *mod_socket_path(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwl[] = {"socket", NULL};
	char path[512];
	PyObject *sock = Py_None, *keep = NULL;
	const char *p = NULL;
	int err;

	(void)self;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:socket_path", kwl, &sock))
		return NULL;
	if (sock != Py_None) {
		if (!PyUnicode_FSConverter(sock, &keep))
			return NULL;
		p = PyBytes_AsString(keep);
		if (!p) {
			Py_DECREF(keep);
			return NULL;
		}
	}
	err = kvb_socket_path(p, path, sizeof(path));
	if (err < 0) {
		kvbpy_raise_connect(err, p);
		Py_XDECREF(keep);
		return NULL;
	}
	Py_XDECREF(keep);
	return PyUnicode_DecodeFSDefault(path);
}

static PyMethodDef mod_methods[] = {
	{"version", mod_version, METH_NOARGS,
	 "version() -> str\n--\n\nThe version of the linked libkvbroker, \"major.minor.patch\"."},
	{"strerror", mod_strerror, METH_O,
	 "strerror(err) -> str\n--\n\nkvb_strerror(): what errno err means to kvbroker."},
	{"socket_path", (PyCFunction)(void (*)(void))mod_socket_path, METH_VARARGS | METH_KEYWORDS,
	 "socket_path(socket=None) -> str\n--\n\nkvb_socket_path(): the socket connect(socket) "
	 "tries: socket, else $KVB_SOCKET, else /run/kvbroker/kvbroker.sock."},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef mod_def = {
	PyModuleDef_HEAD_INIT,
	.m_name = "kvbroker._kvbroker",
	.m_doc = "The C extension behind the kvbroker package (libkvbroker, statically linked).",
	.m_size = -1,
	.m_methods = mod_methods,
};

static PyObject *new_exc(PyObject *m, const char *name, PyObject *bases, const char *doc)
{
	char full[96];
	PyObject *e;

	snprintf(full, sizeof(full), "kvbroker.%s", name);
	e = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
	Py_DECREF(bases);
	if (!e)
		return NULL;
	if (PyModule_AddObjectRef(m, name, e) < 0) {
		Py_DECREF(e);
		return NULL;
	}
	return e;
}

static int init_errors(PyObject *m)
{
	kvbpy_Error = new_exc(m, "Error", Py_BuildValue("(O)", PyExc_OSError),
			      "Every failure of a kvbroker call: an OSError whose errno is the C "
			      "API's and whose strerror is kvb_strerror()'s text.");
	if (!kvbpy_Error)
		return -1;
	kvbpy_BrokerGone = new_exc(
		m, "BrokerGone", Py_BuildValue("(OO)", kvbpy_Error, PyExc_ConnectionResetError),
		"The broker went away (ECONNRESET). The call failed (a page op "
		"may or may not have run: they are idempotent, repeat it). Unless "
		"the client was made with reconnect=False, a later call "
		"reconnects by itself once a broker is back on the socket "
		"(namespaces, buffers and views re-made, same ids); until then "
		"calls fail fast with this, or wait up to reconnect_ms.");
	kvbpy_NoBroker = new_exc(
		m, "NoBroker", Py_BuildValue("(OO)", kvbpy_Error, PyExc_ConnectionRefusedError),
		"connect() found no broker at the socket path (ENOENT or "
		"ECONNREFUSED); its strerror names the path and how to start one.");
	kvbpy_PoolFull = new_exc(m, "PoolFull", Py_BuildValue("(O)", kvbpy_Error),
				 "The pool is full of leased pages (ENOSPC): nothing can be "
				 "evicted to make room.");
	kvbpy_ClientClosed = new_exc(m, "ClientClosed", Py_BuildValue("(O)", kvbpy_Error),
				     "A call on a client that is closed (errno EBADF).");
	kvbpy_ForkedClient = new_exc(m, "ForkedClient", Py_BuildValue("(O)", kvbpy_Error),
				     "A client used in a child after fork() (errno ECHILD): its "
				     "rings are the parent's; connect again in the child.");
	kvbpy_Timeout = new_exc(m, "Timeout",
				Py_BuildValue("(OO)", kvbpy_Error, PyExc_TimeoutError),
				"A wait ran out of time (ETIMEDOUT).");
	if (!kvbpy_BrokerGone || !kvbpy_NoBroker || !kvbpy_PoolFull || !kvbpy_ClientClosed ||
	    !kvbpy_ForkedClient || !kvbpy_Timeout)
		return -1;
	return 0;
}

static int add_ints(PyObject *m)
{
	static const struct {
		const char *name;
		long v;
	} k[] = {
		{"TIER_RAM", KVB_TIER_RAM},
		{"TIER_DISK", KVB_TIER_DISK},
		{"TIER_REMOTE", KVB_TIER_REMOTE},
		{"TIER_NONE", KVB_TIER_NONE},
		{"OP_NOP", KVB_OP_NOP},
		{"OP_PUT", KVB_OP_PUT},
		{"OP_GET", KVB_OP_GET},
		{"OP_ACQUIRE", KVB_OP_ACQUIRE},
		{"OP_RELEASE", KVB_OP_RELEASE},
		{"OP_DELETE", KVB_OP_DELETE},
		{"OP_PREFETCH", KVB_OP_PREFETCH},
		{"OPF_VIEW", KVB_OPF_VIEW},
		{"OPF_PARENT", KVB_OPF_PARENT},
		{"OPF_ASYNC", KVB_OPF_ASYNC},
		{"CQEF_EXISTED", KVB_CQEF_EXISTED},
		{"MAX_COMPONENTS", KVB_MAX_COMPONENTS},
		{"MODEL_MAX", KVB_MODEL_MAX},
		{"COMP_NAME_MAX", KVB_COMP_NAME_MAX},
		{"VERSION_MAJOR", KVB_VERSION_MAJOR},
		{"VERSION_MINOR", KVB_VERSION_MINOR},
		{"VERSION_PATCH", KVB_VERSION_PATCH},
	};

	for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++)
		if (PyModule_AddIntConstant(m, k[i].name, k[i].v) < 0)
			return -1;
	return 0;
}

PyMODINIT_FUNC PyInit__kvbroker(void)
{
	static int atfork_done;
	PyObject *m = PyModule_Create(&mod_def);

	if (!m)
		return NULL;
	if (!atfork_done) {
		if (pthread_atfork(NULL, NULL, atfork_child)) {
			PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
			goto err;
		}
		atfork_done = 1;
	}
	if (init_errors(m) < 0 || add_ints(m) < 0 || kvbpy_keys_init(m) < 0 ||
	    kvbpy_client_init_type(m) < 0 || kvbpy_ns_init_type(m) < 0 ||
	    kvbpy_buffers_init_type(m) < 0 || kvbpy_view_init_type(m) < 0 ||
	    kvbpy_hostmap_init(m) < 0)
		goto err;
	return m;
err:
	Py_DECREF(m);
	return NULL;
}
