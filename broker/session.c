// SPDX-License-Identifier: MIT
/*
 * session.c - one attached client: admission, the control channel, its rings, and teardown.
 *
 * States:
 *
 *   accepted --SO_PEERCRED ok--> awaiting HELLO --HELLO ok--> ring client | control client
 *       |                            |                               |
 *       +--refused (closed, no fd)   +--bad version/msg: closed      +--hang-up, protocol
 *                                                                       violation, SIGTERM:
 *                                                                       session_destroy()
 *
 * The peer's identity is the kernel's (SO_PEERCRED at accept), never a message field. Its
 * process is pinned by a pidfd taken at accept (peer.c [pidfd]), which sits in the epoll set:
 * the connecting process's exit ends the session even when a child it forked still holds the
 * socket, and a recycled pid can never be mistaken for the client. Anything
 * the client controls (messages, fds, ring indices, SQE bytes) is validated before use, and a
 * violation that makes the channel untrustworthy (a malformed datagram, an impossible ring
 * index) ends only this session, with the reason logged. Teardown releases, from broker-private
 * bookkeeping alone, every lease, buffer mapping, view and fd the session held.
 *
 * Loop thread only.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "broker.h"
#include "copy_cuda.h"
#include "log.h"
#include "proto.h"

static int ep_add(struct broker *b, int fd, struct session *s, unsigned tag)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)(uintptr_t)s | tag};

	return epoll_ctl(b->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

/* May this peer attach? Same uid, root, or a member of the group named at start-up. */
static int peer_allowed(const struct broker *b, int fd, const struct ucred *cr)
{
	gid_t groups[256];
	socklen_t len = sizeof(groups);

	if (cr->uid == geteuid() || cr->uid == 0)
		return 1;
	if (!b->cfg.has_group)
		return 0;
	if (cr->gid == b->cfg.group)
		return 1;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
		return 0;
	for (size_t i = 0; i < len / sizeof(gid_t); i++)
		if (groups[i] == b->cfg.group)
			return 1;
	return 0;
}

