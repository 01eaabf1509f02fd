// SPDX-License-Identifier: MIT
/*
 * buf.c - memory the broker may copy to and from: host buffers, the staging buffer, the GPU
 * registration seam, and views over registered buffers.
 *
 * A host buffer is a memfd sized to whole pages, sealed F_SEAL_SHRINK | F_SEAL_GROW |
 * F_SEAL_SEAL before it leaves the process (the broker refuses memfds that could shrink under
 * it and fault its copy threads), mapped read-write here and sent with BUF_REG. The fd is closed
 * once registered: the broker holds its own reference and our mapping holds ours. The list of
 * buffers answers kvb_put()/kvb_get()'s question "is [p, p+len) inside a registered buffer?";
 * a hit moves to the front, since an engine keeps hitting the same KV pool buffer. GPU buffers
 * (cuda.c) are on the same list, so kvb_put()/kvb_get() of a device pointer inside one is a
 * broker DMA; they are never mapped here, so never unmapped.
 *
 * A buffer registered by fd (kvb_buf_register_host_fd) is the caller's file, which the library
 * neither maps nor unmaps: it seals the fd on request, sends it with BUF_REG_FD and remembers
 * the caller's address of the range, if given, for the pointer lookup; without one the entry
 * only carries the id (addr NULL never matches a lookup). Where that address is checked to be
 * a shared writable mapping of the range of a file sealed against shrinking (maps_range), the
 * library's own reads through the pool directory copy into it as into a buffer of its own.
 *
 * Both kinds are faulted in here, at registration, by their owner: the broker's copies into a
 * fresh buffer used to fault every 4 KiB page on its copy thread (~2 us each, 80% of an eight
 * rank load phase), serialised with every other client's copies. A buffer of ours is advised
 * MADV_HUGEPAGE (2 MiB pages where the kernel gives shared memory THP) and populated; a
 * caller's file gets its blocks allocated (fallocate, KEEP_SIZE: no byte or size changes).
 * The broker maps the pages into its own tables off its loop thread (broker/bg.c).
 *
 * The staging buffer is an ordinary host buffer the library owns for kvb_put() from unregistered
 * memory; it is not in the list (the caller never sees its id) and only grows.
 *
 * All functions run with the client lock held (the kvb_* entry points take it).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "internal.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* The staging buffer grows in steps of this, so pages of similar sizes share one allocation. */
#define STAGING_STEP (1ull << 20)

static int page_round(size_t len, size_t *out)
{
	long pg = sysconf(_SC_PAGESIZE);
	size_t page = pg > 0 ? (size_t)pg : 4096;

	if (len == 0 || len > SIZE_MAX - page)
		return -EINVAL;
	*out = (len + page - 1) & ~(page - 1);
	return 0;
}

/*
 * Our own fresh buffer: huge pages where possible, every page allocated and mapped. Faulted in
 * here: a shared page is charged to the memory cgroup of whoever touches
 * it first, and that must be this process, not the broker's first GET into it. Also, a buffer
 * the machine cannot back fails now (-ENOMEM), not as a SIGBUS later.
 */
static int buf_prefault(int fd, void *p, size_t size)
{
	(void)madvise(p, size, MADV_HUGEPAGE); /* EINVAL where THP is compiled out */
	if (madvise(p, size, MADV_POPULATE_WRITE) == 0)
		return 0;
	if (errno != EINVAL) /* EINVAL: a kernel before 5.14 */
		return -ENOMEM;
	if (fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)size) < 0 && errno != EOPNOTSUPP)
		return -ENOMEM;
	for (size_t off = 0; off < size; off += 4096)
		((volatile uint8_t *)p)[off] = 0;
	return 0;
}

