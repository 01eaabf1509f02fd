// SPDX-License-Identifier: MIT
/*
 * disk.c - the disk tier's device side: paths, superblocks, the io_uring.
 *
 * Paths: files are created if missing and preallocated with fallocate (so a full file system is
 * a start-up error, not a failed write later); block devices are used as they are, up to their
 * size. Each path is opened O_DIRECT: page I/O bypasses the page cache, which would otherwise
 * double the memory the pool already is. Where that makes no sense or is refused (tmpfs: the
 * page cache is the memory; file systems that fail O_DIRECT with EINVAL) the path is used with
 * buffered I/O, and the log and the stats ("direct": false) say so.
 *
 * Superblocks (format in slot.c): a path is adopted when its superblock is intact and names the
 * geometry of this start (number of paths, its index, its size) and every path carries the same
 * cache id; otherwise every path is formatted with a fresh id, which makes every old slot stale.
 *
 * The ring: qd SQEs, a CQ twice that, optionally SQPOLL (a kernel thread polls the SQ, so a
 * submission is a memory write, at the cost of a busy kernel thread). Files are registered;
 * the pool is registered as fixed buffers in chunks of at most 1 GiB (the kernel's limit for
 * one buffer), each a multiple of the slab size so that no page slot straddles two chunks, and
 * the header blocks as one more buffer: page I/O then skips pinning user pages per request.
 * An eventfd registered with the ring is readable whenever completions were posted: the loop
 * adds it to its epoll set and sleeps correctly while I/O is in flight. Loop thread only.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include "disk.h"
#include "log.h"
#include "slot.h"

#define CHUNK_MAX (1ull << 30)

/*
 * flock(LOCK_EX | LOCK_NB), retried for up to LOCK_WAIT_MS. A broker SIGKILLed a moment ago
 * still holds the lock after it was reaped: its io_uring is torn down by a kernel worker, which
 * waits for the I/O in flight and only then drops the ring's references to the registered
 * files (t_rel_disk_crash, restarting at once, met it on 5 of 25 restarts, for 2-18 ms).
 * -1 with errno when the lock stays taken: a live broker uses the path.
 */
#define LOCK_WAIT_MS 3000
static int lock_path(const struct disk_path *p)
{
	struct timespec ms = {0, 1000000};
	int rc = -1;

	for (int i = 0; i <= LOCK_WAIT_MS && rc < 0; i++) {
		rc = flock(p->fd, LOCK_EX | LOCK_NB);
		if (rc < 0 && errno != EWOULDBLOCK)
			break;
		if (rc < 0 && i == 0)
			log_info("disk %s: locked; waiting up to %d ms (a broker that just died "
				 "lets go once its I/O completed)",
				 p->name, LOCK_WAIT_MS);
		if (rc < 0)
			nanosleep(&ms, NULL);
		else if (i)
			log_info("disk %s: lock taken after %d ms", p->name, i);
	}
	return rc;
}

/*
 * A failed start gives back what it took: a file it created is removed, a file it found is cut
 * back to the size it had (fallocate grew it, perhaps until the file system was full). Block
 * devices are left as they are.
 */
static void disk_undo_path(struct disk_path *p)
{
	if (p->created) {
		if (unlink(p->name) < 0)
			log_warn("disk %s: removing the file this start created: %s", p->name,
				 strerror(errno));
		else
			log_info("disk %s: removed (created by this failed start)", p->name);
	} else if (p->regular && truncate(p->name, (off_t)p->eof) < 0) {
		log_warn("disk %s: cutting it back to %llu bytes: %s", p->name,
			 (unsigned long long)p->eof, strerror(errno));
	}
	p->created = p->regular = 0;
}

void disk_undo(struct disk *d)
{
	for (uint32_t i = 0; i < d->npaths; i++)
		disk_undo_path(&d->path[i]);
}

int disk_tmpfs_file(mode_t mode, long f_type)
{
	return S_ISREG(mode) && f_type == TMPFS_MAGIC;
}

