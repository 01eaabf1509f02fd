// SPDX-License-Identifier: MIT
/*
 * keys.c - page keys: key_chain(), page_keys() and their EAGLE (bigram) variants over
 * kvb_key_chain() / kvb_key_chain_eagle(), and the parsing of keys given to page ops.
 *
 * Token ids come as a buffer of 4- or 8-byte integers (array('I'), numpy int32/uint32/int64:
 * a 4-byte unsigned buffer is hashed in place) or as any sequence of ints (lists, as SGLang
 * keeps them). Every id must fit in 32 bits: SGLang hashes larger ids with another encoding,
 * which kvbroker does not reproduce, so they raise OverflowError rather than hash differently.
 * Hashing runs without the GIL once the ids are in a C array (a page list of a long prompt is
 * many SHA-256 blocks).
 */
#include <stdlib.h>
#include <string.h>

#include "kvbpy.h"

int kvbpy_key(PyObject *obj, kvb_key *key)
{
	Py_buffer v;

	if (PyBytes_Check(obj)) {
		char *p;
		Py_ssize_t n;

		if (PyBytes_AsStringAndSize(obj, &p, &n) < 0)
			return -1;
		if (n != (Py_ssize_t)sizeof(*key))
			goto bad;
		memcpy(key->b, p, sizeof(key->b));
		return 0;
	}
	if (PyObject_GetBuffer(obj, &v, PyBUF_SIMPLE) < 0) {
		PyErr_Format(PyExc_TypeError, "a key is 32 bytes (bytes-like), not %R",
			     (PyObject *)Py_TYPE(obj));
		return -1;
	}
	if (v.len != (Py_ssize_t)sizeof(*key)) {
		PyBuffer_Release(&v);
		goto bad;
	}
	memcpy(key->b, v.buf, sizeof(key->b));
	PyBuffer_Release(&v);
	return 0;
bad:
	PyErr_SetString(PyExc_ValueError, "a key is exactly 32 bytes");
	return -1;
}

int kvbpy_keys(PyObject *obj, kvb_key **keys, size_t *n, kvb_key **owned, Py_buffer *view,
	       int *has_view)
{
	Py_ssize_t len;

	*owned = NULL;
	*has_view = 0;
	if (!PyList_Check(obj) && !PyTuple_Check(obj) &&
	    PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) == 0) {
		if (view->len % (Py_ssize_t)sizeof(kvb_key)) {
			PyBuffer_Release(view);
			PyErr_SetString(PyExc_ValueError,
					"a bytes-like key array is a multiple of 32 bytes");
			return -1;
		}
		*has_view = 1;
		*keys = view->buf;
		*n = (size_t)view->len / sizeof(kvb_key);
		return 0;
	}
	PyErr_Clear();
	len = PySequence_Size(obj);
	if (len < 0) {
		PyErr_SetString(PyExc_TypeError, "keys: a sequence of 32-byte keys");
		return -1;
	}
	*owned = malloc(((size_t)len + 1) * sizeof(kvb_key));
	if (!*owned) {
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < len; i++) {
		/* Lists and tuples lend their items (the GIL keeps them alive): no refcounting. */
		int borrowed = PyList_Check(obj) || PyTuple_Check(obj);
		PyObject *k = PyList_Check(obj)	   ? PyList_GetItem(obj, i)
			      : PyTuple_Check(obj) ? PyTuple_GetItem(obj, i)
						   : PySequence_GetItem(obj, i);
		int rc;

		if (!k)
			goto err;
		rc = kvbpy_key(k, &(*owned)[i]);
		if (!borrowed)
			Py_DECREF(k);
		if (rc < 0)
			goto err;
	}
	*keys = *owned;
	*n = (size_t)len;
	return 0;
err:
	free(*owned);
	*owned = NULL;
	return -1;
}

int kvbpy_parents(PyObject *obj, size_t n, kvb_key **out, uint8_t **has)
{
	Py_ssize_t len;

	*out = NULL;
	*has = NULL;
	if (obj == Py_None)
		return 0;
	len = PySequence_Size(obj);
	if (len < 0) {
		PyErr_SetString(PyExc_TypeError, "parents: a sequence of 32-byte keys or None");
		return -1;
	}
	if ((size_t)len != n) {
		PyErr_Format(PyExc_ValueError, "%zu keys but %zd parents", n, len);
		return -1;
	}
	*out = calloc(n + 1, sizeof(**out));
	*has = calloc(n + 1, 1);
	if (!*out || !*has) {
		PyErr_NoMemory();
		goto err;
	}
	for (Py_ssize_t i = 0; i < len; i++) {
		PyObject *k = PySequence_GetItem(obj, i);
		int rc = 0;

		if (!k)
			goto err;
		if (k != Py_None) {
			rc = kvbpy_key(k, &(*out)[i]);
			(*has)[i] = 1;
		}
		Py_DECREF(k);
		if (rc < 0)
			goto err;
	}
	return 0;
err:
	free(*out);
	free(*has);
	*out = NULL;
	*has = NULL;
	return -1;
}