/* Allocates, seals, maps and registers a host buffer of at least len bytes into *b. */
int kvbc_buf_alloc_locked(struct kvb_client *c, size_t len, struct kvbc_buf *b)
{
	struct kvb_msg_buf_reg reg = {.kind = KVB_BUF_HOST};
	struct kvb_msg_id id;
	struct kvbc_reply r;
	size_t size;
	void *p;
	int fd, err;

	err = page_round(len, &size);
	if (err)
		return err;
	fd = memfd_create("kvb-host-buf", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return kvbc_errno();
	if (ftruncate(fd, (off_t)size) < 0) {
		err = kvbc_errno();
		goto err_close;
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		err = kvbc_errno();
		goto err_close;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		err = kvbc_errno();
		goto err_close;
	}
	err = buf_prefault(fd, p, size);
	if (err)
		goto err_unmap;
	reg.len = size;
	err = kvbc_ctl(c, KVB_MSG_BUF_REG, &reg, sizeof(reg), fd, &r);
	if (err < 0)
		goto err_unmap;
	err = kvbc_reply_body(&r, &id, sizeof(id));
	if (err)
		goto err_reply;
	kvbc_reply_free(&r);
	/* [RECONNECT] kept: a broker that comes back gets the same memory registered again. */
	b->fd = fd;
	b->addr = p;
	b->len = size;
	b->bid = id.id;
	b->id = kvbc_buf_cid(c, id.id);
	return 0;

err_reply:
	kvbc_reply_free(&r);
err_unmap:
	munmap(p, size);
err_close:
	close(fd);
	return err;
}

/* Tells the broker to forget a buffer; our mapping is the caller's to drop. */
static int buf_unreg_locked(struct kvb_client *c, uint32_t buf)
{
	struct kvb_msg_id msg = {.id = buf};
	struct kvbc_reply r;
	int err = kvbc_ctl(c, KVB_MSG_BUF_UNREG, &msg, sizeof(msg), -1, &r);

	if (err < 0)
		return err;
	kvbc_reply_free(&r);
	return 0;
}

struct kvbc_buf *kvbc_buf_find(struct kvb_client *c, const void *p, size_t len)
{
	uintptr_t a = (uintptr_t)p;

	for (struct kvbc_buf **pp = &c->bufs; *pp; pp = &(*pp)->next) {
		struct kvbc_buf *b = *pp;
		uintptr_t base = (uintptr_t)b->addr;

		if (!b->addr || a < base || len > b->len || a - base > b->len - len)
			continue;
		if (pp != &c->bufs) {
			*pp = b->next;
			b->next = c->bufs;
			c->bufs = b;
		}
		return b;
	}
	return NULL;
}

int kvbc_staging_locked(struct kvb_client *c, size_t len)
{
	struct kvbc_buf nb = {0}; /* gpu, foreign: 0 (a reconnect registers it again as host) */
	size_t want;
	int err;

	if (c->staging.addr && c->staging.len >= len)
		return 0;
	if (len > SIZE_MAX - STAGING_STEP)
		return -EINVAL;
	want = (len + STAGING_STEP - 1) & ~(size_t)(STAGING_STEP - 1);
	err = kvbc_buf_alloc_locked(c, want, &nb);
	if (err)
		return err;
	if (c->staging.addr) {
		/* Nothing is in flight from it: kvb_put() waits for its own completion. */
		(void)buf_unreg_locked(c, c->staging.bid);
		munmap(c->staging.addr, c->staging.len);
		close(c->staging.fd);
	}
	c->staging = nb;
	return 0;
}

void kvbc_buf_free_all(struct kvb_client *c)
{
	struct kvbc_buf *b = c->bufs;

	while (b) {
		struct kvbc_buf *next = b->next;

		if (!b->gpu && !b->foreign)
			munmap(b->addr, b->len);
		if (b->fd >= 0)
			close(b->fd);
		free(b);
		b = next;
	}
	c->bufs = NULL;
	if (c->staging.addr) {
		munmap(c->staging.addr, c->staging.len);
		close(c->staging.fd);
	}
	c->staging.addr = NULL;
}

void *kvb_buf_alloc_host(kvb_client *c, size_t len, uint32_t *buf)
{
	struct kvbc_buf *b;
	int err;

	if (!buf || !len) {
		errno = EINVAL;
		return NULL;
	}
	err = kvbc_enter(c);
	if (err)
		goto fail;
	b = calloc(1, sizeof(*b));
	err = b ? kvbc_buf_alloc_locked(c, len, b) : -ENOMEM;
	if (err) {
		free(b);
		kvbc_leave(c);
		goto fail;
	}
	b->next = c->bufs;
	c->bufs = b;
	*buf = b->id;
	kvbc_leave(c);
	return b->addr;
fail:
	errno = -err;
	return NULL;
}

/*
 * [vdir-fd] Whether [addr, addr + len) is, page for page, a shared writable mapping of fd's file
 * from offset on: each VMA of /proc/self/maps over the range names the file's device and
 * inode, has 'w' and 's', and its offset runs on from the last. The caller's word alone is not
 * enough: a private mapping (copy on write) or another file at addr would take bytes that the
 * broker's path writes into the file. Read without the client lock: a large process (CUDA,
 * PyTorch) has tens of thousands of mappings.
 */
static int maps_range(const void *addr, size_t len, int fd, uint64_t offset)
{
	uintptr_t at = (uintptr_t)addr, end = at + len;
	char *line = NULL;
	size_t cap = 0;
	struct stat st;
	FILE *f;

	if (!addr || fstat(fd, &st) < 0)
		return 0;
	f = fopen("/proc/self/maps", "re");
	if (!f)
		return 0;
	/* The lines come in address order: a hole or a VMA of anything else ends the walk. */
	while (at < end && getline(&line, &cap, f) > 0) {
		unsigned long long lo, hi, off, ino;
		unsigned int maj, min;
		char perm[5];

		if (sscanf(line, "%llx-%llx %4s %llx %x:%x %llu", &lo, &hi, perm, &off, &maj, &min,
			   &ino) != 7)
			break;
		if (hi <= at)
			continue;
		if (lo > at || perm[1] != 'w' || perm[3] != 's' || maj != major(st.st_dev) ||
		    min != minor(st.st_dev) || ino != st.st_ino ||
		    off + (at - lo) != offset + (at - (uintptr_t)addr))
			break;
		at = hi;
	}
	free(line);
	fclose(f);
	return at >= end;
}

/*
 * And the file can never shrink under that mapping: sealed F_SEAL_SHRINK (after any seal of
 * ours), holding the whole range. Then what the library copies into addr lands in the file
 * where the broker's copy through its own mapping would, and no truncation can fault it.
 */
static int sealed_over(int fd, uint64_t end)
{
	int seals = fcntl(fd, F_GET_SEALS);
	struct stat st;

	return seals >= 0 && (seals & F_SEAL_SHRINK) && fstat(fd, &st) == 0 && st.st_size >= 0 &&
	       (uint64_t)st.st_size >= end;
}

int kvb_buf_register_host_fd(kvb_client *c, int fd, uint64_t offset, size_t len, void *addr,
			     uint32_t flags, uint32_t *buf)
{
	struct kvb_msg_buf_reg_fd reg = {.off = offset, .len = len};
	struct kvb_msg_id id;
	struct kvbc_reply r;
	struct kvbc_buf *b;
	struct stat st;
	uint64_t end;
	int err, seals, mapped;

	if (!buf || !len || fd < 0 || (flags & ~(KVB_BUF_SEAL | KVB_BUF_FDCOPY)) ||
	    __builtin_add_overflow(offset, (uint64_t)len, &end) ||
	    (addr && (uintptr_t)addr > UINTPTR_MAX - len))
		return -EINVAL;
	mapped = maps_range(addr, len, fd, offset);
	err = kvbc_enter(c);
	if (err)
		return err;
	if (c->broker_minor < 2) {
		err = -EOPNOTSUPP;
		goto out;
	}
	/*
	 * Seal on request. A file that has no seals at all (a disk file: F_GET_SEALS fails) is
	 * left to the broker, which names what is wrong with it (-EMEDIUMTYPE). An unsealable
	 * file with KVB_BUF_FDCOPY goes to the broker unsealed: it copies with pread/pwrite.
	 */
	seals = fcntl(fd, F_GET_SEALS);
	if ((flags & KVB_BUF_SEAL) && seals >= 0 && !(seals & F_SEAL_SHRINK) &&
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0 &&
	    !(errno == EPERM && (flags & KVB_BUF_FDCOPY))) {
		/* EPERM: F_SEAL_SEAL is set (a memfd made without MFD_ALLOW_SEALING). */
		err = errno == EPERM ? -EPERM : kvbc_errno();
		goto out;
	}
	if (flags & KVB_BUF_FDCOPY)
		reg.flags = KVB_BUF_REG_FD_FDCOPY;
	b = calloc(1, sizeof(*b));
	if (!b) {
		err = -ENOMEM;
		goto out;
	}
	/*
	 * Its pages allocated now, by us (file comment), within its size only (past it they would
	 * be charged and never used); a file that cannot is left as it is.
	 */
	if (fstat(fd, &st) == 0 && st.st_size >= 0 && len <= (uint64_t)st.st_size &&
	    offset <= (uint64_t)st.st_size - len)
		(void)fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)offset, (off_t)len);
	err = kvbc_ctl(c, KVB_MSG_BUF_REG_FD, &reg, sizeof(reg), fd, &r);
	if (err < 0) {
		free(b);
		goto out;
	}
	err = kvbc_reply_body(&r, &id, sizeof(id));
	kvbc_reply_free(&r);
	if (err) {
		free(b);
		goto out;
	}
	b->addr = addr;
	b->len = len;
	b->bid = id.id;
	b->id = kvbc_buf_cid(c, id.id);
	b->foreign = 1;
	b->mapped = mapped && sealed_over(fd, end);
	b->off = offset;
	b->regflags = reg.flags;
	b->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3); /* [RECONNECT]; -1: not registered again */
	b->next = c->bufs;
	c->bufs = b;
	*buf = b->id;
