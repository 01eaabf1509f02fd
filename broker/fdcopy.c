// SPDX-License-Identifier: MIT
/*
 * fdcopy.c - client buffers copied with pread/pwrite on the file instead of through a mapping
 * (BUF_REG_FD with KVB_BUF_FDCOPY): tmpfs files that cannot be sealed, such as SGLang 0.5.23's
 * shm host pool (a memfd made without MFD_ALLOW_SEALING, or an unlinked /dev/shm file).
 *
 * Why not map them: the client can truncate an unsealed file at any moment, and a memcpy
 * through a mapping of the part cut off raises SIGBUS in the broker. The kernel's copy behind
 * pread/pwrite cannot fault: reading past EOF returns a short count, the op fails with -EFAULT
 * (a PUT commits nothing; a GET reports the failure, the engine's memory may hold part of the
 * page) and the broker goes on serving everyone.
 *
 * Writes (GET) must not grow the client's file: pwrite past EOF extends it, and the tmpfs pages
 * it would allocate are charged to the writer, the broker. Each job therefore checks the runs
 * it writes against the file's size (fstat, once per job and file) and fails -EFAULT, without
 * writing them, when they reach past EOF. A truncation racing with that check can make the
 * write put back bytes the client just cut off, but never beyond the registered range, which
 * lay inside the file when it was registered: bounded by what the client had, its own doing.
 * O_APPEND would make pwrite append (Linux then ignores the offset), and a client can set it
 * on its open file description at any time: the broker writes through a description of its
 * own, reopened through /proc/self/fd/N (nobody else can change its flags). When the reopen is
 * refused (another user's file, no /proc) it keeps the client's, refuses it while O_APPEND is
 * set and checks O_APPEND again before each job's writes (COPY_FD_SHARED; a flip between that
 * check and the write appends at most one run, again the client's own doing).
 *
 * A buffer's base is a PROT_NONE reservation, never dereferenced: ops.c computes segment
 * addresses in it exactly as in a mapping, fdcopy_resolve (loop thread, when the job is made)
 * turns those that fall in file buffers into (fd, offset) pairs, and fdcopy_run (a copy worker,
 * or inline) moves the bytes, one preadv/pwritev per run of segments contiguous in the file. A
 * guard page on each side keeps any other mapping from being adjacent, so that copy_seg_add
 * can never merge a segment across a buffer's edge. The fd lives as long as the sbuf, which
 * the session keeps until its last op completed (sbuf.closing).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "broker.h"

struct fdbuf {
	int fd;		/* ours: a reopen of the client's file, or (COPY_FD_SHARED) a dup */
	uint32_t flags; /* COPY_FD_SHARED */
	uint64_t off;	/* file offset of sbuf.base */
	void *resv;	/* the reservation: guard page, base .. base + len, guard page(s) */
	uint64_t resv_len;
};

/* iovecs per call: runs longer than this take a few calls (IOV_MAX is 1024). */
#define FDCOPY_IOV 64

static uint64_t page_size(void)
{
	long pg = sysconf(_SC_PAGESIZE);

	return pg > 0 ? (uint64_t)pg : 4096;
}

/* Our own open file description of the client's file, or -1. */
static int reopen(int fd)
{
	struct stat a, b;
	char path[40];
	int own;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	own = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY);
	if (own < 0)
		return -1;
	/* The same file (not whatever a racing rename left at a path): compare inodes. */
	if (fstat(own, &a) < 0 || fstat(fd, &b) < 0 || a.st_dev != b.st_dev ||
	    a.st_ino != b.st_ino) {
		close(own);
		return -1;
	}
	return own;
}

