// SPDX-License-Identifier: MIT
/*
 * fuzz_broker.c - the broker core inside a fuzzer (see fuzz_broker.h). The pool is a small
 * POSIX shm object unlinked right after it is created, so a crashing fuzzer leaves nothing in
 * /dev/shm. Sessions are built the way session_accept() and on_hello() build them, minus the
 * socket where the target does not need one.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_broker.h"
#include "log.h"
#include "proto.h"

void fuzz_fail(const char *what)
{
	fprintf(stderr, "fuzz invariant broken: %s\n", what);
	abort();
}

/*
 * Open fds of the kinds a session holds (sockets, memfds, eventfds, pidfds, shm). libFuzzer's
 * own leak check opens pipes and /dev/null meanwhile, so those are not counted.
 */
static int session_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	char p[64], t[256];
	int n = 0;

	if (!d)
		fuzz_fail("opendir /proc/self/fd");
	while ((e = readdir(d))) {
		ssize_t k;

		snprintf(p, sizeof(p), "/proc/self/fd/%s", e->d_name);
		k = readlink(p, t, sizeof(t) - 1);
		if (k <= 0)
			continue;
		t[k] = 0;
		n += !strncmp(t, "socket:", 7) || !strncmp(t, "/memfd:", 7) ||
		     !strcmp(t, "anon_inode:[eventfd]") || !strncmp(t, "anon_inode:[pidfd]", 18) ||
		     !strncmp(t, "/dev/shm/", 9);
	}
	closedir(d);
	return n;
}

/*
 * Shared mappings ("rw-s": rings, buffers, the pool), counted from /proc/self/maps. The
 * sanitizers' and libFuzzer's own mappings are private, so the count is steady between inputs
 * unless a session's teardown left one behind.
 */
static int shared_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512];
	int n = 0;

	if (!f)
		fuzz_fail("fopen /proc/self/maps");
	while (fgets(line, sizeof(line), f)) {
		const char *perm = strchr(line, ' ');

		n += perm && strlen(perm) > 4 && perm[4] == 's';
		/* A long line (a long path) continues: skip the rest of it. */
		while (!strchr(line, '\n') && fgets(line, sizeof(line), f))
			;
	}
	fclose(f);
	return n;
}

static void layout_a(struct kvb_layout *l)
{
	memset(l, 0, sizeof(*l));
	strcpy(l->model, "fuzz/a");
	l->kind = KVB_LAYOUT_MLA;
	l->tokens_per_page = 16;
	l->tp_size = 1;
	l->ncomponents = 1;
	strcpy(l->comp[0].name, "kv");
	l->comp[0].num_layers = 2;
	l->comp[0].bytes_per_token_layer = 512;
}

static void layout_b(struct kvb_layout *l)
{
	memset(l, 0, sizeof(*l));
	strcpy(l->model, "fuzz/b");
	l->kind = KVB_LAYOUT_MLA;
	l->tokens_per_page = 4;
	l->tp_size = 1;
	l->ncomponents = 2;
	strcpy(l->comp[0].name, "kv");
	l->comp[0].num_layers = 3;
	l->comp[0].bytes_per_token_layer = 64;
	strcpy(l->comp[1].name, "idx");
	l->comp[1].num_layers = 2;
	l->comp[1].bytes_per_token_layer = 32;
}

struct fuzz_broker *fuzz_broker(void)
{
	static struct fuzz_broker fb;
	static int ready;
	struct kvb_layout l;
	struct ns *n;
	char name[64];