out:
	kvbc_leave(c);
	return err;
}

int kvb_buf_unregister(kvb_client *c, uint32_t buf)
{
	struct kvbc_buf **pp, *b = NULL;
	int err;

	err = kvbc_enter(c);
	if (err)
		return err;
	for (pp = &c->bufs; *pp; pp = &(*pp)->next) {
		if ((*pp)->id == buf) {
			b = *pp;
			break;
		}
	}
	if (!b) {
		err = -EBADF; /* not one of the caller's (the staging buffer is not theirs either) */
		goto out;
	}
	err = b->bid == UINT32_MAX ? 0 : buf_unreg_locked(c, b->bid);
	if (err)
		goto out; /* still registered (e.g. a view uses it): keep the mapping */
	*pp = b->next;
	c->buf_gen++; /* [vdir] no view plan may name it */
	if (!b->gpu && !b->foreign)
		munmap(b->addr, b->len);
	if (b->fd >= 0)
		close(b->fd);
	free(b);
out:
	kvbc_leave(c);
	return err;
}

/*
 * Rewrites a VIEW_CREATE or VIEW_CREATE2 body built with the caller's namespace and buffer ids
 * into the broker's ids of this connection (they differ after a reconnect, conn.c).
 */
void kvbc_view_msg_bids(kvb_client *c, uint16_t type, void *m)
{
	if (type == KVB_MSG_VIEW_CREATE) {
		struct kvb_msg_view_create *h = m;
		struct kvb_view_part *p = (void *)(h + 1);

		h->ns = kvbc_ns_bid(c, h->ns);
		for (uint32_t i = 0; i < h->nparts; i++)
			p[i].buf = kvbc_buf_bid(c, p[i].buf);
	} else {
		struct kvb_msg_view_create2 *h = m;
		struct kvb_view_part2 *p = (void *)(h + 1);

		h->ns = kvbc_ns_bid(c, h->ns);
		for (uint32_t i = 0; i < h->nparts; i++)
			p[i].buf = kvbc_buf_bid(c, p[i].buf);
	}
}