int fdcopy_buf_open(int fd, uint64_t off, uint64_t len, struct sbuf *sb)
{
	uint64_t pg = page_size(), resv_len;
	int fl = fcntl(fd, F_GETFL), own, shared = 0;
	struct fdbuf *f;
	void *p;

	/* The client must be able to read and write the file itself: we do both for it. */
	if (fl < 0 || (fl & O_ACCMODE) != O_RDWR)
		return -EBADF;
	/* off + len <= st_size (checked by the caller): no overflow below, offsets fit off_t. */
	own = reopen(fd);
	if (own < 0) {
		if (fl & O_APPEND)
			return -EBADF;
		own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		if (own < 0)
			return -errno;
		shared = 1;
	}
	f = calloc(1, sizeof(*f));
	resv_len = pg + ((len + pg - 1) & ~(pg - 1)) + pg;
	p = mmap(NULL, resv_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (!f || p == MAP_FAILED) {
		if (p != MAP_FAILED)
			munmap(p, resv_len);
		free(f);
		close(own);
		return -ENOMEM;
	}
	*f = (struct fdbuf){.fd = own,
			    .flags = shared ? COPY_FD_SHARED : 0,
			    .off = off,
			    .resv = p,
			    .resv_len = resv_len};
	*sb = (struct sbuf){.base = (uint8_t *)p + pg, .len = len, .dev = COPY_HOST, .fdb = f};
	return 0;
}

void fdcopy_buf_close(struct sbuf *sb)
{
	struct fdbuf *f = sb->fdb;

	munmap(f->resv, f->resv_len);
	close(f->fd);
	free(f);
	sb->fdb = NULL;
}

static int in_buf(const struct sbuf *sb, uintptr_t p)
{
	return p >= (uintptr_t)sb->base && p - (uintptr_t)sb->base < sb->len;
}

void fdcopy_resolve(const struct session *s, struct copy_job *j, struct copy_fdseg *room)
{
	const struct sbuf *fb[SESSION_MAX_BUFS], *last = NULL;
	uint32_t n = 0, hits = 0;

	j->fds = NULL;
	for (uint32_t i = 0; i < SESSION_MAX_BUFS && n < s->nfdbufs; i++)
		if (s->bufs[i].fdb)
			fb[n++] = &s->bufs[i];
	for (uint32_t i = 0; n && i < j->nsegs; i++) {
		const struct copy_seg *sg = &j->segs[i];
		uintptr_t p = (uintptr_t)(j->dir == COPY_TO_POOL ? sg->src : sg->dst);
		const struct sbuf *sb = last && in_buf(last, p) ? last : NULL;

		for (uint32_t k = 0; !sb && k < n; k++)
			if (in_buf(fb[k], p))
				sb = fb[k];
		if (!sb) {
			room[i] = (struct copy_fdseg){.fd = -1};
			continue;
		}
		/* ops.c checked the segment against the buffer; the guards keep it inside. */
		last = sb;
		hits++;
		room[i] = (struct copy_fdseg){.fd = sb->fdb->fd,
					      .flags = sb->fdb->flags,
					      .off = sb->fdb->off + (p - (uintptr_t)sb->base)};
	}
	if (hits)
		j->fds = room;
}

/* n iovecs at file offset off, all of them, or -errno (-EFAULT: the file ended first). */
static int file_io(int fd, struct iovec *iov, int n, uint64_t off, int wr)
{
	while (n > 0) {
		ssize_t r = wr ? pwritev(fd, iov, n, (off_t)off) : preadv(fd, iov, n, (off_t)off);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return -EFAULT;
		off += (uint64_t)r;
		for (; n > 0 && (size_t)r >= iov->iov_len; iov++, n--)
			r -= (ssize_t)iov->iov_len;
		if (n > 0) {
			iov->iov_base = (uint8_t *)iov->iov_base + r;
			iov->iov_len -= (size_t)r;
		}
	}
	return 0;
}

/* Before writing: the file's size now, and (a shared description) no O_APPEND. */
static int write_check(const struct copy_fdseg *f, uint64_t *size)
{
	struct stat st;

	if (fstat(f->fd, &st) < 0)
		return -errno;
	if ((f->flags & COPY_FD_SHARED) && (fcntl(f->fd, F_GETFL) & O_APPEND))
		return -EFAULT;
	*size = st.st_size > 0 ? (uint64_t)st.st_size : 0;
	return 0;
}

int fdcopy_run(const struct copy_job *j)
{
	int wr = j->dir == COPY_FROM_POOL, checked = -1;
	struct iovec iov[FDCOPY_IOV];
	uint64_t size = 0;

	for (uint32_t i = 0; i < j->nsegs;) {
		const struct copy_fdseg *f = &j->fds[i];
		uint64_t len = 0;
		int n = 0, err;

		if (f->fd < 0) {
			memcpy(j->segs[i].dst, j->segs[i].src, j->segs[i].len);
			i++;
			continue;
		}
		/* The pool side of each segment; the file side is one range from f->off. */
		do {
			const struct copy_seg *sg = &j->segs[i];

			iov[n++] = (struct iovec){.iov_base = wr ? (void *)(uintptr_t)sg->src
								 : sg->dst,
						  .iov_len = sg->len};
			len += sg->len;
			i++;
		} while (i < j->nsegs && n < FDCOPY_IOV && j->fds[i].fd == f->fd &&
			 j->fds[i].off == f->off + len);
		if (wr) {
			if (f->fd != checked) {
				err = write_check(f, &size);
				if (err)
					return err;
				checked = f->fd;
			}
			if (f->off + len > size)
				return -EFAULT; /* would write past EOF: grow the file */
		}
		err = file_io(f->fd, iov, n, f->off, wr);
		if (err)
			return err;
	}
	return 0;
}