	if (ready)
		return &fb;
	log_min_level = LOG_ERROR + 1; /* the fuzzer's output is its own */
	list_init(&fb.b.sessions);
	list_init(&fb.b.graveyard);
	fb.b.cfg.max_clients = 16;
	fb.b.cfg.max_control = 16;
	fb.b.cfg.max_leases = 64;
	fb.b.cfg.arg_size = 16384;
	fb.b.cfg.max_buf_bytes = 4u << 20;
	fb.b.cfg.max_sq = 64;
	fb.b.cfg.max_bufs = 8;
	fb.b.cfg.max_ns = 4;
	fb.b.cfg.max_inflight = 4096;
	fb.b.listen_fd = fb.b.sigfd = fb.b.spare_fd = -1;
	snprintf(name, sizeof(name), "/kvbfuzz-%d", (int)getpid());
	/* A memfd pool: nothing outlives the fuzzer, even when it crashes. */
	if (pool_open(&fb.b.pool, name + 1, 8u << 20, 1))
		fuzz_fail("pool_open");
	if (store_init(&fb.b.store, &fb.b.pool, 1u << 20, 1.0, 0.9))
		fuzz_fail("store_init");
	ops_init(&fb.b);
	/* Every copy inline, no GPU: an input's outcome must not depend on thread timing. */
	fb.b.cfg.copy_threads = 1;
	fb.b.cfg.copy_inline = UINT64_MAX;
	fb.b.cfg.gpu = 0;
	fb.b.loop.epfd = epoll_create1(EPOLL_CLOEXEC);
	if (fb.b.loop.epfd < 0 || xfer_init(&fb.b))
		fuzz_fail("set-up");
	layout_a(&l);
	if (ns_open(&fb.b.nst, &fb.b.store, &l, 0, &n))
		fuzz_fail("ns a");
	fb.ns_a = n->id;
	fb.pb_a = n->page_bytes;
	n->opens++; /* the harness's own open: the namespaces outlive every input [ns-free] */
	layout_b(&l);
	if (ns_open(&fb.b.nst, &fb.b.store, &l, 0, &n))
		fuzz_fail("ns b");
	fb.ns_b = n->id;
	fb.pb_b = n->page_bytes;
	n->opens++;
	fb.fd_probe = session_fds();
	fb.map_probe = shared_maps();
	ready = 1;
	return &fb;
}

static struct session *session_new(struct fuzz_broker *fb)
{
	struct session *s = calloc(1, sizeof(*s));

	if (!s)
		fuzz_fail("calloc");
	s->sock = s->pidfd = s->region_fd = s->sq_efd = s->cq_efd = -1;
	s->id = ++fb->b.next_id;
	session_init(&fb->b, s);
	list_add_tail(&fb->b.sessions, &s->link);
	fb->b.nconns++;
	fb->b.npending++; /* accepted, no HELLO yet, as session_accept() leaves it */
	return s;
}

static void open_ns(struct session *s, uint32_t id)
{
	s->ns_opened[id / 8] |= (uint8_t)(1u << (id % 8));
	s->nns++;
	ns_get(&s->b->nst, id)->opens++; /* as on_ns_open counts it [ns-free] */
}

struct session *fuzz_session_ring(struct fuzz_broker *fb, uint32_t sq_entries, uint32_t base)
{
	struct session *s = session_new(fb);
	struct kvb_region_hdr h;
	int64_t size;
	uint8_t *r;
	struct sview *v;
	struct ns *nb = ns_get(&fb->b.nst, fb->ns_b);

