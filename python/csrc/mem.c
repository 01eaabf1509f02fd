// SPDX-License-Identifier: MIT
/*
 * mem.c - the memory behind a Python object given as a page's source or destination.
 *
 * Any buffer-protocol object works (bytes, bytearray, memoryview, array, numpy arrays), as
 * long as it is C-contiguous; the Py_buffer stays held for the whole call, so the exporter
 * cannot resize or free it while the broker or the library copies (bytearray refuses to
 * resize, a HostBuffer to unregister, while exported). Objects without the buffer protocol
 * that have data_ptr() and nbytes (torch tensors, CPU or CUDA) work too, through their raw
 * pointer, with a reference held for the call. A CUDA pointer is accepted only inside a GPU
 * buffer registered on this client: libkvbroker treats every pointer it does not know as host
 * memory and would memcpy into the device address.
 */
#include <string.h>

#include "kvbpy.h"

static int torch_like(kvbpy_client *cl, PyObject *obj, struct kvbpy_mem *m)
{
	PyObject *v;
	unsigned long long p;
	long long nb;
	int cuda = 0, contig;

	v = PyObject_CallMethod(obj, "data_ptr", NULL);
	if (!v)
		return -1;
	p = PyLong_AsUnsignedLongLong(v);
	Py_DECREF(v);
	if (PyErr_Occurred())
		return -1;
	v = PyObject_GetAttrString(obj, "nbytes");
	if (!v)
		return -1;
	nb = PyLong_AsLongLong(v);
	Py_DECREF(v);
	if (nb < 0)
		return PyErr_Occurred() ? -1
					: (PyErr_SetString(PyExc_ValueError, "nbytes < 0"), -1);
	v = PyObject_CallMethod(obj, "is_contiguous", NULL);
	if (!v)
		return -1;
	contig = PyObject_IsTrue(v);
	Py_DECREF(v);
	if (contig < 0)
		return -1;
	if (!contig) {
		PyErr_SetString(PyExc_ValueError, "tensor is not contiguous");
		return -1;
	}
	v = PyObject_GetAttrString(obj, "is_cuda");
	if (v) {
		cuda = PyObject_IsTrue(v);
		Py_DECREF(v);
		if (cuda < 0)
			return -1;
	} else {
		PyErr_Clear();
	}
	if (cuda) {
		const struct kvbpy_reg *r = kvbpy_reg_find(cl, (uintptr_t)p, (size_t)nb);

		if (!r || !r->gpu) {
			PyErr_SetString(PyExc_ValueError,
					"CUDA memory outside every GPU buffer registered on this "
					"client (register_gpu() its allocation first)");
			return -1;
		}
	}
	m->ptr = (void *)(uintptr_t)p;
	m->len = (size_t)nb;
	m->gpu = cuda;
	m->ref = Py_NewRef(obj);
	return 0;
}

int kvbpy_mem_get(kvbpy_client *cl, PyObject *obj, int writable, struct kvbpy_mem *m)
{
	memset(m, 0, sizeof(*m));
	if (PyObject_CheckBuffer(obj)) {
		int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);

		if (PyObject_GetBuffer(obj, &m->view, flags) < 0)
			return -1;
		m->has_view = 1;
		m->ptr = m->view.buf;
		m->len = (size_t)m->view.len;
		return 0;
	}
	if (PyObject_HasAttrString(obj, "data_ptr"))
		return torch_like(cl, obj, m);
	PyErr_Format(PyExc_TypeError,
		     "a page source/destination supports the buffer protocol or has data_ptr() "
		     "and nbytes, not %R",
		     (PyObject *)Py_TYPE(obj));
	return -1;
}

void kvbpy_mem_release(struct kvbpy_mem *m)
{
	if (m->has_view)
		PyBuffer_Release(&m->view);
	m->has_view = 0;
	Py_CLEAR(m->ref);
}