int session_accept(struct broker *b)
{
	const char *how = NULL;
	struct ucred cr = {0};
	socklen_t len = sizeof(cr);
	struct session *s;
	int fd, err;

	fd = accept4(b->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd < 0 && (errno == EMFILE || errno == ENFILE) && b->spare_fd >= 0) {
		/*
		 * Out of fds: the pending connection would keep the level-triggered listening
		 * socket readable and the loop spinning. Use the spare fd to take it and close it.
		 */
		close(b->spare_fd);
		fd = accept4(b->listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (fd >= 0)
			close(fd);
		b->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		log_warn("refused a connection: out of file descriptors");
		b->ctr.refused++;
		return fd >= 0 ? 1 : 0;
	}
	if (fd < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -errno;
	/* Refused peers still count as progress for the caller's accept loop. */
	if (b->nconns >= b->cfg.max_clients + CONN_SPARE) {
		log_warn("refused a connection: %u connections open", b->nconns);
		b->ctr.refused++;
		close(fd);
		return 1;
	}
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0 || !peer_allowed(b, fd, &cr)) {
		log_warn("refused connection from pid %d uid %d: not the broker's uid or group",
			 (int)cr.pid, (int)cr.uid);
		b->ctr.refused++;
		close(fd);
		return 1;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		close(fd);
		return -ENOMEM;
	}
	s->sock = fd;
	s->pid = cr.pid;
	s->uid = cr.uid;
	s->gid = cr.gid;
	s->id = ++b->next_id;
	s->accepted_at = now_sec();
	s->region_fd = s->sq_efd = s->cq_efd = -1;
	s->node = -1;
	s->pidfd = peer_pidfd(fd, cr.pid, &how);
	list_init(&s->link);
	err = ep_add(b, fd, s, TAG_SOCK);
	if (!err && s->pidfd >= 0)
		err = ep_add(b, s->pidfd, s, TAG_PID);
	if (err) {
		if (s->pidfd >= 0)
			close(s->pidfd);
		close(fd);
		free(s);
		return err;
	}
	list_add_tail(&b->sessions, &s->link);
	b->nconns++;
	log_debug("client %u: connected, pid %d uid %d, pidfd %s", s->id, (int)s->pid, (int)s->uid,
		  s->pidfd >= 0 ? how : "none");
	return 1;
}

void session_destroy(struct broker *b, struct session *s, const char *why)
{
	if (why)
		log_info("client %u (%s, pid %d): disconnected: %s (released %u leases)", s->id,
			 s->name[0] ? s->name : "?", (int)s->pid, why, s->nleases);
	ops_release_all(b, s);
	if (s->region)
		munmap(s->region, s->region_size);
	s->region = NULL;
	if (s->sq_efd >= 0) {
		/*
		 * The client holds a dup of this eventfd, so closing ours would not take it out of
		 * the epoll set: a later doorbell would name a freed session. Remove it first.
		 */
		epoll_ctl(b->epfd, EPOLL_CTL_DEL, s->sq_efd, NULL);
		close(s->sq_efd);
	}
	if (s->cq_efd >= 0)
		close(s->cq_efd);
	if (s->pidfd >= 0)
		close(s->pidfd); /* ours alone: closing it leaves the epoll set */
	close(s->sock);		 /* also leaves the epoll set */
	list_del(&s->link);
	if (s->hello_done && !s->control_only)
		b->nsessions--;
	b->nconns--;
	b->ctr.disconnects++;
	/*
	 * Events for it may still sit in the current epoll batch: free after the batch. Ops in
	 * flight may still be copying to or from its buffers: those stay mapped until the last
	 * one completed (session_complete), so a dead client's memory is never touched after
	 * it was unmapped and never unmapped under a copy.
	 */
	s->dead = 1;
	list_add_tail(&b->graveyard, &s->link);
}

/* Unmaps a host buffer, or closes a GPU buffer's handle (copy_cuda.c); no op may use it. */
static void buf_release(struct broker *b, struct session *s, struct sbuf *sb)
{
	if (sb->fdb) {
		fdcopy_buf_close(sb);
		s->buf_bytes -= sb->len;
		s->nfdbufs--;
	} else if (sb->dev == COPY_HOST) {
		munmap((uint8_t *)sb->base - sb->lead, sb->lead + sb->len);
		s->buf_bytes -= sb->lead + sb->len;
	} else {
		gpu_map_put(b->gpu, sb->gm);
	}
	*sb = (struct sbuf){0};
}

/* The last of a dead session: what in-flight ops may still have been using. */
static void session_free(struct broker *b, struct session *s)
{
	for (uint32_t i = 0; i < SESSION_MAX_BUFS; i++)
		if (s->bufs[i].base)
			buf_release(b, s, &s->bufs[i]);
	for (uint32_t i = 0; i < SESSION_MAX_VIEWS; i++)
		free(s->views[i]);
	free(s);
}

/* Wakes a client sleeping on its CQ (ring.h NEED_WAKEUP protocol). */
static void cq_doorbell(struct session *s)
{
	uint64_t one = 1;

	if (kvb_ring_needs_wakeup(&s->cq, KVB_CQ_NEED_WAKEUP) &&
	    write(s->cq_efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_warn("client %u: cq doorbell: %s", s->id, strerror(errno));
}

void session_expire(struct broker *b, double now)
{
	struct list *pos, *tmp;

	list_for_each_safe (pos, tmp, &b->sessions) {
		struct session *s = list_entry(pos, struct session, link);

		if (!s->hello_done && now - s->accepted_at > SESSION_HELLO_TIMEOUT) {
			b->ctr.protocol_errors++;
			session_destroy(b, s, "no HELLO in time");
		}
	}
}

void session_reap(struct broker *b)
{
	struct list *pos, *tmp;

	list_for_each_safe (pos, tmp, &b->graveyard) {
		struct session *s = list_entry(pos, struct session, link);

		if (s->inflight)
			continue;
		list_del(pos);
		session_free(b, s);
	}
}

void session_complete(struct broker *b, struct session *s, const struct kvb_cqe *cqe)
{
	s->inflight--;
	if (s->dead)
		return; /* its ring is gone; session_reap frees it once nothing is in flight */
	/* Buffers unregistered while copies were in flight go once the last op completed. */
	for (uint32_t i = 0; !s->inflight && s->nclosing && i < SESSION_MAX_BUFS; i++) {
		if (s->bufs[i].closing) {
			buf_release(b, s, &s->bufs[i]);
			s->nclosing--;
		}
	}
	/* session_poll reserved this CQ slot when it consumed the SQE. */
	memcpy(kvb_ring_prod_slot(&s->cq, 0), cqe, sizeof(*cqe));
	kvb_ring_publish(&s->cq, 1);
	cq_doorbell(s);
}

/* Sends a reply datagram with optional body and fds. */
static int reply(struct session *s, const struct kvb_msg_hdr *req, int32_t res, const void *body,
		 size_t blen, const int *fds, uint32_t nfds)
{
	struct kvb_msg_hdr h = {KVB_MSG_MAGIC, req->type, KVB_MSGF_REPLY, 0, req->seq};
	struct kvb_msg_reply r = {res, 0};
	struct iovec iov[3] = {{&h, sizeof(h)}, {&r, sizeof(r)}, {NULL, blen}};
	union {
		char buf[CMSG_SPACE(sizeof(int) * KVB_MAX_FDS)];
		struct cmsghdr align;
	} cm;
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = blen ? 3 : 2};

	/* sendmsg never writes through iov_base; the const is shed without a cast. */
	memcpy(&iov[2].iov_base, &body, sizeof(body));
	h.len = (uint32_t)(sizeof(h) + sizeof(r) + blen);
	if (nfds) {
		struct cmsghdr *c;

		mh.msg_control = cm.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	if (sendmsg(s->sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
		return -errno;
	return 0;
}

/* Creates the ring region memfd, sealed so that the client can neither shrink nor grow it. */
static int region_create(struct broker *b, struct session *s, uint32_t sq_entries)
{
	struct kvb_region_hdr h;
	int64_t size = kvb_region_layout(sq_entries, b->cfg.arg_size, &h);
	uint8_t *r;
	int fd;

	if (size < 0)
		return (int)size;
	fd = memfd_create("kvbroker-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, size) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		goto err_close;
	r = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (r == MAP_FAILED)
		goto err_close;
	memcpy(r, &h, sizeof(h));
	s->region = r;
	s->region_size = (uint64_t)size;
	s->region_fd = fd;
	s->arg = r + h.arg_off;
	s->arg_size = h.arg_size;
	kvb_ring_init(&s->sq, (kvb_atomic_u32 *)(r + h.sq_head_off),
		      (kvb_atomic_u32 *)(r + h.sq_tail_off), (kvb_atomic_u32 *)(r + h.sq_flags_off),
		      r + h.sqes_off, h.sq_entries, sizeof(struct kvb_sqe), 0);
	kvb_ring_init(&s->cq, (kvb_atomic_u32 *)(r + h.cq_head_off),
		      (kvb_atomic_u32 *)(r + h.cq_tail_off), (kvb_atomic_u32 *)(r + h.cq_flags_off),
		      r + h.cqes_off, h.cq_entries, sizeof(struct kvb_cqe), 1);
	return 0;

err_close:
	close(fd);
	return -errno;
}

/*
 * KVB_HELLOF_PLACE: the arena order for this client's new pages, nearest to its GPU (whose
 * node sysfs knows) or else to the CPU node it declared. -EINVAL for malformed fields.
 */
static int hello_place(struct broker *b, struct session *s, const struct kvb_msg_hello *m,
		       size_t blen)
{
	int arena_node[KVB_MAX_ARENAS], node = m->cpu_node;

	if (blen < sizeof(*m) || m->resv2 || m->cpu_node < -1 ||
	    !memchr(m->gpu_busid, '\0', sizeof(m->gpu_busid)))
		return -EINVAL;
	if (m->gpu_busid[0]) {
		int g = numa_pci_node(NULL, m->gpu_busid);

		if (g == -EINVAL)
			return -EINVAL;
		if (g >= 0)
			node = g;
		memcpy(s->gpu, m->gpu_busid, sizeof(s->gpu));
	}
	s->node = node;
	for (uint32_t i = 0; i < b->pool.narenas; i++)
		arena_node[i] = b->pool.arena[i].node;
	numa_order(arena_node, b->pool.narenas, node, s->pref.arena);
	s->pref.n = b->pool.narenas;
	return 0;
}

static int on_hello(struct broker *b, struct session *s, const struct kvb_msg_hdr *h,
		    const struct kvb_msg_hello *m, size_t blen)
{
	struct kvb_msg_hello_reply rep = {0};
	int fds[3 + KVB_MAX_ARENAS], nfds = 0, err;
	uint32_t sq = m->sq_entries ? m->sq_entries : KVB_SQ_DEFAULT;

	/* --max-sq-entries: a larger (valid) ask is clamped; the client reads the header. */
	if (kvb_is_pow2(sq) && sq > b->cfg.max_sq)
		sq = b->cfg.max_sq;

	if (s->hello_done)
		return -EPROTO;
	if (m->abi_major != KVB_ABI_MAJOR) {
		log_warn("client %u: protocol ABI %u.%u, this broker speaks %u.%u", s->id,
			 m->abi_major, m->abi_minor, KVB_ABI_MAJOR, KVB_ABI_MINOR);
		reply(s, h, -EPROTO, NULL, 0, NULL, 0);
		return -EPROTO;
	}
	if ((m->flags & ~(KVB_HELLOF_CONTROL | KVB_HELLOF_PLACE)) || m->resv ||
	    ((m->flags & KVB_HELLOF_PLACE) && hello_place(b, s, m, blen))) {
		reply(s, h, -EINVAL, NULL, 0, NULL, 0);
		return -EPROTO;
	}
	memcpy(s->name, m->name, sizeof(s->name));
	s->name[sizeof(s->name) - 1] = '\0';
	/* The name goes into log lines: no control bytes, so a client cannot forge a line. */
	for (char *p = s->name; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	rep.abi_major = KVB_ABI_MAJOR;
	rep.abi_minor = KVB_ABI_MINOR;
	rep.client_id = s->id;
	if (m->flags & KVB_HELLOF_CONTROL) {
		s->control_only = 1;
		s->hello_done = 1;
		return reply(s, h, 0, &rep, sizeof(rep), NULL, 0) ? -EPROTO : 0;
	}
	if (b->nsessions >= b->cfg.max_clients) {
		log_warn("client %u: refused: %u clients attached (--max-clients)", s->id,
			 b->nsessions);
		reply(s, h, -EUSERS, NULL, 0, NULL, 0);
		return -EUSERS;
	}
	err = region_create(b, s, sq);
	if (err) {
		reply(s, h, err, NULL, 0, NULL, 0);
		return err == -EINVAL ? -EPROTO : err;
	}
	s->sq_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	s->cq_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->sq_efd < 0 || s->cq_efd < 0 || ep_add(b, s->sq_efd, s, TAG_SQ)) {
		err = -ENOMEM;
		goto out;
	}
	fds[nfds++] = s->region_fd;
	fds[nfds++] = s->sq_efd;
	fds[nfds++] = s->cq_efd;
	rep.region_size = s->region_size;
	rep.narenas = b->pool.narenas;
	for (uint32_t i = 0; i < b->pool.narenas; i++) {
		rep.arenas[i].size = b->pool.arena[i].size;
		rep.arenas[i].node = b->pool.arena[i].node;
		fds[nfds] = pool_ro_fd(&b->pool, i);
		if (fds[nfds] < 0) {
			err = fds[nfds];
			goto out;
		}
		nfds++;
	}
	err = reply(s, h, 0, &rep, sizeof(rep), fds, (uint32_t)nfds);
	if (!err) {
		s->hello_done = 1;
		b->nsessions++;
		log_info("client %u: attached '%s' pid %d uid %d, sq %u entries, node %d%s%s",
			 s->id, s->name, (int)s->pid, (int)s->uid, sq, s->node,
			 s->gpu[0] ? ", gpu " : "", s->gpu);
	}
out:
	for (int i = 3; i < nfds; i++)
		close(fds[i]);
	/* The mapping and the client's copy keep the region alive. */
	close(s->region_fd);
	s->region_fd = -1;
	if (err)
		reply(s, h, err, NULL, 0, NULL, 0);
	return err;
}

static int on_ns_open(struct broker *b, struct session *s, const struct kvb_msg_hdr *h,
		      const struct kvb_layout *l, const struct kvb_ns_ident *id)
{
	struct kvb_msg_ns_reply rep = {0};
	struct ns *n;
	int err = ns_open2(&b->nst, &b->store, l, id, 0, &n);

	if (err)
		return reply(s, h, err, NULL, 0, NULL, 0);
	if (!(s->ns_opened[n->id / 8] & (1u << (n->id % 8)))) {
		if (s->nns >= b->cfg.max_ns)
			return reply(s, h, -EMFILE, NULL, 0, NULL, 0);
		s->ns_opened[n->id / 8] |= (uint8_t)(1u << (n->id % 8));
		s->nns++;
	}
	rep.ns = n->id;
	rep.page_bytes = n->page_bytes;
	log_debug("client %u: namespace %u '%s' page %llu bytes", s->id, n->id, n->layout.model,
		  (unsigned long long)n->page_bytes);
	return reply(s, h, 0, &rep, sizeof(rep), NULL, 0);
}

/*
 * Maps [off, off + len) of a client's host-memory file (BUF_REG, BUF_REG_FD): the pages that
 * enclose it, read-write, shared. Only a tmpfs file that can never shrink: no later truncation
 * can make our copies fault (the caller's own writes and growth are harmless). hugetlbfs files
 * can have holes punched despite the seal, disk files can lose pages: refused. An unsealed
 * tmpfs file is taken only with KVB_BUF_REG_FD_FDCOPY, and then never mapped (fdcopy.c).
 */
static int buf_map_host(struct broker *b, struct session *s, int fd, uint64_t off, uint64_t len,
			uint32_t flags, uint32_t *id)
{
	long pg = sysconf(_SC_PAGESIZE);
	uint64_t page = pg > 0 ? (uint64_t)pg : 4096, lead, end, maplen;
	struct statfs sfs;
	struct stat st;
	void *p;
	int seals, fdcopy;

	if (!len || fd < 0 || __builtin_add_overflow(off, len, &end))
		return -EINVAL;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
		return -EINVAL;
	if (fstatfs(fd, &sfs) < 0 || sfs.f_type != TMPFS_MAGIC)
		return -EMEDIUMTYPE;
	seals = fcntl(fd, F_GET_SEALS);
	fdcopy = seals < 0 || !(seals & F_SEAL_SHRINK);
	if (fdcopy && !(flags & KVB_BUF_REG_FD_FDCOPY))
		return -EPERM;
	/* The seal holds the size from here on: checking it now is final (fdcopy: checked again). */
	if (st.st_size < 0 || end > (uint64_t)st.st_size)
		return -EFAULT;
	lead = fdcopy ? 0 : off & (page - 1);
	maplen = lead + len;
	/* Each client's registrations are bounded, so none can exhaust our address space. */
	if (maplen > b->cfg.max_buf_bytes - s->buf_bytes)
		return -ENOMEM;
	for (*id = 0; *id < b->cfg.max_bufs && s->bufs[*id].base; (*id)++)
		;
	if (*id == b->cfg.max_bufs)
		return -EMFILE;
	if (fdcopy) {
		int err = fdcopy_buf_open(fd, off, len, &s->bufs[*id]);

		if (!err) {
			s->buf_bytes += len;
			s->nfdbufs++;
		}
		return err;
	}
	p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)(off - lead));
	if (p == MAP_FAILED)
		return -errno;
	s->bufs[*id] = (struct sbuf){
		.base = (uint8_t *)p + lead, .len = len, .lead = lead, .dev = COPY_HOST};
	s->buf_bytes += maplen;
	return 0;
}

static int buf_reg(struct broker *b, struct session *s, const struct kvb_msg_buf_reg *m, int fd,
		   uint32_t *id)
{
	int err;

	if (m->kind != KVB_BUF_HOST || m->resv || !m->len || fd < 0)
		return -EINVAL;
	/* ABI 1.0/1.1 clients were told -EINVAL for every unacceptable memfd: keep that. */
	err = buf_map_host(b, s, fd, 0, m->len, 0, id);
	return err == -EPERM || err == -EMEDIUMTYPE ? -EINVAL : err;
}

static int buf_reg_fd(struct broker *b, struct session *s, const struct kvb_msg_buf_reg_fd *m,
		      int fd, uint32_t *id)
{
	if ((m->flags & ~KVB_BUF_REG_FD_FDCOPY) || m->resv)
		return -EINVAL;
	return buf_map_host(b, s, fd, m->off, m->len, m->flags, id);
}

/*
 * VIEW_CREATE and VIEW_CREATE2: one part per (component, layer) of a namespace this session
 * opened. Strides must cover a token's bytes and page strides a page's tokens, so that slot
 * addresses grow with the slot and pages never overlap (ops.c bounds a page by its first and
 * last token on that promise). Buffers are checked again at each op: they may be unregistered.
 */
static int on_view_create(struct broker *b, struct session *s, const struct kvb_msg_hdr *h,
			  const uint8_t *body, size_t blen, int v2)
{
	struct kvb_msg_view_create2 vc = {0};
	size_t hlen = v2 ? sizeof(struct kvb_msg_view_create2) : sizeof(struct kvb_msg_view_create);
	size_t plen = v2 ? sizeof(struct kvb_view_part2) : sizeof(struct kvb_view_part);
	struct kvb_msg_id rep = {0};
	struct sview *v;
	struct ns *n;
	uint32_t id, tpp;

	memcpy(&vc, body, hlen);
	n = vc.ns < STORE_MAX_NS && (s->ns_opened[vc.ns / 8] & (1u << (vc.ns % 8)))
		    ? ns_get(&b->nst, vc.ns)
		    : NULL;
	if (!n)
		return reply(s, h, -EBADF, NULL, 0, NULL, 0);
	if (vc.nparts != n->nparts || vc.flags || vc.resv ||
	    blen != hlen + (uint64_t)vc.nparts * plen)
		return reply(s, h, -EINVAL, NULL, 0, NULL, 0);
	for (id = 0; id < SESSION_MAX_VIEWS && s->views[id]; id++)
		;
	if (id == SESSION_MAX_VIEWS)
		return reply(s, h, -EMFILE, NULL, 0, NULL, 0);
	v = malloc(sizeof(*v) + vc.nparts * sizeof(v->parts[0]));
	if (!v)
		return reply(s, h, -ENOMEM, NULL, 0, NULL, 0);
	v->ns = n;
	v->nparts = vc.nparts;
	tpp = n->layout.tokens_per_page;
	for (uint32_t p = 0; p < v->nparts; p++) {
		struct kvb_view_part2 *vp = &v->parts[p];
		uint64_t span;
		int err;

		if (v2) {
			memcpy(vp, body + hlen + (size_t)p * plen, sizeof(*vp));
		} else {
			struct kvb_view_part op;

			memcpy(&op, body + hlen + (size_t)p * plen, sizeof(op));
			*vp = (struct kvb_view_part2){
				.buf = op.buf, .stride = op.stride, .base = op.base};
		}
		/* A page's tokens end (tpp - 1) * stride + bpt after its first: < 2^64. */
		span = (uint64_t)(tpp - 1) * vp->stride + n->part_bpt[p];
		if (!vp->page_stride)
			vp->page_stride = (uint64_t)tpp * vp->stride;
		err = vp->stride < n->part_bpt[p] || vp->page_stride < span || vp->flags || vp->resv
			      ? -EINVAL
		      : vp->buf >= SESSION_MAX_BUFS || !s->bufs[vp->buf].base ? -EBADF
									      : 0;
		if (err) {
			free(v);
			return reply(s, h, err, NULL, 0, NULL, 0);
		}
	}
	s->views[id] = v;
	rep.id = id;
	return reply(s, h, 0, &rep, sizeof(rep), NULL, 0);
}

static int on_stats(struct broker *b, struct session *s, const struct kvb_msg_hdr *h)
{
	char *js = stats_json(b);
	int err;

	if (!js)
		return reply(s, h, -ENOMEM, NULL, 0, NULL, 0);
	err = reply(s, h, 0, js, strlen(js), NULL, 0);
	free(js);
	if (err == -EMSGSIZE)
		err = reply(s, h, -EMSGSIZE, NULL, 0, NULL, 0);
	return err;
}

/* Dispatches one validated request. Returns < 0 only when the session must end. */
static int dispatch(struct broker *b, struct session *s, const struct kvb_msg_hdr *h,
		    const uint8_t *body, size_t blen, int fd)
{
	struct kvb_msg_id id;
	uint32_t bid = 0;
	int err;

	if (h->type == KVB_MSG_HELLO) {
		struct kvb_msg_hello m = {0};

		/* An ABI 1.0 HELLO is shorter: the rest stays zero. */
		memcpy(&m, body, blen < sizeof(m) ? blen : sizeof(m));
		return on_hello(b, s, h, &m, blen);
	}
	if (!s->hello_done)
		return -EPROTO;
	if (s->control_only && h->type != KVB_MSG_STATS)
		return reply(s, h, -EOPNOTSUPP, NULL, 0, NULL, 0);
	switch (h->type) {
	case KVB_MSG_NS_OPEN: {
		struct kvb_layout l;
		struct kvb_ns_ident ident;

		memcpy(&l, body, sizeof(l));
		/* ABI 1.2: the identity fields follow the layout; without them, the default. */
		if (blen >= KVB_MSG_NS_OPEN_V2_SIZE)
			memcpy(&ident, body + sizeof(l), sizeof(ident));
		return on_ns_open(b, s, h, &l, blen >= KVB_MSG_NS_OPEN_V2_SIZE ? &ident : NULL);
	}
	case KVB_MSG_BUF_REG: {
		struct kvb_msg_buf_reg m;

		memcpy(&m, body, sizeof(m));
		err = buf_reg(b, s, &m, fd, &bid);
		id = (struct kvb_msg_id){bid, 0};
		return err ? reply(s, h, err, NULL, 0, NULL, 0)
			   : reply(s, h, 0, &id, sizeof(id), NULL, 0);
	}
	case KVB_MSG_BUF_REG_FD: {
		struct kvb_msg_buf_reg_fd m;

		memcpy(&m, body, sizeof(m));
		err = buf_reg_fd(b, s, &m, fd, &bid);
		id = (struct kvb_msg_id){bid, 0};
		return err ? reply(s, h, err, NULL, 0, NULL, 0)
			   : reply(s, h, 0, &id, sizeof(id), NULL, 0);
	}
	case KVB_MSG_BUF_REG_GPU: {
		struct kvb_msg_buf_reg_gpu m;

		memcpy(&m, body, sizeof(m));
		err = gpu_buf_reg(b, s, &m, fd, &bid);
		id = (struct kvb_msg_id){bid, 0};
		return err ? reply(s, h, err, NULL, 0, NULL, 0)
			   : reply(s, h, 0, &id, sizeof(id), NULL, 0);
	}
	case KVB_MSG_BUF_UNREG:
		memcpy(&id, body, sizeof(id));
		if (id.id >= SESSION_MAX_BUFS || !s->bufs[id.id].base || s->bufs[id.id].closing)
			return reply(s, h, -EBADF, NULL, 0, NULL, 0);
		/* A copy in flight may use it: then it goes with the session's last completion. */
		if (s->inflight) {
			s->bufs[id.id].closing = 1;
			s->nclosing++;
		} else {
			buf_release(b, s, &s->bufs[id.id]);
		}
		return reply(s, h, 0, NULL, 0, NULL, 0);
	case KVB_MSG_VIEW_CREATE:
		return on_view_create(b, s, h, body, blen, 0);
	case KVB_MSG_VIEW_CREATE2:
		return on_view_create(b, s, h, body, blen, 1);
	case KVB_MSG_VIEW_DESTROY:
		memcpy(&id, body, sizeof(id));
		if (id.id >= SESSION_MAX_VIEWS || !s->views[id.id])
			return reply(s, h, -EBADF, NULL, 0, NULL, 0);
		free(s->views[id.id]);
		s->views[id.id] = NULL;
		return reply(s, h, 0, NULL, 0, NULL, 0);
	case KVB_MSG_STATS:
		return on_stats(b, s, h);
	}
	return -EPROTO;
}

int session_on_msg(struct broker *b, struct session *s)
{
	static uint8_t buf[KVB_MSG_MAX];
	union {
		char b[CMSG_SPACE(sizeof(int) * KVB_MAX_FDS)];
		struct cmsghdr align;
	} cm;
	struct iovec iov = {buf, sizeof(buf)};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cm.b,
			    .msg_controllen = sizeof(cm.b)};
	int fds[KVB_MAX_FDS], nfds = 0, err = 0, violation = 1;
	struct kvb_msg_hdr h;
	const char *why = NULL;
	ssize_t n;

	n = recvmsg(s->sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n < 0) {
		if (errno == EAGAIN || errno == EINTR)
			return 0;
		session_destroy(b, s, strerror(errno));
		return -1;
	}
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

		for (size_t i = 0; i < k && nfds < (int)KVB_MAX_FDS; i++)
			memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
	}
	if (n == 0) {
		why = s->control_only || !s->hello_done ? NULL : "hang-up";
		violation = 0;
		err = -1;
		goto out;
	}
	if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC) || kvb_msg_check(buf, (size_t)n) ||
	    (((struct kvb_msg_hdr *)buf)->flags & KVB_MSGF_REPLY)) {
		why = "malformed control message";
		err = -1;
		goto out;
	}
	memcpy(&h, buf, sizeof(h));
	if (nfds > (h.type == KVB_MSG_BUF_REG || h.type == KVB_MSG_BUF_REG_GPU ||
				    h.type == KVB_MSG_BUF_REG_FD
			    ? 1
			    : 0)) {
		why = "unexpected file descriptors";
		err = -1;
		goto out;
	}
	err = dispatch(b, s, &h, buf + sizeof(h), (size_t)n - sizeof(h), nfds ? fds[0] : -1);
	if (err < 0)
		why = err == -EPROTO ? "protocol violation on the control socket" : strerror(-err);
out:
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	if (err < 0) {
		b->ctr.protocol_errors += violation;
		session_destroy(b, s, why);
		return -1;
	}
	return 0;
}

