// SPDX-License-Identifier: MIT
/*
 * hostmap.c - moving an engine's shared host mapping onto a sealable memfd, in place.
 *
 * An engine's host pool can be a MAP_SHARED mapping of a memfd made without
 * MFD_ALLOW_SEALING (SGLang's shm allocator). The broker maps a client's fd only when it is
 * sealed against shrinking (a shrunk file would SIGBUS the broker's copy), so such a pool can
 * only be copied with pread/pwrite. remap_onto_memfd() gives the pool a file the broker can
 * map: a new sealable memfd receives the bytes, then replaces the old mapping at the same
 * addresses in one mremap(MREMAP_FIXED), so every pointer and tensor the engine holds stays
 * valid and no moment exists where the range is unmapped. punch_hole() then frees the old
 * file's pages (the engine keeps its fd; the pool is not held twice).
 *
 * Both run with the GIL released (the copy is the pool's size). Nothing else may write to the
 * range while remap_onto_memfd() copies: the caller moves only a pool that carries no traffic.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvbpy.h"

/* OSError(err, "what: strerror"): the errno's subclass (FileNotFoundError...) as usual. */
static PyObject *raise_os(int err, const char *what)
{
	char msg[256];
	PyObject *e;

	snprintf(msg, sizeof(msg), "%s: %s", what, strerror(err));
	e = PyObject_CallFunction(PyExc_OSError, "is", err, msg);
	if (e) {
		PyErr_SetObject((PyObject *)Py_TYPE(e), e);
		Py_DECREF(e);
	}
	return NULL;
}

/*
 * The work of remap_onto_memfd() (GIL released): 0 with *fd_out the new memfd, or a positive
 * errno with *what naming the step that failed, the range untouched and no fd left open.
 */
static int remap(void *addr, size_t len, const char *name, int *fd_out, const char **what)
{
	void *tmp, *got;
	int fd, err;

	/* msync fails with ENOMEM when part of the range is not mapped: never map over a hole
	 * (or past the end of the pool) that something else may own later. */
	if (msync(addr, len, MS_ASYNC) < 0) {
		*what = "remap_onto_memfd: the range is not one mapping (msync)";
		return errno;
	}
	fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		*what = "remap_onto_memfd: memfd_create";
		return errno;
	}
	if (ftruncate(fd, (off_t)len) < 0) {
		err = errno;
		*what = "remap_onto_memfd: ftruncate";
		goto err_close;
	}
	tmp = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (tmp == MAP_FAILED) {
		err = errno;
		*what = "remap_onto_memfd: mmap of the new memfd";
		goto err_close;
	}
	memcpy(tmp, addr, len);
	/* One step from the old mapping to the new one: mremap onto a fixed address replaces
	 * what is there atomically (munmap + mmap MAP_FIXED would leave a window, and a failed
	 * MAP_FIXED may leave the range unmapped). */
	got = mremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, addr);
	if (got == MAP_FAILED) {
		err = errno;
		*what = "remap_onto_memfd: mremap onto the pool's addresses";
		goto err_unmap;
	}
	*fd_out = fd;
	return 0;
err_unmap:
	munmap(tmp, len);
err_close:
	close(fd);
	return err;
}

/*
 * remap_onto_memfd(address, nbytes, name) -> fd. [address, address + nbytes) must be one
 * page-aligned, fully mapped, readable range (nbytes is rounded up to whole pages). On
 * success the range is a MAP_SHARED mapping of the returned memfd (MFD_CLOEXEC |
 * MFD_ALLOW_SEALING, owned by the caller) holding the same bytes; on failure the range is
 * untouched and no fd is left open.
 */
static PyObject *mod_remap_onto_memfd(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwl[] = {"address", "nbytes", "name", NULL};
	unsigned long long addr_arg, nbytes_arg;
	const char *name = "kvbroker_host_pool";
	const char *what = NULL;
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), len;
	int fd = -1, err;

	(void)self;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "KK|s:remap_onto_memfd", kwl, &addr_arg,
					 &nbytes_arg, &name))
		return NULL;
	if (addr_arg == 0 || addr_arg % pg || nbytes_arg == 0 ||
	    nbytes_arg > (unsigned long long)SIZE_MAX - pg || addr_arg + nbytes_arg < addr_arg) {
		PyErr_Format(PyExc_ValueError,
			     "remap_onto_memfd: address 0x%llx, %llu bytes: not a non-empty range "
			     "starting on a page boundary",
			     addr_arg, nbytes_arg);
		return NULL;
	}
	len = ((size_t)nbytes_arg + pg - 1) / pg * pg;
	Py_BEGIN_ALLOW_THREADS;
	err = remap((void *)(uintptr_t)addr_arg, len, name, &fd, &what);
	Py_END_ALLOW_THREADS;
	if (err)
		return raise_os(err, what);
	return PyLong_FromLong(fd);
}

/* punch_hole(fd, offset, nbytes): frees the file's pages in the range, its size unchanged. */
static PyObject *mod_punch_hole(PyObject *self, PyObject *args)
{
	long long off, len;
	int fd, rc;

	(void)self;
	if (!PyArg_ParseTuple(args, "iLL:punch_hole", &fd, &off, &len))
		return NULL;
	if (fd < 0 || off < 0 || len <= 0) {
		PyErr_SetString(PyExc_ValueError, "punch_hole: fd, offset >= 0 and nbytes > 0");
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS;
	rc = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) < 0
		     ? errno
		     : 0;
	Py_END_ALLOW_THREADS;
	if (rc)
		return raise_os(rc, "punch_hole: fallocate(PUNCH_HOLE)");
	return Py_NewRef(Py_None);
}

static PyMethodDef hostmap_methods[] = {
	{"remap_onto_memfd", (PyCFunction)(void (*)(void))mod_remap_onto_memfd,
	 METH_VARARGS | METH_KEYWORDS,
	 "remap_onto_memfd(address, nbytes, name='kvbroker_host_pool') -> int\n--\n\n"
	 "Moves the mapped range [address, address + nbytes) (page-aligned, one mapping, "
	 "nbytes rounded up to pages) onto a new sealable memfd at the same addresses, bytes "
	 "kept: one mremap, never a moment unmapped. Returns the memfd (the caller closes it). "
	 "OSError, the range untouched, on failure."},
	{"punch_hole", mod_punch_hole, METH_VARARGS,
	 "punch_hole(fd, offset, nbytes) -> None\n--\n\n"
	 "fallocate(PUNCH_HOLE | KEEP_SIZE): frees the file's pages in the range."},
	{NULL, NULL, 0, NULL},
};

int kvbpy_hostmap_init(PyObject *m)
{
	return PyModule_AddFunctions(m, hostmap_methods);
}