/* Opens one path read-write, preallocated to bytes (files) or checked against it (devices). */
static int path_open(struct disk_path *p, uint64_t bytes)
{
	struct statfs sf;
	struct stat st;
	int fd, dfd, err;

	/* Created here or found: a failed start removes only what it created (disk_undo). */
	fd = open(p->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd >= 0)
		p->created = 1;
	else if (errno == EEXIST)
		fd = open(p->name, O_RDWR | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0 || fstatfs(fd, &sf) < 0) {
		log_error("disk %s: %s", p->name, strerror(errno));
		goto err;
	}
	p->bytes = bytes;
	if (S_ISBLK(st.st_mode)) {
		uint64_t dev = 0;

		p->blockdev = 1;
		if (ioctl(fd, BLKGETSIZE64, &dev) < 0) {
			log_error("disk %s: BLKGETSIZE64: %s", p->name, strerror(errno));
			goto err;
		}
		if (dev < p->bytes)
			p->bytes = dev & ~(uint64_t)(SLOT_BLOCK - 1);
		p->eof = p->bytes;
	} else if (S_ISREG(st.st_mode)) {
		p->eof = (uint64_t)st.st_size;
		p->regular = 1;
		/* A fallocate that fails (ENOSPC) keeps what it allocated: disk_undo gives it back. */
		if (fallocate(fd, 0, 0, (off_t)bytes) < 0 &&
		    (errno != EOPNOTSUPP || (p->eof < bytes && ftruncate(fd, (off_t)bytes) < 0))) {
			log_error("disk %s: reserving %llu bytes: %s", p->name,
				  (unsigned long long)bytes, strerror(errno));
			goto err;
		}
	} else {
		log_error("disk %s: neither a file nor a block device", p->name);
		errno = EINVAL;
		goto err;
	}
	if (p->bytes < SLOT_DATA_OFF + (4ull << 20)) {
		log_error("disk %s: %llu bytes is too small (at least 5 MiB per path)", p->name,
			  (unsigned long long)p->bytes);
		errno = EINVAL;
		goto err;
	}
	/* tmpfs: the page cache is the memory, O_DIRECT would only add a copy's worth of work. */
	if (disk_tmpfs_file(st.st_mode, (long)sf.f_type)) {
		log_warn("disk %s: on tmpfs: buffered I/O, not O_DIRECT", p->name);
		p->fd = fd;
		return 0;
	}
	dfd = open(p->name, O_RDWR | O_DIRECT | O_CLOEXEC);
	if (dfd < 0) {
		if (errno != EINVAL) {
			log_error("disk %s: O_DIRECT open: %s", p->name, strerror(errno));
			goto err;
		}
		log_warn("disk %s: the file system refuses O_DIRECT: buffered I/O", p->name);
		p->fd = fd;
		return 0;
	}
	close(fd);
	p->fd = dfd;
	p->direct = 1;
	return 0;
err:
	err = -errno;
	if (fd >= 0)
		close(fd);
	disk_undo_path(p);
	return err;
}

/* Reads (or, write != 0, writes) the superblock block of a path, synchronously (start-up). */
static int super_io(struct disk_path *p, void *blk, int write)
{
	ssize_t n = write ? pwrite(p->fd, blk, SLOT_BLOCK, 0) : pread(p->fd, blk, SLOT_BLOCK, 0);

	if (n == SLOT_BLOCK)
		return 0;
	if (!write && n >= 0) {
		memset(blk, 0, SLOT_BLOCK); /* a short file: no superblock */
		return 0;
	}
	return n < 0 ? -errno : -EIO;
}

/* Adopts the cache when every superblock matches this geometry, else formats every path. */
static int supers(struct disk *d, void *blk)
{
	struct slot_super s;
	int err;

	d->warm = 1;
	for (uint32_t i = 0; i < d->npaths; i++) {
		struct disk_path *p = &d->path[i];

		err = super_io(p, blk, 0);
		if (err) {
			log_error("disk %s: reading the superblock: %s", p->name, strerror(-err));
			return err;
		}
		memcpy(&s, blk, sizeof(s));
		if (slot_super_check(blk))
			p->why_new = "no cache superblock";
		else if (s.npaths != d->npaths || s.index != i || s.path_bytes != p->bytes)
			p->why_new = "a cache of another geometry (paths or --disk-size changed)";
		else if (i && memcmp(s.cache_id, d->cache_id, sizeof(s.cache_id)))
			p->why_new = "a path of another cache";
		if (p->why_new)
			d->warm = 0;
		else if (!i)
			memcpy(d->cache_id, s.cache_id, sizeof(s.cache_id));
	}
	if (d->warm)
		return 0;
	if (getrandom(d->cache_id, sizeof(d->cache_id), 0) != sizeof(d->cache_id))
		return -EIO;
	for (uint32_t i = 0; i < d->npaths; i++) {
		struct disk_path *p = &d->path[i];

		memset(blk, 0, SLOT_BLOCK);
		memset(&s, 0, sizeof(s));
		s.npaths = d->npaths;
		s.index = i;
		s.path_bytes = p->bytes;
		memcpy(s.cache_id, d->cache_id, sizeof(s.cache_id));
		s.created = (uint64_t)time(NULL);
		slot_super_seal(&s);
		memcpy(blk, &s, sizeof(s));
		err = super_io(p, blk, 1);
		if (!err && fdatasync(p->fd) < 0)
			err = -errno;
		if (err) {
			log_error("disk %s: writing the superblock: %s", p->name, strerror(-err));
			return err;
		}
		p->formatted = 1;
		log_info("disk %s: formatted (%s)", p->name, p->why_new ? p->why_new : "new cache");
	}
	return 0;
}