/* Token ids of obj as uint32: *ids points into *owned (free it) or into *view (release it). */
static int tokens_get(PyObject *obj, const uint32_t **ids, size_t *n, uint32_t **owned,
		      Py_buffer *view, int *has_view)
{
	Py_ssize_t len;

	*owned = NULL;
	*has_view = 0;
	if (!PyList_Check(obj) && !PyTuple_Check(obj) &&
	    PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
		const char *f = view->format ? view->format : "B";
		int sgn;

		while (*f == '@' || *f == '=' || *f == '<')
			f++;
		sgn = strchr("bhilq", *f) != NULL;
		if (!strchr("bhilqBHILQ", *f) || f[1] ||
		    (view->itemsize != 4 && view->itemsize != 8)) {
			PyBuffer_Release(view);
			PyErr_SetString(
				PyExc_TypeError,
				"tokens: a buffer of 32- or 64-bit integers, or a sequence");
			return -1;
		}
		len = view->len / view->itemsize;
		if (view->itemsize == 4 && !sgn) {
			*ids = view->buf;
			*n = (size_t)len;
			*has_view = 1;
			return 0;
		}
		*owned = malloc((size_t)len * sizeof(uint32_t) + 1);
		if (!*owned) {
			PyBuffer_Release(view);
			PyErr_NoMemory();
			return -1;
		}
		for (Py_ssize_t i = 0; i < len; i++) {
			int64_t x;

			if (view->itemsize == 4)
				x = sgn ? (int64_t)((const int32_t *)view->buf)[i]
					: (int64_t)((const uint32_t *)view->buf)[i];
			else if (sgn)
				x = ((const int64_t *)view->buf)[i];
			else
				x = ((const uint64_t *)view->buf)[i] > UINT32_MAX
					    ? -1
					    : (int64_t)((const uint64_t *)view->buf)[i];
			if (x < 0 || x > UINT32_MAX) {
				free(*owned);
				*owned = NULL;
				PyBuffer_Release(view);
				PyErr_SetString(PyExc_OverflowError, "token id outside [0, 2**32)");
				return -1;
			}
			(*owned)[i] = (uint32_t)x;
		}
		PyBuffer_Release(view);
		*ids = *owned;
		*n = (size_t)len;
		return 0;
	}
	PyErr_Clear();
	len = PySequence_Size(obj);
	if (len < 0) {
		PyErr_SetString(PyExc_TypeError, "tokens: a sequence of ints or an integer buffer");
		return -1;
	}
	*owned = malloc((size_t)len * sizeof(uint32_t) + 1);
	if (!*owned) {
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < len; i++) {
		PyObject *t = PySequence_GetItem(obj, i);
		unsigned long x;

		if (!t)
			goto err;
		x = PyLong_AsUnsignedLong(t);
		Py_DECREF(t);
		if (x == (unsigned long)-1 && PyErr_Occurred())
			goto err;
		if (x > UINT32_MAX) {
			PyErr_SetString(PyExc_OverflowError, "token id outside [0, 2**32)");
			goto err;
		}
		(*owned)[i] = (uint32_t)x;
	}
	*ids = *owned;
	*n = (size_t)len;
	return 0;
err:
	free(*owned);
	*owned = NULL;
	return -1;
}

static void tokens_put(uint32_t *owned, Py_buffer *view, int has_view)
{
	free(owned);
	if (has_view)
		PyBuffer_Release(view);
}

static int parent_get(PyObject *obj, kvb_key *k, const kvb_key **p)
{
	*p = NULL;
	if (!obj || obj == Py_None)
		return 0;
	if (kvbpy_key(obj, k) < 0)
		return -1;
	*p = k;
	return 0;
}

static PyObject *key_bytes(const kvb_key *k)
{
	return PyBytes_FromStringAndSize((const char *)k->b, sizeof(k->b));
}

/* key_chain(tokens, parent=None) / key_chain_eagle(tokens, parent=None) */
static PyObject *chain_one(PyObject *args, PyObject *kw, int eagle)
{
	static char *kwl[] = {"tokens", "parent", NULL};
	PyObject *tok, *par = NULL;
	const uint32_t *ids;
	const kvb_key *pp;
	uint32_t *owned;
	Py_buffer v;
	kvb_key pk, k;
	size_t n;
	int hv;

	if (!PyArg_ParseTupleAndKeywords(args, kw, eagle ? "O|O:key_chain_eagle" : "O|O:key_chain",
					 kwl, &tok, &par))
		return NULL;
	if (parent_get(par, &pk, &pp) < 0 || tokens_get(tok, &ids, &n, &owned, &v, &hv) < 0)
		return NULL;
	if (eagle && n == 0) {
		tokens_put(owned, &v, hv);
		PyErr_SetString(PyExc_ValueError,
				"an EAGLE page of n positions needs n + 1 token ids");
		return NULL;
	}
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		k = eagle ? kvb_key_chain_eagle(pp, ids, n - 1) : kvb_key_chain(pp, ids, n);
		PyEval_RestoreThread(ts_);
	}
	tokens_put(owned, &v, hv);
	return key_bytes(&k);
}

