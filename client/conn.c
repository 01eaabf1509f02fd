// SPDX-License-Identifier: MIT
/*
 * conn.c - attaching to and detaching from the broker: kvb_connect(), kvb_close(),
 * kvb_version(), kvb_socket_path(), and the entry checks every other public call goes through.
 *
 * kvb_connect() sends HELLO on a fresh SOCK_SEQPACKET socket and receives, with the reply, the
 * region memfd, the two doorbell eventfds and one read-only fd per pool arena (wire.h). The
 * region is mapped read-write and checked with kvb_region_check() before a single ring index is
 * trusted; each arena is mapped PROT_READ, so a client can never write the pool. The region and
 * arena fds are closed once mapped (the mappings keep the memory); the socket and eventfds stay
 * open for the life of the client. Nothing the broker sent is used before it is validated, and
 * every fd received is either kept or closed on every path.
 *
 * A broker that is starting (its lock file held, its socket not yet listening) makes
 * kvb_connect() return -EAGAIN at once rather than wait inside a library call: the caller
 * decides how long to retry.
 *
 * [RECONNECT] A broker that goes away (a crash, or a planned hand-over to a new broker, which
 * adopts the pool) makes the client fatal with -ECONNRESET. Unless KVB_CONNECT_NO_RECONNECT (or
 * KVB_RECONNECT=0 in the environment) said otherwise, the next call tries to attach again, at
 * most once per backoff step (1 ms doubling to 200 ms; a call in between fails at once with
 * -ECONNRESET, or waits up to kvb_opts.reconnect_ms trying): the same HELLO on the same
 * socket, then every namespace, host buffer and view is opened, registered and created again
 * from what was kept of it. The caller's ids stay valid: the library keeps the first broker's
 * ids as the caller's and translates them in every SQE and message (kvbc_sqe_ids). In-flight
 * async ops complete with -ECONNRESET first (kvb_reap delivers them) and the reconnect waits
 * until they are reaped. Leases of the old broker stay readable (its arena mappings are kept,
 * retired, until the last of its leases is released, which is then local). GPU buffers are exported
 * again from their device pointer and registered (cuda.c kvbc_gpu_again); one whose allocation
 * is gone, or that the new broker refuses, is lost alone: its ops fail -EBADF.
 *
 * kvb_close() needs no goodbye message: closing the socket is the hang-up by which the broker
 * reclaims this client's leases, buffers and views, exactly as when the process dies.
 *
 * Thread-safety: see internal.h; kvb_connect() builds the client before anyone else can see it.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

unsigned kvb_version(void)
{
	return (KVB_VERSION_MAJOR << 16) | (KVB_VERSION_MINOR << 8) | KVB_VERSION_PATCH;
}

static int reconnect_locked(struct kvb_client *c);

int kvbc_enter_ctl(struct kvb_client *c)
{
	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	if (c->fatal == -ECONNRESET && c->reconnect && !c->nreapers && !c->nasync)
		reconnect_locked(c);
	if (c->fatal) {
		int err = c->fatal;

		pthread_mutex_unlock(&c->lock);
		return err;
	}
	return 0;
}

int kvbc_enter(struct kvb_client *c)
{
	int err = kvbc_enter_ctl(c);

	if (err)
		return err;
	if (!c->region) {
		/* A KVB_CONNECT_CONTROL client has no rings, buffers or namespaces. */
		pthread_mutex_unlock(&c->lock);
		return -EOPNOTSUPP;
	}
	return 0;
}

int kvbc_enter_live(struct kvb_client *c)
{
	struct pollfd p;
	int err = kvbc_enter(c);

	if (err || !c->reconnect || c->nreapers || c->nasync ||
	    (kvb_load_acquire(c->sq.flags) & KVB_SQ_REVOKED))
		return err;
	/*
	 * [RECONNECT] Nothing in flight (nor done and not yet reaped): a broker that went since
	 * our last round trip (reads through the pool directory make none) is noticed before a
	 * batch is queued on a ring nobody reads, so that the batch goes to the broker we attach
	 * to now rather than failing whole. One poll() of the socket per batch that starts from
	 * idle, a batch served wholly from the directory included (a microsecond against the
	 * copies of its pages). Not for a session the broker ended (kvbctl drop): the call that
	 * finds that out fails, as any other.
	 */
	p = (struct pollfd){.fd = c->sock, .events = POLLIN};
	if (poll(&p, 1, 0) != 1 || !(p.revents & (POLLHUP | POLLERR)))
		return 0;
	kvbc_lost(c, -ECONNRESET);
	reconnect_locked(c);
	err = c->fatal;
	if (err)
		pthread_mutex_unlock(&c->lock);
	return err;
}