/* The pool in chunks plus the header blocks as fixed buffers. Failure only costs speed. */
static void register_buffers(struct disk *d, uint64_t slab_bytes)
{
	struct iovec *iov;
	uint32_t n = 1;
	int err;

	d->chunk_bytes = CHUNK_MAX / slab_bytes * slab_bytes;
	/*
	 * [tenant-lend] Not a sparse pool: registering pins every page of every partition (each
	 * as large as the pool), and a hole punched afterwards would leave the registration on
	 * the old pages, reading and writing memory no longer the pool's.
	 */
	if (!d->chunk_bytes || d->pool->sparse)
		return;
	for (uint32_t a = 0; a < d->pool->narenas; a++)
		n += (uint32_t)((d->pool->arena[a].size + d->chunk_bytes - 1) / d->chunk_bytes);
	iov = calloc(n, sizeof(*iov));
	if (!iov)
		return;
	n = 0;
	for (uint32_t a = 0; a < d->pool->narenas; a++) {
		const struct pool_arena *ar = &d->pool->arena[a];

		d->arena_buf0[a] = n;
		for (uint64_t off = 0; off < ar->size; off += d->chunk_bytes) {
			iov[n].iov_base = (uint8_t *)ar->base + off;
			iov[n++].iov_len = ar->size - off < d->chunk_bytes ? ar->size - off
									   : d->chunk_bytes;
		}
	}
	d->hdr_buf = n;
	iov[n].iov_base = d->hdrs;
	iov[n++].iov_len = (size_t)d->nhdrs * SLOT_BLOCK;
	err = io_uring_register_buffers(&d->ring, iov, n);
	free(iov);
	if (err) {
		log_warn("disk: registering the pool as %u fixed buffers: %s: plain reads and "
			 "writes",
			 n, strerror(-err));
		return;
	}
	d->fixed_bufs = 1;
}