/*
 * Sends a VIEW_CREATE(2) of the caller's ids (msg stays as it is: it is what a reconnect sends
 * again) with the current broker's namespace and buffer ids.
 */
static int view_send(struct kvb_client *c, uint16_t type, const void *msg, size_t len,
		     struct kvbc_reply *r)
{
	uint8_t *m = malloc(len);
	int err;

	if (!m)
		return -ENOMEM;
	memcpy(m, msg, len);
	kvbc_view_msg_bids(c, type, m);
	err = kvbc_ctl(c, type, m, len, -1, r);
	free(m);
	return err;
}

/*
 * Enters the client and finds the namespace a view of nparts parts is made over: one part per
 * (component, layer), component-major, or it cannot be a view of it. Returns 0 with the lock
 * held, else an error with it released.
 */
static int view_enter(struct kvb_client *c, uint32_t ns, size_t nparts, const struct kvbc_ns **n)
{
	int err = kvbc_enter(c);

	if (err)
		return err;
	*n = kvbc_ns_find(c, ns);
	err = !*n ? -EBADF : nparts != (*n)->nparts ? -EINVAL : 0;
	if (err)
		kvbc_leave(c);
	return err;
}

/*
 * Sends a VIEW_CREATE(2) of header hdr and the parts, lock held, and records the view (what a
 * reconnect sends again).
 */