void kvbc_pool_revoke(struct kvb_client *c)
{
	if (!c->region || !c->sq.flags || !(kvb_load_acquire(c->sq.flags) & KVB_SQ_REVOKED))
		return;
	/* Same addresses, no access: a stale pointer faults, and nothing else is mapped there
	 * until kvb_close() unmaps them. The directory went with arena 0. */
	c->dir = NULL;
	for (uint32_t i = 0; i < c->narenas; i++)
		if (c->arenas[i].map)
			mmap((void *)(uintptr_t)c->arenas[i].map, c->arenas[i].size, PROT_NONE,
			     MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
}

static void arenas_unmap(const struct kvbc_arena *a, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		munmap((void *)(uintptr_t)a[i].map, a[i].size);
}

/* Releases whatever part of a client exists; the inverse of kvb_connect() at any stage. */
static void client_destroy(struct kvb_client *c)
{
	if (c->sock >= 0)
		close(c->sock); /* first: the broker starts reclaiming while we unmap */
	kvbc_buf_free_all(c);
	kvbc_ring_teardown(c);
	arenas_unmap(c->arenas, c->narenas);
	for (uint32_t i = 0; i < c->ngone; i++)
		arenas_unmap(c->gone[i].arenas, c->gone[i].narenas);
	free(c->gone);
	if (c->region)
		munmap(c->region, c->region_size);
	if (c->sq_efd >= 0)
		close(c->sq_efd);
	if (c->cq_efd >= 0)
		close(c->cq_efd);
	for (uint32_t i = 0; i < c->nviews; i++) {
		free(c->views[i].msg);
		kvbc_vplan_free(&c->views[i]);
	}
	free(c->views);
	free(c->held);
	free(c->old_ids);
	free(c->alias);
	free(c->ns);
	pthread_cond_destroy(&c->reaped);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

#define KVBC_CLOSE_DRAIN_MS 200

void kvb_close(kvb_client *c)
{
	uint64_t one = 1;

	if (!c)
		return;
	/*
	 * Wait for a call another thread is inside (taking the lock), then make the client fatal
	 * and wake every thread asleep in kvb_reap(): the poller through the doorbell it polls,
	 * the others through the condition variable. Each returns -ESHUTDOWN; the client is freed
	 * only after the last has left (each wait gives the lock up, so they can).
	 */
	pthread_mutex_lock(&c->lock);
	/* What was posted without a wait (a RELEASE, a [dir] read's GET) is counted before we go;
	 * a broker that does not answer delays the close by KVBC_CLOSE_DRAIN_MS at most. */
	if (!c->fatal && c->region)
		(void)kvbc_wait_discards_locked(c, KVBC_CLOSE_DRAIN_MS);
	c->fatal = -ESHUTDOWN;
	while (c->nreapers) {
		pthread_cond_broadcast(&c->reaped);
		if (c->cq_efd >= 0 && write(c->cq_efd, &one, sizeof(one)) < 0) {
			/* EAGAIN: the counter is already set, the poller is awake */
		}
		pthread_cond_wait(&c->reaped, &c->lock);
	}
	pthread_mutex_unlock(&c->lock);
	client_destroy(c);
}

static int check_opts(const struct kvb_opts *o, uint32_t *sq_entries)
{
	*sq_entries = KVB_SQ_DEFAULT;
	if (!o)
		return 0;
	if ((o->flags &
	     ~(KVB_CONNECT_CONTROL | KVB_CONNECT_NUMA_NODE | KVB_CONNECT_NO_RECONNECT)) ||
	    ((o->flags & KVB_CONNECT_NUMA_NODE) && o->numa_node < 0) ||
	    (!(o->flags & KVB_CONNECT_NUMA_NODE) && o->numa_node) ||
	    (o->gpu_busid && strlen(o->gpu_busid) >= KVB_BUSID_MAX))
		return -EINVAL;
	for (size_t i = 0; i < sizeof(o->resv) / sizeof(o->resv[0]); i++)
		if (o->resv[i])
			return -EINVAL;
	if (o->sq_entries) {
		if (!kvb_is_pow2(o->sq_entries) || o->sq_entries > KVB_SQ_MAX)
			return -EINVAL;
		*sq_entries = o->sq_entries < KVB_SQ_MIN ? KVB_SQ_MIN : o->sq_entries;
	}
	return 0;
}

/*
 * Is a broker starting on this socket? It holds a write lock on "<socket>.lock" from its first
 * moment and listens only once its pool is ready (main.c). F_OFD_GETLK only tests the lock:
 * probing can never make a starting broker think another one runs.
 */
static int broker_starting(const char *path)
{
	char lock[sizeof(((struct sockaddr_un *)0)->sun_path) + 8];
	struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
	int fd, held;

	snprintf(lock, sizeof(lock), "%s.lock", path);
	fd = open(lock, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	held = fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
	close(fd);
	return held;
}

static int open_socket(const char *path, int *out)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t n = strlen(path);
	int fd, err;

	if (n == 0)
		return -EINVAL;
	if (n >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, n + 1);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return kvbc_errno();
	while (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (errno == EINTR)
			continue;
		err = kvbc_errno();
		close(fd);
		if ((err == -ENOENT || err == -ECONNREFUSED) && broker_starting(path))
			err = -EAGAIN;
		return err;
	}
	*out = fd;
	return 0;
}

/* Maps an fd the broker sent, after checking that the file really holds size bytes. */
static int map_fd(int fd, uint64_t size, int prot, void **addr)
{
	struct stat st;
	void *p;

	if (size == 0 || size > SIZE_MAX)
		return -EPROTO;
	if (fstat(fd, &st) < 0)
		return kvbc_errno();
	/* A short file would turn our first access past its end into SIGBUS. */
	if (st.st_size < 0 || (uint64_t)st.st_size < size)
		return -EPROTO;
	p = mmap(NULL, (size_t)size, prot, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return kvbc_errno();
	*addr = p;
	return 0;
}

/*
 * [dir] The pool directory a broker of ABI 1.5 or later names in its HELLO reply: used only when
 * its header checks out (a damaged one costs nothing but the round trips it would have saved).
 */
static void attach_dir(struct kvb_client *c, const struct kvb_msg_hello_reply *hr)
{
	uint64_t bytes = (uint64_t)hr->dir_units * KVB_DIR_UNIT;
	const struct kvb_dir_hdr *h = c->arenas[0].map;
	const char *off = getenv("KVB_CLIENT_DIR"); /* "0": ask the broker for every page */

	c->dir = NULL;
	if (c->broker_minor < 5 || !bytes || bytes >= c->arenas[0].size ||
	    (off && !strcmp(off, "0")) || kvb_dir_check(h, bytes))
		return;
	c->dir_nbuckets = h->nbuckets;
	c->dir_epoch = kvb_load_acquire(&h->epoch);
	c->dir = h;
}

/* Takes the region, doorbells and arenas out of a HELLO reply (fds closed or kept in c). */
static int attach_rings(struct kvb_client *c, const struct kvb_msg_hello_reply *hr,
			struct kvbc_reply *r)
{
	struct kvb_region_hdr hdr;
	void *p = NULL;
	int err;

	if (hr->narenas == 0 || hr->narenas > KVB_MAX_ARENAS || r->nfds != 3 + (int)hr->narenas)
		return -EPROTO;
	c->sq_efd = r->fds[1];
	c->cq_efd = r->fds[2];
	r->fds[1] = r->fds[2] = -1;

	if (hr->region_size < sizeof(hdr))
		return -EPROTO;
	err = map_fd(r->fds[0], hr->region_size, PROT_READ | PROT_WRITE, &p);
	if (err)
		return err;
	c->region = p;
	c->region_size = (size_t)hr->region_size;
	/* One private copy: the broker could rewrite the shared header after we checked it. */
	memcpy(&hdr, c->region, sizeof(hdr));
	err = kvb_region_check(&hdr, c->region_size);
	if (err)
		return err;
	c->hdr = hdr;

	for (uint32_t i = 0; i < hr->narenas; i++) {
		err = map_fd(r->fds[3 + i], hr->arenas[i].size, PROT_READ, &p);
		if (err)
			return err;
		c->arenas[i].map = p;
		c->arenas[i].size = (size_t)hr->arenas[i].size;
		c->narenas = i + 1;
	}
	attach_dir(c, hr);
	return kvbc_ring_setup(c);
}

static uint64_t spin_ns_from_env(void)
{
	const char *s = getenv("KVB_CLIENT_SPIN_US");
	char *end;
	unsigned long long us;

	if (!s || !*s)
		return KVBC_SPIN_NS_DEFAULT;
	errno = 0;
	us = strtoull(s, &end, 10);
	if (errno || *end || us > 1000000)
		return KVBC_SPIN_NS_DEFAULT;
	return us * 1000;
}

/*
 * A page size in KiB from the environment, 0 meaning never (UINT64_MAX): KVB_CLIENT_GET_SELF_KB,
 * from which size kvb_get() into a buffer of ours copies the page itself, and
 * KVB_CLIENT_FILL_KB, from which size kvb_put() from plain memory is a filled PUT (ops.c).
 */
static uint64_t kb_from_env(const char *name, uint64_t dflt)
{
	const char *s = getenv(name);
	char *end;
	unsigned long long kb;

	if (!s || !*s)
		return dflt;
	errno = 0;
	kb = strtoull(s, &end, 10);
	if (errno || *end || kb > (1ull << 40))
		return dflt;
	return kb ? kb << 10 : UINT64_MAX;
}

/*
 * ops.c [fill-ring]: staging slots for small pages, twice the L2 (2 MiB where sysconf names
 * none); KVB_CLIENT_STAGE_RING_KB overrides it, 0 (or over 64 MiB): one slot.
 */
static size_t stage_ring_bytes(void)
{
	long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
	uint64_t r = kb_from_env("KVB_CLIENT_STAGE_RING_KB", l2 >= (256l << 10) && l2 <= (8l << 20)
								     ? 2 * (uint64_t)l2
								     : 2u << 20);

	return r > (64ull << 20) ? 0 : (size_t)r;
}

/* The reapers' condition variable runs on CLOCK_MONOTONIC, like every deadline here. */
static int cond_init(pthread_cond_t *cv)
{
	pthread_condattr_t a;
	int err = pthread_condattr_init(&a);

	if (err)
		return err;
	err = pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	if (!err)
		err = pthread_cond_init(cv, &a);
	pthread_condattr_destroy(&a);
	return err;
}

int kvb_socket_path(const char *path, char *buf, size_t len)
{
	if (!path)
		return kvb_default_socket(buf, len); /* [socket-rule] */
	if (strlen(path) >= len || strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
		return -ENAMETOOLONG;
	strcpy(buf, path);
	return 0;
}

int kvb_connect(const struct kvb_opts *opts, kvb_client **out)
{
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct kvb_msg_hello hello = {.abi_major = KVB_ABI_MAJOR, .abi_minor = KVB_ABI_MINOR};
	struct kvb_msg_hello_reply hr;
	struct kvbc_reply r;
	struct kvb_client *c;
	const char *name;
	uint32_t sq_entries;
	int err;

	if (!out)
		return -EINVAL;
	err = check_opts(opts, &sq_entries);
	if (err)
		return err;
	err = kvb_socket_path(opts ? opts->socket_path : NULL, path, sizeof(path));
	if (err)
		return err;

	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->sock = c->sq_efd = c->cq_efd = -1;
	c->staging.fd = -1;
	c->flags = opts ? opts->flags : 0;
	c->spin_ns = spin_ns_from_env();
	c->get_self_min = kb_from_env("KVB_CLIENT_GET_SELF_KB", KVBC_GET_SELF_DEFAULT);
	c->fill_min = kb_from_env("KVB_CLIENT_FILL_KB", KVBC_FILL_MIN_DEFAULT);
	c->stage_ring = stage_ring_bytes();
	/*
	 * [dir-few] Under four CPUs the broker's two copy workers share the CPUs with its loop and
	 * the clients: their split of a large page was no faster than one copy of ours, and every
	 * client's GETs queued on them. 1 MiB and Kimi GETs into a kvb_buf_alloc_host() buffer,
	 * AMD EPYC, 2 vCPUs, the workers' copy against ours: one process 13.3-16.6 against
	 * 13.5-17.4 GB/s, two 13.3-16.3 against 20.6-32.3, four (1 MiB) 14.3-15.3 against
	 * 23.6-28.1 (docs/benchmarks.md). KVB_CLIENT_GET_SELF_KB set: that rule alone.
	 */
	{
		const char *self = getenv("KVB_CLIENT_GET_SELF_KB");

		c->dir_get_big = (!self || !*self) && sysconf(_SC_NPROCESSORS_ONLN) < 4;
	}
	err = pthread_mutex_init(&c->lock, NULL);
	if (err) {
		free(c);
		return -err;
	}
	err = cond_init(&c->reaped);
	if (err) {
		pthread_mutex_destroy(&c->lock);
		free(c);
		return -err;
	}
	err = open_socket(path, &c->sock);
	if (err)
		goto err_destroy;

	name = opts && opts->name ? opts->name : program_invocation_short_name;
	memcpy(hello.name, name, strnlen(name, sizeof(hello.name) - 1));
	if (c->flags & KVB_CONNECT_CONTROL) {
		hello.flags = KVB_HELLOF_CONTROL;
	} else {
		hello.sq_entries = sq_entries;
		if (opts && (opts->gpu_busid || (opts->flags & KVB_CONNECT_NUMA_NODE))) {
			hello.flags = KVB_HELLOF_PLACE;
			hello.cpu_node = opts->flags & KVB_CONNECT_NUMA_NODE ? opts->numa_node : -1;
			if (opts->gpu_busid)
				strcpy(hello.gpu_busid, opts->gpu_busid); /* length checked */
		}
	}
	memcpy(c->path, path, sizeof(c->path));
	c->hello = hello;
	c->reconnect = !(c->flags & KVB_CONNECT_NO_RECONNECT);
	{
		const char *e = getenv("KVB_RECONNECT");

		if (e && !strcmp(e, "0"))
			c->reconnect = 0;
	}
	c->reconnect_ms = opts ? opts->reconnect_ms : 0;
	err = kvbc_ctl(c, KVB_MSG_HELLO, &hello, sizeof(hello), -1, &r);
	if (err < 0)
		goto err_destroy;
	err = kvbc_reply_body(&r, &hr, sizeof(hr));
	if (err)
		goto err_reply;
	if (hr.abi_major != KVB_ABI_MAJOR) {
		err = -EPROTO;
		goto err_reply;
	}
	c->client_id = hr.client_id;
	c->broker_minor = hr.abi_minor;
	if (c->flags & KVB_CONNECT_CONTROL)
		err = r.nfds ? -EPROTO : 0;
	else
		err = attach_rings(c, &hr, &r);
	if (err)
		goto err_reply;
	kvbc_reply_free(&r); /* closes the region and arena fds: the mappings remain */
	*out = c;
	return 0;

err_reply:
	kvbc_reply_free(&r);
err_destroy:
	client_destroy(c);
	return err;
}

/* ---- [RECONNECT] ---- */

uint32_t kvbc_ns_bid(const struct kvb_client *c, uint32_t id)
{
	const struct kvbc_ns *n = kvbc_ns_find(c, id);

	return n ? n->bid : id;
}

uint32_t kvbc_buf_bid(const struct kvb_client *c, uint32_t id)
{
	if (c->staging.addr && c->staging.id == id)
		return c->staging.bid;
	for (const struct kvbc_buf *b = c->bufs; b; b = b->next)
		if (b->id == id)
			return b->bid;
	return id;
}

uint32_t kvbc_view_bid(const struct kvb_client *c, uint32_t id)
{
	for (uint32_t i = 0; i < c->nviews; i++)
		if (c->views[i].id == id)
			return c->views[i].bid;
	return id;
}

uint32_t kvbc_ns_cid(const struct kvb_client *c, uint32_t bid)
{
	uint32_t id = bid;

	for (uint32_t i = 0; i < c->nns; i++)
		if (c->ns[i].bid == bid)
			return c->ns[i].id;
	while (kvbc_ns_find(c, id)) /* taken by a namespace of an earlier broker */
		id++;
	return id;
}

static int buf_id_used(const struct kvb_client *c, uint32_t id)
{
	if (c->staging.addr && c->staging.id == id)
		return 1;
	for (const struct kvbc_buf *b = c->bufs; b; b = b->next)
		if (b->id == id)
			return 1;
	return 0;
}

uint32_t kvbc_buf_cid(const struct kvb_client *c, uint32_t bid)
{
	uint32_t id = bid;

	while (c->reconnects && buf_id_used(c, id))
		id++;
	return id;
}

void kvbc_sqe_ids(const struct kvb_client *c, struct kvb_sqe *sqe)
{
	if (!c->reconnects)
		return; /* every id is still the broker's own */
	if (sqe->flags & KVB_OPF_VIEW) {
		sqe->buf = kvbc_view_bid(c, sqe->buf);
		return;
	}
	sqe->ns = kvbc_ns_bid(c, sqe->ns);
	/* A directory read's note (KVB_SQEF_GET) names no buffer: buf 0 is not a buffer id there. */
	if (sqe->opcode == KVB_OP_PUT ||
	    (sqe->opcode == KVB_OP_GET && !(sqe->flags & KVB_SQEF_GET)))
		sqe->buf = kvbc_buf_bid(c, sqe->buf);
}

int kvbc_view_add(struct kvb_client *c, uint32_t bid, uint16_t type, const void *msg, uint32_t len,
		  uint32_t *id)
{
	struct kvbc_view *v;
	uint32_t cid = bid;

	if (c->nviews == c->views_cap) {
		uint32_t cap = c->views_cap ? 2 * c->views_cap : 8;

		v = realloc(c->views, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		c->views = v;
		c->views_cap = cap;
	}
	for (int again = 1; again && c->reconnects;) {
		again = 0;
		for (uint32_t i = 0; i < c->nviews; i++)
			if (c->views[i].id == cid)
				again = 1;
		cid += again;
	}
	v = &c->views[c->nviews];
	v->msg = malloc(len);
	if (!v->msg)
		return -ENOMEM;
	memcpy(v->msg, msg, len);
	v->plan = NULL;
	v->id = cid;
	v->bid = bid;
	v->type = type;
	v->len = len;
	c->nviews++;
	*id = cid;
	return 0;
}

void kvbc_view_del(struct kvb_client *c, uint32_t id)
{
	for (uint32_t i = 0; i < c->nviews; i++) {
		if (c->views[i].id == id) {
			free(c->views[i].msg);
			kvbc_vplan_free(&c->views[i]);
			c->views[i] = c->views[--c->nviews];
			return;
		}
	}
}

/*
 * One lease of broker gen, which went, is released: its last one unmaps that broker's pool. A
 * lease whose broker could not be kept on record (out of memory at the detach) has gen 0.
 */
static void old_lease_gone(struct kvb_client *c, uint32_t gen, uint64_t id)
{
	for (uint32_t i = 0; i < c->nold_ids; i++) {
		if (c->old_ids[i].id == id && c->old_ids[i].gen == gen) {
			c->old_ids[i] = c->old_ids[--c->nold_ids];
			break;
		}
	}
	if (c->old_leases)
		c->old_leases--;
	if (c->leases)
		c->leases--;
	for (uint32_t i = 0; i < c->ngone; i++) {
		if (c->gone[i].gen == gen && !--c->gone[i].leases) {
			arenas_unmap(c->gone[i].arenas, c->gone[i].narenas);
			c->gone[i] = c->gone[--c->ngone];
			break;
		}
	}
	if (!c->old_leases)
		c->nold_ids = 0;
}

int kvbc_lease_retired(struct kvb_client *c, const void *data, uint64_t id)
{
	const char *p = data;

	for (uint32_t i = 0; i < c->ngone; i++) {
		for (uint32_t j = 0; j < c->gone[i].narenas; j++) {
			const char *m = c->gone[i].arenas[j].map;

			if (p >= m && p < m + c->gone[i].arenas[j].size) {
				old_lease_gone(c, c->gone[i].gen, id);
				return 1;
			}
		}
	}
	return 0;
}

int kvbc_old_release(struct kvb_client *c, uint64_t id)
{
	if (!c->old_leases || kvbc_lease_held(c, id))
		return 0; /* none, or the current broker's lease of that number */
	for (uint32_t i = 0; i < c->nold_ids; i++) {
		if (c->old_ids[i].id == id) {
			old_lease_gone(c, c->old_ids[i].gen, id);
			return 1;
		}
	}
	return 0;
}

/*
 * [RECONNECT] The ids of our leases that outlive their broker, so that an async RELEASE of one
 * is answered here (kvbc_old_release); kvb_release() finds them by their mapping first.
 */
static void old_ids_keep(struct kvb_client *c, uint32_t gen)
{
	uint32_t n = c->nheld + (uint32_t)__builtin_popcount(c->hz_used);
	struct kvbc_old_id *ids;

	if (!n)
		return;
	ids = realloc(c->old_ids, (size_t)(c->nold_ids + n) * sizeof(*ids));
	if (!ids)
		return; /* such a RELEASE then goes to the new broker: -EINVAL, mappings kept */
	c->old_ids = ids;
	for (uint32_t i = 0; i < c->nheld; i++)
		ids[c->nold_ids++] = (struct kvbc_old_id){c->held[i].id, gen};
	for (uint32_t i = 0; i < KVB_HZ_ENTRIES; i++)
		if (c->hz_used & (1u << i))
			ids[c->nold_ids++] = (struct kvbc_old_id){c->hz_id[i], gen};
}

/*
 * The broker that went: its arena maps are kept, with the ids of its leases, while a lease it
 * granted is held (until the last of them is released), and unmapped otherwise. An attempt that
 * failed after attach_rings() granted none: keeping its maps would leave one set per retry.
 */
static void retire_broker(struct kvb_client *c)
{
	uint32_t held = c->leases > c->old_leases ? c->leases - c->old_leases : 0;
	uint32_t gen = ++c->gone_seq ? c->gone_seq : ++c->gone_seq; /* 0: not on record */
	struct kvbc_gone *g;

	if (!held) {
		arenas_unmap(c->arenas, c->narenas);
		return;
	}
	g = realloc(c->gone, (size_t)(c->ngone + 1) * sizeof(*g));
	if (!g) {
		old_ids_keep(c, 0); /* out of memory: mapped for good, never pulled from a reader */
		return;
	}
	c->gone = g;
	g += c->ngone++;
	memcpy(g->arenas, c->arenas, c->narenas * sizeof(*g->arenas));
	g->narenas = c->narenas;
	g->leases = held;
	g->gen = gen;
	old_ids_keep(c, gen);
}

/*
 * [retire] The bytes at [a, e) become memory of our own with the same contents, in one step
 * (mremap over them), so a reader on another thread sees the same bytes throughout. 0 or -errno
 * (then they stay the pool's).
 */
static int privatize_range(uintptr_t a, uintptr_t e)
{
	size_t n = e - a;
	void *copy = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int err;

	if (copy == MAP_FAILED)
		return -errno;
	memcpy(copy, (const void *)a, n);
	if (mprotect(copy, n, PROT_READ) == 0 &&
	    mremap(copy, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)a) != MAP_FAILED)
		return 0;
	err = -errno;
	munmap(copy, n);
	return err;
}

/*
 * [retire] One lease's page: its 4 KiB pages (every slot is 4 KiB-aligned), or the huge pages
 * around it where the pool map is of huge pages (mremap refuses part of one).
 */
static int privatize(const void *data, uint64_t len)
{
	static const uintptr_t align[] = {4096, 2u << 20};
	int err = -EINVAL;

	for (size_t i = 0; i < sizeof(align) / sizeof(align[0]) && err == -EINVAL; i++) {
		uintptr_t a = (uintptr_t)data & ~(align[i] - 1);
		uintptr_t e = ((uintptr_t)data + len + align[i] - 1) & ~(align[i] - 1);

		err = privatize_range(a, e);
	}
	return err;
}

/*
 * [retire] The broker went, and the pool may be adopted by the next one (broker/orphan.c),
 * which reuses what nobody leases: every lease we hold of it gets memory of its own first, so
 * that it reads what it leased whatever the pool holds next; then the old region's
 * KVB_REGION_RETIRED word says so, and the next broker lets go of the pages it held for us.
 * A lease that cannot be copied leaves the word alone: its page stays held until we exit.
 */
static void retire_leases(struct kvb_client *c)
{
	int ok = 1;

	/* A session the broker ended (kvbctl drop): its pool map is PROT_NONE, its leases void. */
	if (c->sq.flags && (kvb_load_acquire(c->sq.flags) & KVB_SQ_REVOKED))
		return;

	for (uint32_t i = 0; i < c->nheld; i++)
		if (c->held[i].data && privatize(c->held[i].data, c->held[i].len))
			ok = 0;
	for (uint32_t i = 0; c->hz && i < KVB_HZ_ENTRIES; i++) {
		uint64_t v;
		const void *data;

		if (!(c->hz_used & (1u << i)))
			continue;
		v = kvb_load64_relaxed(&c->hz[i]);
		if (!(v & 1) || kvbc_lease_map(c, v & ~1ull, c->hz_len[i], &data) ||
		    privatize(data, c->hz_len[i]))
			ok = 0;
	}
	if (ok && c->region && c->region_size >= KVB_REGION_RETIRED + sizeof(uint32_t))
		kvb_store_release(
			(kvb_atomic_u32 *)(void *)((char *)c->region + KVB_REGION_RETIRED),
			KVB_RETIRED_MAGIC);
}

/* Drops what ties us to the broker that went: socket, doorbells, rings, arena maps. */
static void detach_locked(struct kvb_client *c)
{
	int cfd_on = c->cfd_on;

	if (c->region)
		retire_leases(c); /* [retire] before the region goes */

	if (c->sock >= 0)
		close(c->sock);
	if (c->sq_efd >= 0)
		close(c->sq_efd);
	if (c->cq_efd >= 0)
		close(c->cq_efd);
	c->sock = c->sq_efd = c->cq_efd = -1;
	c->cfd_on = 0; /* the completion fd survives: the caller may be polling it */
	kvbc_ring_teardown(c);
	c->cfd_on = cfd_on;
	c->doneq_head = c->doneq_tail = 0;
	c->nasync = 0;
	if (c->region)
		munmap(c->region, c->region_size);
	c->region = NULL;
	retire_broker(c);
	c->old_leases = c->leases;
	c->nheld = 0;  /* [release-post] they are retired now: kvbc_lease_retired() */
	c->nalias = 0; /* [lease-alias] the ids they stood for went with the broker */
	/*
	 * [hazard] The table was in the region: its leases are retired too, and a failed attempt
	 * that detaches again must not keep their ids twice, nor count their bytes against the
	 * next broker's budget.
	 */
	c->hz = NULL;
	c->hz_count = NULL;
	c->hz_used = c->hz_n = 0;
	c->hz_held = 0;
	c->narenas = 0;
	c->dir = NULL;
}

/* Sends one control request and takes the id of its reply; -errno. */
static int ctl_id(struct kvb_client *c, uint16_t type, const void *msg, size_t len, int fd,
		  uint32_t *id)
{
	struct kvb_msg_id rid;
	struct kvbc_reply r;
	int err = kvbc_ctl(c, type, msg, len, fd, &r);

	if (err < 0)
		return err;
	err = kvbc_reply_body(&r, &rid, sizeof(rid));
	kvbc_reply_free(&r);
	if (!err)
		*id = rid.id;
	return err;
}

static int buf_again(struct kvb_client *c, struct kvbc_buf *b)
{
	if (b->gpu)
		return kvbc_gpu_again(c, b);
	if (b->fd < 0) {
		b->bid = UINT32_MAX; /* gone: the broker answers -EBADF */
		return 0;
	}
	if (!b->foreign) {
		struct kvb_msg_buf_reg reg = {.kind = KVB_BUF_HOST, .len = b->len};

		return ctl_id(c, KVB_MSG_BUF_REG, &reg, sizeof(reg), b->fd, &b->bid);
	}
	{
		struct kvb_msg_buf_reg_fd reg = {
			.off = b->off, .len = b->len, .flags = b->regflags};

		return ctl_id(c, KVB_MSG_BUF_REG_FD, &reg, sizeof(reg), b->fd, &b->bid);
	}
}

/* A view's message with the current broker's namespace and buffer ids. */
static int view_again(struct kvb_client *c, struct kvbc_view *v)
{
	uint8_t *m = malloc(v->len);
	int err;

	if (!m)
		return -ENOMEM;
	memcpy(m, v->msg, v->len);
	kvbc_view_msg_bids(c, v->type, m);
	err = ctl_id(c, v->type, m, v->len, -1, &v->bid);
	free(m);
	if (err && !kvbc_transport_err(err)) {
		v->bid = UINT32_MAX; /* over a buffer that was lost: its ops fail -EBADF */
		err = 0;
	}
	return err;
}

/* One attempt: 0 attached again, else -ECONNRESET (and the next attempt is scheduled). */
static int attempt_locked(struct kvb_client *c)
{
	struct kvb_msg_hello_reply hr;
	struct kvbc_reply r;
	int err;

	detach_locked(c);
	err = open_socket(c->path, &c->sock);
	if (err)
		goto fail;
	c->fatal = 0; /* kvbc_ctl refuses a fatal client */
	err = kvbc_ctl(c, KVB_MSG_HELLO, &c->hello, sizeof(c->hello), -1, &r);
	if (err < 0)
		goto fail;
	err = kvbc_reply_body(&r, &hr, sizeof(hr));
	if (!err && hr.abi_major != KVB_ABI_MAJOR)
		err = -EPROTO;
	if (!err) {
		c->client_id = hr.client_id;
		c->broker_minor = hr.abi_minor;
		err = c->flags & KVB_CONNECT_CONTROL ? (r.nfds ? -EPROTO : 0)
						     : attach_rings(c, &hr, &r);
	}
	kvbc_reply_free(&r);
	if (err)
		goto fail;
	for (uint32_t i = 0; i < c->nns && !err; i++) {
		struct kvb_msg_ns_reply rep;

		err = kvbc_ctl(c, KVB_MSG_NS_OPEN, c->ns[i].msg, c->ns[i].mlen, -1, &r);
		if (err >= 0) {
			err = kvbc_reply_body(&r, &rep, sizeof(rep));
			kvbc_reply_free(&r);
			if (!err && rep.page_bytes != c->ns[i].page_bytes)
				err = -EPROTO;
			if (!err)
				c->ns[i].bid = rep.ns;
		}
	}
	if (!err && c->staging.addr)
		err = buf_again(c, &c->staging);
	for (struct kvbc_buf *b = c->bufs; b && !err; b = b->next)
		err = buf_again(c, b);
	for (uint32_t i = 0; i < c->nviews && !err; i++)
		err = view_again(c, &c->views[i]);
	if (err)
		goto fail;
	if (c->cfd_on) {
		struct epoll_event ev = {.events = EPOLLIN};

		(void)epoll_ctl(c->cfd, EPOLL_CTL_ADD, c->cq_efd, &ev);
		kvb_flag_set(c->cq.flags, KVB_CQ_NEED_WAKEUP);
	}
	c->reconnects++;
	c->backoff_ns = 0;
	return 0;
fail:
	c->fatal = -ECONNRESET;
	c->backoff_ns = c->backoff_ns ? c->backoff_ns * 2 : 1000000;
	if (c->backoff_ns > 200000000ull)
		c->backoff_ns = 200000000ull;
	c->retry_at = clock_ns() + c->backoff_ns;
	return -ECONNRESET;
}

static int reconnect_locked(struct kvb_client *c)
{
	uint64_t now = clock_ns(), deadline = now + (uint64_t)c->reconnect_ms * 1000000ull;

	for (;;) {
		if (now >= c->retry_at && !attempt_locked(c))
			return 0;
		now = clock_ns();
		if (now >= deadline)
			return -ECONNRESET; /* fail fast: the caller asked not to wait longer */
		{
			uint64_t until = c->retry_at < deadline ? c->retry_at : deadline;
			struct timespec ts = {.tv_sec = 0, .tv_nsec = 0};

			if (until > now) {
				ts.tv_sec = (time_t)((until - now) / 1000000000ull);
				ts.tv_nsec = (long)((until - now) % 1000000000ull);
			}
			/* Waiting with the lock held: every call on this client would wait too. */
			nanosleep(&ts, NULL);
		}
		now = clock_ns();
	}
}