	if (sq_entries < 8)
		sq_entries = 8;
	if (sq_entries > 64)
		sq_entries = 64;
	size = kvb_region_layout(sq_entries, fb->b.cfg.arg_size, &h);
	if (size < 0)
		fuzz_fail("region layout");
	r = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (r == MAP_FAILED)
		fuzz_fail("mmap region");
	memcpy(r, &h, sizeof(h));
	/* Both rings start at base, as after 2^32 - small operations of a long-lived client. */
	memcpy(r + h.sq_head_off, &base, 4);
	memcpy(r + h.sq_tail_off, &base, 4);
	memcpy(r + h.cq_head_off, &base, 4);
	memcpy(r + h.cq_tail_off, &base, 4);
	session_region_init(&fb->b, s, r, (uint64_t)size, &h);
	/*
	 * KVB_SQEF_FILL's fill word: a client that filled all before posting (and a word past
	 * any page: clamped), so that a filled PUT completes in its first run, as the
	 * one-CQE-per-consumed-SQE oracle of fuzz_ring needs.
	 */
	kvb_store_relaxed(s->fill, UINT32_MAX);
	s->hello_done = 1;
	fb->b.npending--;
	fb->b.nsessions++;
	open_ns(s, fb->ns_a);
	open_ns(s, fb->ns_b);
	for (int i = 0; i < 2; i++) {
		s->bufs[i].base = mmap(NULL, FUZZ_BUF_LEN, PROT_READ | PROT_WRITE,
				       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (s->bufs[i].base == MAP_FAILED)
			fuzz_fail("mmap buf");
		s->bufs[i].len = FUZZ_BUF_LEN;
		/* Host memory: without it the buffer reads as GPU 0 and is never unmapped. */
		s->bufs[i].dev = COPY_HOST;
		s->buf_bytes += FUZZ_BUF_LEN;
	}
	/* View 0: the five parts of ns b, token-interleaved in buffer 1 (stride 256 B). */
	v = calloc(1, sizeof(*v) + nb->nparts * sizeof(v->parts[0]));
	if (!v)
		fuzz_fail("calloc view");
	v->refs = 1;
	v->ns = nb;
	v->nparts = nb->nparts;
	for (uint32_t p = 0, off = 0; p < nb->nparts; off += nb->part_bpt[p], p++)
		v->parts[p] = (struct kvb_view_part2){.buf = 1,
						      .base = off,
						      .stride = 256,
						      .page_stride = 256ull *
								     nb->layout.tokens_per_page};
	s->views[0] = v;
	/*
	 * View 1 (ABI 1.2 page strides): the same parts in buffer 0, one token record of 256 B
	 * per slot and pages 1 KiB further apart than their tokens, so that an op whose slot is
	 * not page-aligned crosses a page boundary of the client's layout.
	 */
	v = calloc(1, sizeof(*v) + nb->nparts * sizeof(v->parts[0]));
	if (!v)
		fuzz_fail("calloc view");
	v->refs = 1;
	v->ns = nb;
	v->nparts = nb->nparts;
	for (uint32_t p = 0, off = 0; p < nb->nparts; off += nb->part_bpt[p], p++)
		v->parts[p] = (struct kvb_view_part2){
			.buf = 0,
			.base = off,
			.stride = 256,
			.page_stride = 256ull * nb->layout.tokens_per_page + 1024};
	s->views[1] = v;
	return s;
}

struct session *fuzz_session_sock(struct fuzz_broker *fb, int *peer)
{
	struct session *s;
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		fuzz_fail("socketpair");
	s = session_new(fb);
	s->sock = sv[0];
	fcntl(sv[0], F_SETFL, O_NONBLOCK);
	fcntl(sv[1], F_SETFL, O_NONBLOCK);
	s->uid = getuid();
	s->pid = getpid();
	*peer = sv[1];
	return s;
}

void fuzz_session_end(struct fuzz_broker *fb, struct session *s, int alive)
{
	struct broker *b = &fb->b;

	if (alive)
		session_destroy(b, s, NULL);
	session_reap(b);
	/* A client's death releases everything it held (rule 5, docs/design.md). */
	if (b->leases)
		fuzz_fail("leases left after the session ended");
	if (b->store.st.pinned)
		fuzz_fail("pages left pinned after the session ended");
	if (b->nconns || b->nsessions || b->ncontrol || b->npending)
		fuzz_fail("session counts");
	/* Nothing is in flight once the input is done: no dead session may wait to be freed. */
	if (!list_empty(&b->graveyard))
		fuzz_fail("a dead session was left in the graveyard");
	if (session_fds() != fb->fd_probe)
		fuzz_fail("file descriptor leaked");
	if (shared_maps() != fb->map_probe)
		fuzz_fail("mapping leaked (a ring or buffer was not unmapped)");
	/* A fresh store for the next input, so that every crash reproduces from its input alone. */
	store_fini(&b->store);
	if (store_init(&b->store, &b->pool, 1u << 20, 1.0, 0.9) ||
	    store_class_get(&b->store, fb->pb_a) != ns_get(&b->nst, fb->ns_a)->cls ||
	    store_class_get(&b->store, fb->pb_b) != ns_get(&b->nst, fb->ns_b)->cls)
		fuzz_fail("store reset");
	ops_init(b);
}