/* Page bytes one session may move per loop round before the next session's turn. */
#define ROUND_BYTES (8u << 20)

int session_poll(struct broker *b, struct session *s, uint32_t max)
{
	int64_t avail, space;
	uint64_t moved;
	uint32_t n, i, posted = 0;

	if (!s->region)
		return 0;
	s->stalled = 0;
	avail = kvb_ring_avail(&s->sq);
	if (avail <= 0) {
		if (avail < 0) {
			b->ctr.protocol_errors++;
			session_destroy(b, s, "impossible submission-queue tail");
			return -1;
		}
		return 0;
	}
	space = kvb_ring_space(&s->cq);
	if (space < 0) {
		b->ctr.protocol_errors++;
		session_destroy(b, s, "impossible completion-queue head");
		return -1;
	}
	/*
	 * Back-pressure: an SQE is consumed only when its CQE has a place to go, counting the
	 * places already promised to ops in flight, so a late completion always finds its slot.
	 */
	space -= s->inflight;
	/* --max-inflight: ops taken from the SQ whose CQE is not posted yet. */
	if (space > (int64_t)b->cfg.max_inflight - s->inflight)
		space = (int64_t)b->cfg.max_inflight - s->inflight;
	n = (uint32_t)(space <= 0 ? 0 : avail < space ? avail : space);
	s->stalled = !n;
	if (n > max)
		n = max;
	moved = b->ctr.bytes_in + b->ctr.bytes_out;
	for (i = 0; i < n; i++) {
		struct kvb_sqe sqe;
		struct kvb_cqe cqe;

		/*
		 * One copy out of shared memory; only the copy is validated and used. The CQE
		 * is built privately too: the client can scribble on its slot at any time.
		 */
		memcpy(&sqe, kvb_ring_cons_slot(&s->sq, i), sizeof(sqe));
		if (ops_exec(b, s, &sqe, &cqe) == OPS_DEFERRED)
			s->inflight++;
		else
			memcpy(kvb_ring_prod_slot(&s->cq, posted++), &cqe, sizeof(cqe));
		/* Inline copies run on this thread: bound what one client moves per round. */
		if (b->ctr.bytes_in + b->ctr.bytes_out - moved >= ROUND_BYTES) {
			i++;
			break;
		}
	}
	if (!i)
		return 0;
	kvb_ring_consume(&s->sq, i);
	if (posted) {
		kvb_ring_publish(&s->cq, posted);
		cq_doorbell(s);
	}
	return (int)i;
}
