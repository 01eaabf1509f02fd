// SPDX-License-Identifier: MIT
/*
 * ctl.c - the broker's side of the control socket, mirroring client/ctl.c: one datagram in
 * (validated: kvb_msg_check, the fds it may carry), one reply out (with fds: the ring region,
 * the doorbells, the pool's read-only arenas at HELLO). HELLO (ABI, placement, ring or control
 * client, the limits), NS_OPEN, BUF_REG, BUF_REG_FD, BUF_REG_GPU, BUF_UNREG, VIEW_CREATE,
 * VIEW_CREATE2, VIEW_DESTROY, STATS. The byte formats are proto/wire.h's; docs/protocol.md has
 * them in prose.
 *
 * Anything the client controls is validated before use; a malformed datagram or unexpected fds
 * end only this session (session_destroy), with the reason logged and counted
 * (protocol_errors). Buffer slots are the session's (session_buf_slot: --max-bufs holds for
 * every kind), and so is their release (session_buf_release, deferred while ops are in
 * flight). Loop thread only.
 */
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "orphan.h"
#include "broker.h"
#include "clock.h"
#include "copy_cuda.h"
#include "log.h"
#include "proto.h"
#include "rebind.h"
#include "text.h"

static struct log_throttle tt_refused; /* HELLO refusals (the limits) */

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
	if (nfds)
		kvb_msg_attach_fds(&mh, cm.buf, fds, nfds);
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
	s->region_fd = fd;
	session_region_init(b, s, r, (uint64_t)size, &h);
	/* session_note_cpu() writes it again only when the loop moves. */
	kvb_store_relaxed(s->loop_cpu, b->loop_cpu ? b->loop_cpu : (uint32_t)sched_getcpu() + 1u);
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
	int node = m->cpu_node;

	(void)b;
	if (blen < sizeof(*m) || m->resv2 || m->cpu_node < -1 ||
	    !memchr(m->gpu_busid, '\0', sizeof(m->gpu_busid)))
		return -EINVAL;
	if (m->gpu_busid[0]) {
		int g = numa_pci_node(NULL, m->gpu_busid);

		if (g == -EINVAL || g == -ENODEV)
			return g; /* kvbroker.h: kvb_opts.gpu_busid */
		if (g >= 0)
			node = g;
		memcpy(s->gpu, m->gpu_busid, sizeof(s->gpu));
	}
	s->node = node;
	s->pref.n = 0; /* decided once its tenant's partition is known (hello_arenas) */
	return 0;
}

/*
 * The arenas a ring client gets: its tenant's partition only [tenant-part], numbered from 0
 * there (store_loc), and its placement order among them, nearest first when it told us where it
 * runs (KVB_HELLOF_PLACE).
 */
static void hello_arenas(struct broker *b, struct session *s, int placed)
{
	const struct pool_part *pt = &b->pool.part[s->part];
	int arena_node[KVB_MAX_ARENAS];

	s->pref.n = 0;
	if (!placed)
		return;
	for (uint32_t i = 0; i < pt->narenas; i++)
		arena_node[i] = b->pool.arena[pt->first + i].node;
	numa_order(arena_node, pt->narenas, s->node, s->pref.arena);
	for (uint32_t i = 0; i < pt->narenas; i++)
		s->pref.arena[i] = (uint8_t)(s->pref.arena[i] + pt->first);
	s->pref.n = pt->narenas;
}