static int view_create_locked(struct kvb_client *c, uint16_t type, const void *hdr, size_t hlen,
			      const void *parts, size_t plen, uint32_t *view)
{
	uint8_t *msg = malloc(hlen + plen);
	struct kvb_msg_id id;
	struct kvbc_reply r;
	int err;

	if (!msg)
		return -ENOMEM;
	memcpy(msg, hdr, hlen);
	memcpy(msg + hlen, parts, plen);
	err = view_send(c, type, msg, hlen + plen, &r);
	if (err >= 0) {
		err = kvbc_reply_body(&r, &id, sizeof(id));
		if (!err)
			err = kvbc_view_add(c, id.id, type, msg, (uint32_t)(hlen + plen), view);
		kvbc_reply_free(&r);
	}
	free(msg);
	return err;
}

int kvb_view_create(kvb_client *c, uint32_t ns, const struct kvb_view_part *parts, size_t nparts,
		    uint32_t *view)
{
	struct kvb_msg_view_create h = {.ns = ns, .nparts = (uint32_t)nparts};
	const struct kvbc_ns *n;
	int err;

	if (!parts || !view || nparts == 0 || nparts > KVB_MAX_VIEW_PARTS)
		return -EINVAL;
	err = view_enter(c, ns, nparts, &n);
	if (err)
		return err;
	err = view_create_locked(c, KVB_MSG_VIEW_CREATE, &h, sizeof(h), parts,
				 nparts * sizeof(*parts), view);
	kvbc_leave(c);
	return err;
}

/*
 * Sends VIEW_CREATE2 to an ABI 1.2 broker; an older one gets VIEW_CREATE when no part needs
 * a page stride of its own (0, or tokens_per_page * stride, which is what VIEW_CREATE means).
 */
int kvb_view_create2(kvb_client *c, uint32_t ns, const struct kvb_view_part2 *parts, size_t nparts,
		     uint32_t flags, uint32_t *view)
{
	struct kvb_msg_view_create2 h = {.ns = ns, .nparts = (uint32_t)nparts};
	const struct kvbc_ns *n;
	int err;

	if (!parts || !view || flags || nparts == 0 || nparts > KVB_MAX_VIEW_PARTS)
		return -EINVAL;
	for (size_t i = 0; i < nparts; i++)
		if (parts[i].flags || parts[i].resv)
			return -EINVAL;
	err = view_enter(c, ns, nparts, &n);
	if (err)
		return err;
	if (c->broker_minor < 2) {
		struct kvb_view_part *old = malloc(nparts * sizeof(*old));

		for (size_t i = 0; old && i < nparts; i++) {
			const struct kvb_view_part2 *p = &parts[i];

			if (p->page_stride && p->page_stride != (uint64_t)n->tpp * p->stride) {
				free(old);
				kvbc_leave(c);
				return -EOPNOTSUPP;
			}
			old[i] = (struct kvb_view_part){
				.buf = p->buf, .stride = p->stride, .base = p->base};
		}
		kvbc_leave(c);
		if (!old)
			return -ENOMEM;
		err = kvb_view_create(c, ns, old, nparts, view);
		free(old);
		return err;
	}
	err = view_create_locked(c, KVB_MSG_VIEW_CREATE2, &h, sizeof(h), parts,
				 nparts * sizeof(*parts), view);
	kvbc_leave(c);
	return err;
}

int kvb_view_destroy(kvb_client *c, uint32_t view)
{
	struct kvb_msg_id msg = {.id = view};
	struct kvbc_reply r;
	int err;

	err = kvbc_enter(c);
	if (err)
		return err;
	msg.id = kvbc_view_bid(c, view);
	err = kvbc_ctl(c, KVB_MSG_VIEW_DESTROY, &msg, sizeof(msg), -1, &r);
	if (err >= 0) {
		kvbc_reply_free(&r);
		kvbc_view_del(c, view);
		err = 0;
	}
	kvbc_leave(c);
	return err;
}