static PyObject *mod_key_chain(PyObject *self, PyObject *args, PyObject *kw)
{
	(void)self;
	return chain_one(args, kw, 0);
}

static PyObject *mod_key_chain_eagle(PyObject *self, PyObject *args, PyObject *kw)
{
	(void)self;
	return chain_one(args, kw, 1);
}

/* page_keys(tokens, tokens_per_page, parent=None) and the EAGLE variant. */
static PyObject *chain_pages(PyObject *args, PyObject *kw, int eagle)
{
	static char *kwl[] = {"tokens", "tokens_per_page", "parent", NULL};
	PyObject *tok, *par = NULL, *list = NULL;
	Py_ssize_t tpp;
	const uint32_t *ids;
	const kvb_key *pp;
	uint32_t *owned;
	kvb_key pk, *out;
	size_t n, npages;
	Py_buffer v;
	int hv;

	if (!PyArg_ParseTupleAndKeywords(args, kw,
					 eagle ? "On|O:page_keys_eagle" : "On|O:page_keys", kwl,
					 &tok, &tpp, &par))
		return NULL;
	if (tpp <= 0) {
		PyErr_SetString(PyExc_ValueError, "tokens_per_page must be >= 1");
		return NULL;
	}
	if (parent_get(par, &pk, &pp) < 0 || tokens_get(tok, &ids, &n, &owned, &v, &hv) < 0)
		return NULL;
	/* EAGLE: n ids are n - 1 positions (the last id only closes the last pair). */
	npages = (eagle ? (n ? n - 1 : 0) : n) / (size_t)tpp;
	out = malloc((npages + 1) * sizeof(*out));
	if (!out) {
		tokens_put(owned, &v, hv);
		return PyErr_NoMemory();
	}
	{
		PyThreadState *ts_ = PyEval_SaveThread();

		for (size_t i = 0; i < npages; i++) {
			const uint32_t *t = ids + i * (size_t)tpp;

			out[i] = eagle ? kvb_key_chain_eagle(pp, t, (size_t)tpp)
				       : kvb_key_chain(pp, t, (size_t)tpp);
			pp = &out[i];
		}
		PyEval_RestoreThread(ts_);
	}
	tokens_put(owned, &v, hv);
	list = PyList_New((Py_ssize_t)npages);
	for (size_t i = 0; list && i < npages; i++) {
		PyObject *b = key_bytes(&out[i]);

		if (!b || PyList_SetItem(list, (Py_ssize_t)i, b) < 0)
			Py_CLEAR(list);
	}
	free(out);
	return list;
}

static PyObject *mod_page_keys(PyObject *self, PyObject *args, PyObject *kw)
{
	(void)self;
	return chain_pages(args, kw, 0);
}

static PyObject *mod_page_keys_eagle(PyObject *self, PyObject *args, PyObject *kw)
{
	(void)self;
	return chain_pages(args, kw, 1);
}

static PyMethodDef key_methods[] = {
	{"key_chain", (PyCFunction)(void (*)(void))mod_key_chain, METH_VARARGS | METH_KEYWORDS,
	 "key_chain(tokens, parent=None) -> bytes\n--\n\n"
	 "The 32-byte key of one page: SHA-256(parent || le32(tokens[0]) || ...), bit for bit\n"
	 "SGLang HiCache's get_hash_str() (as raw bytes; key_hex() gives its hex string)."},
	{"page_keys", (PyCFunction)(void (*)(void))mod_page_keys, METH_VARARGS | METH_KEYWORDS,
	 "page_keys(tokens, tokens_per_page, parent=None) -> list[bytes]\n--\n\n"
	 "The chained keys of every full page of tokens (a partial last page gets none), the\n"
	 "first chained from parent."},
	{"key_chain_eagle", (PyCFunction)(void (*)(void))mod_key_chain_eagle,
	 METH_VARARGS | METH_KEYWORDS,
	 "key_chain_eagle(tokens, parent=None) -> bytes\n--\n\n"
	 "The key of an EAGLE (bigram) page of len(tokens) - 1 positions: position i hashes the\n"
	 "pair (tokens[i], tokens[i + 1]), 8 bytes; tokens ends with the first id after the page.\n"
	 "Bit for bit SGLang's get_hash_str() of a bigram key."},
	{"page_keys_eagle", (PyCFunction)(void (*)(void))mod_page_keys_eagle,
	 METH_VARARGS | METH_KEYWORDS,
	 "page_keys_eagle(tokens, tokens_per_page, parent=None) -> list[bytes]\n--\n\n"
	 "EAGLE keys of every full page of len(tokens) - 1 positions, chained."},
	{NULL, NULL, 0, NULL},
};

int kvbpy_keys_init(PyObject *m)
{
	return PyModule_AddFunctions(m, key_methods);
}