int disk_open(struct disk *d, const struct disk_cfg *c, const struct pool *p, uint64_t slab_bytes,
	      uint32_t nhdrs)
{
	struct io_uring_params prm;
	int fds[DISK_MAX_PATHS], err = -EINVAL;
	const char *s = c->paths;
	void *blk = NULL;

	memset(d, 0, sizeof(*d));
	d->efd = -1;
	d->pool = p;
	d->qd = c->qd;
	for (uint32_t i = 0; i < DISK_MAX_PATHS; i++)
		d->path[i].fd = -1;
	while (*s) {
		const char *e = strchr(s, ',');
		size_t len = e ? (size_t)(e - s) : strlen(s);

		if (d->npaths == DISK_MAX_PATHS || !len || len >= sizeof(d->path[0].name)) {
			log_error("disk: bad --disk list (at most %d paths)", DISK_MAX_PATHS);
			goto err;
		}
		memcpy(d->path[d->npaths++].name, s, len);
		s += len + (e ? 1 : 0);
	}
	if (!d->npaths)
		goto err;
	for (uint32_t i = 0; i < d->npaths; i++) {
		uint64_t share = c->size / d->npaths & ~((1ull << 20) - 1);

		err = path_open(&d->path[i], share);
		if (err)
			goto err;
		/* Two brokers writing one cache would overwrite each other's slots. */
		if (lock_path(&d->path[i]) < 0) {
			err = errno == EWOULDBLOCK ? -EBUSY : -errno;
			log_error("disk %s: %s", d->path[i].name,
				  err == -EBUSY ? "another kvbrokerd uses it" : strerror(-err));
			goto err;
		}
		fds[i] = d->path[i].fd;
	}
	d->direct = 1;
	for (uint32_t i = 0; i < d->npaths; i++)
		d->direct &= d->path[i].direct;
	if (posix_memalign(&blk, SLOT_BLOCK, SLOT_BLOCK)) {
		err = -ENOMEM;
		goto err;
	}
	err = supers(d, blk);
	free(blk);
	if (err)
		goto err;

	d->nhdrs = nhdrs;
	d->hdrs = mmap(NULL, (size_t)nhdrs * SLOT_BLOCK, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (d->hdrs == MAP_FAILED) {
		d->hdrs = NULL;
		err = -ENOMEM;
		goto err;
	}
	memset(&prm, 0, sizeof(prm));
	prm.flags = IORING_SETUP_CQSIZE;
	prm.cq_entries = 2 * c->qd;
	if (c->sqpoll) {
		prm.flags |= IORING_SETUP_SQPOLL;
		prm.sq_thread_idle = 50; /* ms of idle polling before the thread sleeps */
	}
	err = io_uring_queue_init_params(c->qd, &d->ring, &prm);
	if (err) {
		log_error("disk: io_uring setup (%u entries%s): %s", c->qd,
			  c->sqpoll ? ", SQPOLL" : "", strerror(-err));
		goto err;
	}
	d->ring_ok = 1;
	d->sqpoll = c->sqpoll;
	d->qd = d->ring.sq.ring_entries;
	err = io_uring_register_files(&d->ring, fds, d->npaths);
	if (err) {
		log_error("disk: registering files: %s", strerror(-err));
		goto err;
	}
	register_buffers(d, slab_bytes);
	d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (d->efd < 0) {
		err = -errno;
		goto err;
	}
	err = io_uring_register_eventfd(&d->ring, d->efd);
	if (err) {
		log_error("disk: registering the eventfd: %s", strerror(-err));
		goto err;
	}
	return 0;
err:
	disk_undo(d);
	disk_close(d);
	return err;
}

void disk_close(struct disk *d)
{
	if (d->ring_ok)
		io_uring_queue_exit(&d->ring);
	d->ring_ok = 0;
	if (d->efd >= 0)
		close(d->efd);
	d->efd = -1;
	for (uint32_t i = 0; i < DISK_MAX_PATHS; i++) {
		if (d->path[i].fd >= 0)
			close(d->path[i].fd);
		d->path[i].fd = -1;
	}
	if (d->hdrs)
		munmap(d->hdrs, (size_t)d->nhdrs * SLOT_BLOCK);
	d->hdrs = NULL;
}

/* The fixed buffer that holds [mem, mem + len), or -1. */
static int buf_index(const struct disk *d, const void *mem, uint32_t len)
{
	const uint8_t *m = mem;

	if (!d->fixed_bufs)
		return -1;
	if (m >= d->hdrs && m + len <= d->hdrs + (uint64_t)d->nhdrs * SLOT_BLOCK)
		return (int)d->hdr_buf;
	for (uint32_t a = 0; a < d->pool->narenas; a++) {
		const uint8_t *base = d->pool->arena[a].base;
		uint64_t off;

		if (m < base || m + len > base + d->pool->arena[a].size)
			continue;
		off = (uint64_t)(m - base);
		if (off / d->chunk_bytes != (off + len - 1) / d->chunk_bytes)
			return -1; /* a slot across a chunk boundary (slabs are n slots): plain I/O */
		return (int)(d->arena_buf0[a] + off / d->chunk_bytes);
	}
	return -1;
}

int disk_prep(struct disk *d, int write, uint32_t pi, uint64_t off, void *mem, uint32_t len,
	      uint64_t ud, unsigned flags)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
	int bi = buf_index(d, mem, len);

	if (!sqe)
		return -EBUSY;
	if (bi >= 0 && write)
		io_uring_prep_write_fixed(sqe, (int)pi, mem, len, off, bi);
	else if (bi >= 0)
		io_uring_prep_read_fixed(sqe, (int)pi, mem, len, off, bi);
	else if (write)
		io_uring_prep_write(sqe, (int)pi, mem, len, off);
	else
		io_uring_prep_read(sqe, (int)pi, mem, len, off);
	sqe->flags |= IOSQE_FIXED_FILE | (uint8_t)flags;
	io_uring_sqe_set_data64(sqe, ud);
	d->pending++;
	return 0;
}

uint32_t disk_space(struct disk *d)
{
	return io_uring_sq_space_left(&d->ring);
}

int disk_submit(struct disk *d)
{
	int n;

	if (!d->pending)
		return 0;
	n = io_uring_submit(&d->ring);
	if (n < 0 && n != -EAGAIN && n != -EBUSY && n != -EINTR)
		return n;
	d->pending = io_uring_sq_ready(&d->ring);
	return 0;
}

uint32_t disk_reap(struct disk *d, uint32_t max, int wait,
		   void (*fn)(void *arg, uint64_t ud, int32_t res), void *arg)
{
	struct io_uring_cqe *cqes[64], *cqe;
	uint32_t done = 0;

	if (wait && !io_uring_cq_ready(&d->ring) && io_uring_wait_cqe(&d->ring, &cqe) < 0)
		return 0;
	while (done < max) {
		unsigned n = io_uring_peek_batch_cqe(&d->ring, cqes,
						     max - done < 64 ? max - done : 64);

		if (!n)
			break;
		for (unsigned i = 0; i < n; i++)
			fn(arg, io_uring_cqe_get_data64(cqes[i]), cqes[i]->res);
		io_uring_cq_advance(&d->ring, n);
		done += n;
	}
	return done;
}

void disk_ack_event(struct disk *d)
{
	uint64_t v;

	if (read(d->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_debug("disk: eventfd read: %s", strerror(errno));
}