static int on_hello(struct broker *b, struct session *s, const struct kvb_msg_hdr *h,
		    const struct kvb_msg_hello *m, size_t blen)
{
	struct kvb_msg_hello_reply rep = {0};
	int fds[3 + KVB_MAX_ARENAS], nfds = 0, err, released = 0;
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
	if ((m->flags & ~(KVB_HELLOF_CONTROL | KVB_HELLOF_PLACE)) || m->resv) {
		reply(s, h, -EINVAL, NULL, 0, NULL, 0);
		return -EPROTO;
	}
	err = m->flags & KVB_HELLOF_PLACE ? hello_place(b, s, m, blen) : 0;
	if (err == -ENODEV) {
		/* A refusal, not a violation: the id is well formed, the device is not here. */
		log_throttled(&tt_refused, "client %u (pid %d): refused: no PCI device %.*s here",
			      s->id, (int)s->pid, (int)sizeof(m->gpu_busid), m->gpu_busid);
		b->ctr.refused++;
		reply(s, h, -ENODEV, NULL, 0, NULL, 0);
		return -ENODEV;
	}
	if (err) {
		reply(s, h, -EINVAL, NULL, 0, NULL, 0);
		return -EPROTO;
	}
	memcpy(s->name, m->name, sizeof(s->name));
	s->name[sizeof(s->name) - 1] = '\0';
	s->tenant = tenant_key(b->tt.mode, s->uid, s->gid);
	/* The name goes into log lines: no control bytes, so a client cannot forge a line. */
	for (char *p = s->name; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	rep.abi_major = KVB_ABI_MAJOR;
	rep.abi_minor = KVB_ABI_MINOR;
	rep.client_id = s->id;
	if (m->flags & KVB_HELLOF_CONTROL) {
		if (b->ncontrol >= b->cfg.max_control) {
			log_throttled(&tt_refused, "client %u ('%s', pid %d): refused: %u %s",
				      s->id, s->name, (int)s->pid, b->ncontrol,
				      "control connections (--max-control)");
			b->ctr.refused++;
			reply(s, h, -EUSERS, NULL, 0, NULL, 0);
			return -EUSERS;
		}
		s->control_only = 1;
		s->hello_done = 1;
		b->npending--;
		b->ncontrol++;
		return reply(s, h, 0, &rep, sizeof(rep), NULL, 0);
	}
	if (b->nsessions >= b->cfg.max_clients) {
		log_throttled(&tt_refused, "client %u ('%s', pid %d): refused: %u %s", s->id,
			      s->name, (int)s->pid, b->nsessions,
			      "clients attached (--max-clients)");
		b->ctr.refused++;
		reply(s, h, -EUSERS, NULL, 0, NULL, 0);
		return -EUSERS;
	}
	err = tenant_attach(&b->tt, s->tenant, &released);
	/* [tenant-rebind] A new tenant takes a released partition, in fresh memory; the
	 * operator's own attach only inspects, and takes none from a released tenant. */
	if (err == -EUSERS && released && s->uid != 0 && s->uid != geteuid())
		err = part_rebind(b, s->tenant);
	if (err >= 0 && tenant_guarantees(&b->tt, clock_now())) /* [tenant-lend] */
		tenant_apply(&b->tt, &b->pool, &b->store);
	if (err < 0 && (s->uid == 0 || s->uid == geteuid())) {
		/*
		 * [inspect] The operator always attaches, for inspection: with no share of its
		 * own it is handed partition 0's memory, read-only, which it can read anyway
		 * (root reads any process's memory; the broker's uid owns the memfds), and it opens
		 * no namespace (on_ns_open), so nothing of its own is ever stored in another
		 * tenant's partition. STATS, DROP and NS_LIMIT work as on a control connection.
		 */
		log_info("client %u ('%s', pid %d, uid %d): every tenant share is taken: attached "
			 "for inspection (no namespaces)",
			 s->id, s->name, (int)s->pid, (int)s->uid);
		err = 0;
	} else if (err < 0) {
		log_throttled(&tt_refused,
			      "client %u ('%s', pid %d, uid %d, gid %d): refused: every tenant "
			      "share is taken (all %u partitions, by other %ss with clients "
			      "attached or seen before%s); root and uid %d may still attach "
			      "to inspect",
			      s->id, s->name, (int)s->pid, (int)s->uid, (int)s->gid, b->tt.n,
			      tenant_mode_name(b->tt.mode),
			      released ? "; none of the released ones can be bound to a new tenant "
					 "now (the log says why)"
				       : "",
			      (int)geteuid());
		b->ctr.refused++;
		reply(s, h, -EUSERS, NULL, 0, NULL, 0);
		return -EUSERS;
	} else {
		s->tenant_bound = 1;
	}
	s->part = (uint32_t)err;
	hello_arenas(b, s, !!(m->flags & KVB_HELLOF_PLACE));
	err = region_create(b, s, sq);
	if (err) {
		reply(s, h, err, NULL, 0, NULL, 0);
		return err == -EINVAL ? -EPROTO : err;
	}
	s->sq_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	s->cq_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (s->sq_efd < 0 || s->cq_efd < 0 || loop_add(&b->loop, s->sq_efd, &s->on_sq)) {
		err = -ENOMEM;
		goto out;
	}
	fds[nfds++] = s->region_fd;
	fds[nfds++] = s->sq_efd;
	fds[nfds++] = s->cq_efd;
	rep.region_size = s->region_size;
	rep.narenas = b->pool.part[s->part].narenas;
	/* [dir] Only a directory the store took (dir_open), or none. */
	if (b->store.dir[s->part].h)
		rep.dir_units = (uint32_t)(b->pool.arena[b->pool.part[s->part].first].dir_bytes /
					   KVB_DIR_UNIT);
	for (uint32_t i = 0; i < rep.narenas; i++) {
		uint32_t a = b->pool.part[s->part].first + i;

		rep.arenas[i].size = b->pool.arena[a].size;
		rep.arenas[i].node = b->pool.arena[a].node;
		fds[nfds] = pool_ro_fd(&b->pool, a);
		if (fds[nfds] < 0) {
			err = fds[nfds];
			goto out;
		}
		nfds++;
	}
	err = reply(s, h, 0, &rep, sizeof(rep), fds, (uint32_t)nfds);
	if (!err) {
		orphan_session_keep(b, s, s->region_fd); /* [records] */
		s->hello_done = 1;
		b->npending--;
		b->nsessions++;
		log_info("client %u: attached '%s' pid %d uid %d, sq %u entries, node %d%s%s, "
			 "partition %u",
			 s->id, s->name, (int)s->pid, (int)s->uid, sq, s->node,
			 s->gpu[0] ? ", gpu " : "", s->gpu, s->part);
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
	int err;

	/* [inspect] An operator attached without a share of its own stores nothing. */
	if (!s->tenant_bound)
		return reply(s, h, -EACCES, NULL, 0, NULL, 0);
	/* The tenant is part of the identity [tenant-part]: another tenant's same model is
	 * another namespace, and its pages go to this tenant's partition. */
	err = ns_open2(&b->nst, &b->store, l, id, s->tenant, &n);
	if (err)
		return reply(s, h, err, NULL, 0, NULL, 0);
	b->store.ns_part[n->id] = (uint8_t)s->part;
	store_ns_limit(&b->store, n->id,
		       ns_limit_of(b->cfg.ns_limits, b->cfg.n_ns_limits, n,
				   b->pool.part[s->part].size, /* as the operator sized it */
				   b->store.cls[n->cls].slot_bytes));
	if (!(s->ns_opened[n->id / 8] & (1u << (n->id % 8)))) {
		if (s->nns >= b->cfg.max_ns) {
			ns_release(&b->nst, &b->store, n->id); /* made for nothing: goes again */
			return reply(s, h, -EMFILE, NULL, 0, NULL, 0);
		}
		s->ns_opened[n->id / 8] |= (uint8_t)(1u << (n->id % 8));
		s->nns++;
		n->opens++; /* until the session's last op completed [ns-free] */
	}
	rep.ns = n->id;
	rep.page_bytes = n->page_bytes;
	if (log_min_level <= LOG_DEBUG) {
		char model[sizeof(n->layout.model)];

		/* Client bytes in a log line: no newline may forge a line. */
		memcpy(model, n->layout.model, sizeof(model));
		model[sizeof(model) - 1] = '\0';
		log_debug("client %u: namespace %u '%s' page %llu bytes", s->id, n->id,
			  text_printable(model), (unsigned long long)n->page_bytes);
	}
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
	if (session_buf_slot(b, s, id))
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
	/* Our page tables for it, off the loop, before the first copies need them (bg.c). */
	bg_populate(b->bg, p, maplen);
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
 * BUF_REG_GPU: the GPU engine opens (or reuses: one open per client and allocation) the
 * client's allocation on the device with m->uuid (copy.h), and the range goes into a free
 * buffer slot of s, its id into *id. fd: the cuMem allocation's fd (KVB_BUF_GPU_FD) or -1; the
 * caller closes it. Errors: -ENODEV GPU copies off or no device with that UUID, -EINVAL
 * malformed, -EFAULT range outside the allocation, -EMFILE no buffer slot, -EIO (or another
 * errno) the driver refused the handle.
 */
static int buf_reg_gpu(struct broker *b, struct session *s, const struct kvb_msg_buf_reg_gpu *m,
		       int fd, uint32_t *id)
{
	struct copy_gpu_alloc a = {.key = m->alloc_base, .size = m->alloc_size, .fd = fd};
	struct gpu_map *gm;
	uint64_t dptr;
	int32_t dev;
	int err;

	if (!b->gpu)
		return -ENODEV;
	if (m->resv || !m->len || (m->kind != KVB_BUF_GPU_IPC && m->kind != KVB_BUF_GPU_FD) ||
	    (m->kind == KVB_BUF_GPU_FD) != (fd >= 0))
		return -EINVAL;
	if (m->off > m->alloc_size || m->len > m->alloc_size - m->off)
		return -EFAULT;
	a.kind = m->kind == KVB_BUF_GPU_FD ? COPY_GPU_FD : COPY_GPU_IPC;
	memcpy(a.uuid, m->uuid, sizeof(a.uuid));
	memcpy(a.handle, m->handle, sizeof(a.handle));
	err = session_buf_slot(b, s, id); /* --max-bufs counts GPU buffers too */
	if (err)
		return err;
	err = copy_gpu_open(b->gpu, s->id, &a, &gm, &dptr, &dev);
	if (err)
		return err;
	s->bufs[*id] = (struct sbuf){
		.base = (void *)(uintptr_t)(dptr + m->off), .len = m->len, .dev = dev, .gm = gm};
	log_debug("client %u: GPU buffer %u: %llu bytes at +%llu of a %s allocation on device %d",
		  s->id, *id, (unsigned long long)m->len, (unsigned long long)m->off,
		  m->kind == KVB_BUF_GPU_FD ? "cuMem" : "cuMemAlloc", dev);
	return 0;
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
	v->refs = 1;
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

/* Paged STATS (ABI 1.3, wire.h): a snapshot rendered at offset 0, cut into pages. */
static int on_stats_page(struct broker *b, struct session *s, const struct kvb_msg_hdr *h,
			 const struct kvb_msg_stats_page *m)
{
	uint64_t max = m->max && m->max < KVB_STATS_PAGE ? m->max : KVB_STATS_PAGE, n;

	if (m->flags)
		return reply(s, h, -EINVAL, NULL, 0, NULL, 0);
	if (!m->offset || !s->stats_doc) {
		free(s->stats_doc);
		s->stats_doc = stats_json_for(b, s);
		s->stats_len = s->stats_doc ? strlen(s->stats_doc) : 0;
		if (!s->stats_doc || s->stats_len > INT32_MAX)
			return reply(s, h, -ENOMEM, NULL, 0, NULL, 0);
	}
	if (m->offset > s->stats_len)
		return reply(s, h, -EINVAL, NULL, 0, NULL, 0);
	n = s->stats_len - m->offset < max ? s->stats_len - m->offset : max;
	return reply(s, h, (int32_t)s->stats_len, s->stats_doc + m->offset, n, NULL, 0);
}

/*
 * DROP (kvbctl drop): ends another client's session, releasing its leases; its library then
 * unmaps the pool. Only the broker's own uid or root may, whatever --tenants says: an operator
 * command, not a tenant's.
 */
static int on_drop(struct broker *b, struct session *s, const struct kvb_msg_hdr *h,
		   const struct kvb_msg_id *m)
{
	struct list *pos;

	if (s->uid != geteuid() && s->uid != 0)
		return reply(s, h, -EPERM, NULL, 0, NULL, 0);
	if (m->resv || m->id == s->id)
		return reply(s, h, -EINVAL, NULL, 0, NULL, 0);
	list_for_each (pos, &b->sessions) {
		struct session *t = list_entry(pos, struct session, link);

		if (t->id != m->id || !t->hello_done)
			continue;
		log_warn("client %u (%s, pid %d): dropped by client %u (pid %d, uid %d)", t->id,
			 t->name[0] ? t->name : "?", (int)t->pid, s->id, (int)s->pid, (int)s->uid);
		session_revoke(t);
		session_destroy(b, t, "dropped by the operator (kvbctl drop)");
		return reply(s, h, 0, NULL, 0, NULL, 0);
	}
	return reply(s, h, -ENOENT, NULL, 0, NULL, 0);
}

/*
 * [ns-limit] NS_LIMIT: an operator sets or removes the cap of one model's namespaces on the
 * running broker, as --ns-limit would have at start-up: the table of limits changes (namespaces
 * opened later get it) and every live namespace of the model takes the new cap now; one over
 * it evicts its own coldest pages down to it (store_ns_trim), nothing else is touched, so a
 * page that fits under the new cap is never lost.
 */
static int on_ns_limit(struct broker *b, struct session *s, const struct kvb_msg_hdr *h,
		       const struct kvb_msg_ns_limit *m)
{
	struct config *c = &b->cfg;
	uint32_t i, trimmed = 0;
	uint64_t evicted = b->store.st.ns_evictions;
	char what[48];

	if (s->uid != geteuid() && s->uid != 0)
		return reply(s, h, -EPERM, NULL, 0, NULL, 0);
	if (m->resv || !m->model[0] || !memchr(m->model, '\0', sizeof(m->model)) ||
	    (m->bytes && m->percent) || m->percent > 100)
		return reply(s, h, -EINVAL, NULL, 0, NULL, 0);
	for (i = 0; i < c->n_ns_limits && strcmp(c->ns_limits[i].model, m->model); i++)
		;
	if (!m->bytes && !m->percent) {
		if (i == c->n_ns_limits)
			return reply(s, h, -ENOENT, NULL, 0, NULL, 0);
		c->ns_limits[i] = c->ns_limits[--c->n_ns_limits];
		snprintf(what, sizeof(what), "removed");
	} else {
		if (i == NS_LIMITS_MAX)
			return reply(s, h, -ENOSPC, NULL, 0, NULL, 0);
		memset(&c->ns_limits[i], 0, sizeof(c->ns_limits[i]));
		memcpy(c->ns_limits[i].model, m->model, strlen(m->model));
		c->ns_limits[i].bytes = m->bytes;
		c->ns_limits[i].frac = m->percent / 100.0;
		c->n_ns_limits += i == c->n_ns_limits;
		if (m->bytes)
			text_bytes((double)m->bytes, what, sizeof(what));
		else
			snprintf(what, sizeof(what), "%u%% of its partition", m->percent);
	}
	for (uint32_t id = 0; id < b->nst.count; id++) {
		struct ns *n = ns_get(&b->nst, id);
		char model[sizeof(n->layout.model) + 1];

		if (!n)
			continue;
		memcpy(model, n->layout.model, sizeof(n->layout.model));
		model[sizeof(n->layout.model)] = '\0';
		if (strcmp(model, m->model))
			continue;
		store_ns_limit(&b->store, id,
			       ns_limit_of(c->ns_limits, c->n_ns_limits, n,
					   b->pool.part[b->store.ns_part[id]].size,
					   b->store.cls[n->cls].slot_bytes));
		(void)store_ns_trim(&b->store, id);
		trimmed++;
	}
	log_warn("ns-limit %s: %s by client %u (pid %d, uid %d); %u namespaces now, %llu pages "
		 "evicted over it",
		 m->model, what, s->id, (int)s->pid, (int)s->uid, trimmed,
		 (unsigned long long)(b->store.st.ns_evictions - evicted));
	return reply(s, h, 0, NULL, 0, NULL, 0);
}

/*
 * [tenant-lend] TENANT_SHARE: an operator sets a tenant's share on the running broker. A share
 * is a guarantee, so nothing moves now: a raised one is reclaimed from borrowers by the
 * tenant's next PUTs, a lowered one leaves what it holds beyond as lent (taken back when
 * another tenant needs it). Namespace caps given in percent follow the new share.
 */
static int on_tenant_share(struct broker *b, struct session *s, const struct kvb_msg_hdr *h,
			   const struct kvb_msg_tenant_share *m)
{
	struct tenant_table *tt = &b->tt;
	uint64_t bytes = m->bytes;
	uint32_t id;
	char what[48], g[32];
	int p;

	if (s->uid != geteuid() && s->uid != 0)
		return reply(s, h, -EPERM, NULL, 0, NULL, 0);
	if (tt->mode == TENANTS_NONE || !b->pool.sparse)
		return reply(s, h, -EOPNOTSUPP, NULL, 0, NULL, 0);
	if (m->resv || !m->tenant[0] || !memchr(m->tenant, '\0', sizeof(m->tenant)) ||
	    (m->bytes && m->percent) || m->percent > 100)
		return reply(s, h, -EINVAL, NULL, 0, NULL, 0);
	if (tenant_resolve(tt->mode, m->tenant, &id))
		return reply(s, h, -ENOENT, NULL, 0, NULL, 0);
	if (m->percent)
		bytes = (uint64_t)((double)m->percent / 100.0 * (double)b->pool.total);
	if (bytes > b->pool.total)
		return reply(s, h, -EINVAL, NULL, 0, NULL, 0);
	p = tenant_set_share(tt, tenant_key(tt->mode, id, id), bytes);
	if (p < 0)
		return reply(s, h, p, NULL, 0, NULL, 0);
	(void)tenant_guarantees(tt, clock_now());
	tenant_apply(tt, &b->pool, &b->store);
	for (uint32_t nid = 0; nid < b->nst.count; nid++) {
		struct ns *n = ns_get(&b->nst, nid);

		if (n && b->store.ns_part[nid] == (uint32_t)p)
			store_ns_limit(&b->store, nid,
				       ns_limit_of(b->cfg.ns_limits, b->cfg.n_ns_limits, n,
						   b->pool.part[p].size,
						   b->store.cls[n->cls].slot_bytes));
	}
	text_bytes((double)tt->t[p].share, what, sizeof(what));
	log_warn("tenant-share %s %u: %s%s by client %u (pid %d, uid %d); partition %u, guarantee "
		 "now %s",
		 tenant_mode_name(tt->mode), id, what, bytes ? "" : " (the default)", s->id,
		 (int)s->pid, (int)s->uid, p, text_bytes((double)tt->t[p].guarantee, g, sizeof(g)));
	return reply(s, h, 0, NULL, 0, NULL, 0);
}

static int on_stats(struct broker *b, struct session *s, const struct kvb_msg_hdr *h)
{
	char *js = stats_json_for(b, s);
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
	if (s->control_only && h->type != KVB_MSG_STATS && h->type != KVB_MSG_DROP &&
	    h->type != KVB_MSG_NS_LIMIT && h->type != KVB_MSG_TENANT_SHARE)
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
		err = buf_reg_gpu(b, s, &m, fd, &bid);
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
			session_buf_release(b, s, &s->bufs[id.id]);
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
		sview_put(s->views[id.id]); /* ops using it keep it until they complete */
		s->views[id.id] = NULL;
		return reply(s, h, 0, NULL, 0, NULL, 0);
	case KVB_MSG_STATS:
		(void)session_settle(b); /* [notes][hazard] what clients told, and released */
		if (blen >= sizeof(struct kvb_msg_stats_page)) {
			struct kvb_msg_stats_page m;

			memcpy(&m, body, sizeof(m));
			return on_stats_page(b, s, h, &m);
		}
		return on_stats(b, s, h);
	case KVB_MSG_DROP:
		memcpy(&id, body, sizeof(id));
		return on_drop(b, s, h, &id);
	case KVB_MSG_NS_LIMIT: {
		struct kvb_msg_ns_limit m;

		memcpy(&m, body, sizeof(m));
		return on_ns_limit(b, s, h, &m);
	}
	case KVB_MSG_TENANT_SHARE: {
		struct kvb_msg_tenant_share m;

		memcpy(&m, body, sizeof(m));
		return on_tenant_share(b, s, h, &m);
	}
	}
	return -EPROTO;
}

int ctl_on_msg(struct broker *b, struct session *s)
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
	int fds[KVB_MAX_FDS], err = 0, violation = 1, fds_err;
	uint32_t nfds = 0;
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
	/* Fds of a truncated message, or too many, are closed here: "malformed" below. */
	fds_err = kvb_msg_take_fds(&mh, fds, KVB_MAX_FDS, &nfds);
	if (n == 0) {
		why = s->control_only || !s->hello_done ? NULL : "hang-up";
		violation = 0;
		err = -1;
		goto out;
	}
	s->active_at = clock_now();
	if (fds_err || kvb_msg_check(buf, (size_t)n) ||
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
	/* A refusal at a limit was answered and logged (throttled): no violation, no line. */
	if (err == -EUSERS || err == -ENODEV) {
		violation = 0;
	} else if (err == -EPIPE || err == -ECONNRESET || err == -ENOTCONN) {
		/* Its reply found the peer gone (SIGKILLed mid-request): a hang-up, no violation. */
		violation = 0;
		why = s->control_only || !s->hello_done ? NULL : "hang-up";
	} else if (err < 0)
		why = err == -EPROTO ? "protocol violation on the control socket" : strerror(-err);
out:
	for (uint32_t i = 0; i < nfds; i++)
		close(fds[i]);
	if (err < 0) {
		b->ctr.protocol_errors += violation;
		session_destroy(b, s, why);
		return -1;
	}
	return 0;
}
