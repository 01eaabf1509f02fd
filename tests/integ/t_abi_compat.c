// SPDX-License-Identifier: MIT
/*
 * t_abi_compat.c - the 0.2 library against a broker that speaks ABI 1.1. A proxy process sits
 * on its own socket between the client and a real broker, forwards every control datagram and
 * its fds both ways, rewrites the HELLO reply's abi_minor to 1, and records the type and length
 * of each request. The rings and pool fds pass straight through, so the data path is the real
 * broker's. With that "old" broker:
 *   - kvb_ns_open2() with the default identity works and sends the 196-byte NS_OPEN an ABI 1.1
 *     broker understands; a non-default identity is -EOPNOTSUPP and sends nothing (an old
 *     broker would read the layout and silently drop the identity);
 *   - kvb_view_create2() without page strides falls back to VIEW_CREATE and the view works; with
 *     a page stride it is -EOPNOTSUPP;
 *   - kvb_buf_register_host_fd() is -EOPNOTSUPP;
 *   - kvb_completion_fd() needs nothing new on the wire and works;
 *   - kvb_put() from plain memory is copy-then-PUT, never a filled PUT (KVB_SQEF_FILL, ABI
 *     1.4, which an older broker refuses): the broker counts no filled PUT, while the same
 *     library attached straight to it fills (KVB_CLIENT_FILL_KB=1 makes these small pages
 *     qualify);
 *   - no request of type BUF_REG_FD or VIEW_CREATE2, and no NS_OPEN longer than a layout, ever
 *     reaches the broker.
 */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define TPP 16
#define LAYERS 2
#define BPT 256
#define PB (TPP * LAYERS * BPT)
#define MAXLOG 256

/* What the proxy saw: request types and lengths, in order (shared with the test process). */
struct seen {
	uint32_t n;
	uint16_t type[MAXLOG];
	uint32_t len[MAXLOG];
};

static struct seen *seen;

/* Moves one datagram with its fds from one socket to the other; 0 on EOF or error. */
static int forward(int from, int to, int from_client)
{
	static uint8_t buf[KVB_STATS_MAX];
	union {
		char b[CMSG_SPACE(sizeof(int) * KVB_MAX_FDS)];
		struct cmsghdr align;
	} cm;
	struct iovec iov = {buf, sizeof(buf)};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cm.b,
			    .msg_controllen = sizeof(cm.b)};
	struct kvb_msg_hdr h;
	int fds[KVB_MAX_FDS], nfds = 0;
	ssize_t n = recvmsg(from, &mh, 0);

	if (n <= 0)
		return 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
				memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
	if ((size_t)n >= sizeof(h)) {
		memcpy(&h, buf, sizeof(h));
		if (from_client && seen->n < MAXLOG) {
			seen->type[seen->n] = h.type;
			seen->len[seen->n] = (uint32_t)n;
			__atomic_add_fetch(&seen->n, 1, __ATOMIC_RELEASE);
		}
		/* The HELLO reply: claim ABI 1.1. */
		if (!from_client && h.type == KVB_MSG_HELLO &&
		    (size_t)n >= sizeof(h) + sizeof(struct kvb_msg_reply) +
					 sizeof(struct kvb_msg_hello_reply)) {
			uint16_t one = 1;

			memcpy(buf + sizeof(h) + sizeof(struct kvb_msg_reply) +
				       offsetof(struct kvb_msg_hello_reply, abi_minor),
			       &one, sizeof(one));
		}
	}
	iov.iov_len = (size_t)n;
	mh.msg_controllen = nfds ? CMSG_SPACE(sizeof(int) * (size_t)nfds) : 0;
	mh.msg_control = nfds ? cm.b : NULL;
	if (nfds) {
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);

		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	n = sendmsg(to, &mh, MSG_NOSIGNAL);
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	return n > 0;
}

/* The proxy: one client at a time on lsock, each with its own connection to the broker. */
static int proxy(int idx, void *arg)
{
	const char *const *paths = arg; /* [0] listen, [1] broker */
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	(void)idx;
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", paths[0]);
	CHECK_OK(bind(l, (struct sockaddr *)&a, sizeof(a)));
	CHECK_OK(listen(l, 4));
	for (;;) {
		int c = accept4(l, NULL, NULL, SOCK_CLOEXEC), s;
		struct sockaddr_un ba = {.sun_family = AF_UNIX};

		if (c < 0)
			return 1;
		s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		snprintf(ba.sun_path, sizeof(ba.sun_path), "%s", paths[1]);
		CHECK_OK(connect(s, (struct sockaddr *)&ba, sizeof(ba)));
		for (;;) {
			struct pollfd p[2] = {{c, POLLIN, 0}, {s, POLLIN, 0}};

			if (poll(p, 2, -1) < 0)
				continue;
			if ((p[0].revents && !forward(c, s, 1)) ||
			    (p[1].revents && !forward(s, c, 0)))
				break;
		}
		close(c);
		close(s);
	}
}

static uint32_t count_type(uint16_t type)
{
	uint32_t k = 0, n = __atomic_load_n(&seen->n, __ATOMIC_ACQUIRE);

	for (uint32_t i = 0; i < n; i++)
		k += seen->type[i] == type;
	return k;
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_opts o = {.name = "t_abi_compat"};
	struct kvb_layout l;
	struct kvb_ns_ident id = {0};
	struct kvb_view_part2 parts[LAYERS];
	char psock[sizeof(((struct sockaddr_un *)0)->sun_path)];
	const char *paths[2];
	kvb_key k = harness_key(77, 1);
	uint8_t page[PB], *hb;
	kvb_client *c = NULL;
	uint32_t ns, hid, view, before;
	size_t pb;
	pid_t pid;
	int fd, cfd, rc = -1;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "32M");
	seen = harness_shared(sizeof(*seen));
	CHECK_LT(strlen(b->dir) + 7, sizeof(psock));
	memcpy(psock, b->dir, strlen(b->dir));
	memcpy(psock + strlen(b->dir), "/proxy", 7);
	paths[0] = psock;
	paths[1] = b->sock;
	pid = harness_fork(proxy, 0, paths);
	setenv("KVB_CLIENT_FILL_KB", "1", 1);
	o.socket_path = psock;
	for (int i = 0; i < 500 && rc; i++) {
		rc = kvb_connect(&o, &c);
		if (rc)
			usleep(10000);
	}
	CHECK_OK(rc);
	CHECK_EQ(kvb_version(), 0x000600);

	harness_layout(&l, "test/abi-compat", KVB_LAYOUT_MLA, TPP, 1, 0, LAYERS, BPT);
	CHECK_OK(kvb_ns_open2(c, &l, &id, &ns, &pb)); /* the default: fine with 1.1 */
	CHECK_EQ(pb, PB);
	id.dp_size = 2; /* dp is not identity: still the default */
	CHECK_OK(kvb_ns_open2(c, &l, &id, &ns, &pb));
	before = seen->n;
	id.dtype[0] = KVB_DTYPE_BF16;
	CHECK_RC(kvb_ns_open2(c, &l, &id, &ns, &pb), -EOPNOTSUPP);
	CHECK_EQ(seen->n, before); /* refused before anything was sent */

	hb = kvb_buf_alloc_host(c, 64 * 1024, &hid);
	CHECK(hb != NULL);
	for (uint32_t i = 0; i < LAYERS; i++)
		parts[i] = (struct kvb_view_part2){
			.buf = hid, .stride = BPT, .base = (uint64_t)i * 64 * BPT};
	CHECK_OK(kvb_view_create2(c, ns, parts, LAYERS, 0, &view)); /* as VIEW_CREATE */
	harness_fill(page, PB, &k, 77);
	CHECK_RC(kvb_put(c, ns, k, page, PB), 0);
	CHECK_EQ(harness_stat(c, "copy.fill_puts"), 0);
	memset(hb, 0, 64 * 1024);
	CHECK_RC(kvb_view_get(c, view, k, 0, 0, 0), PB);
	CHECK(harness_verify(hb, TPP * BPT, &k, 77, "view GET through the fallback") == 0);
	parts[1].page_stride = (uint64_t)TPP * BPT; /* == tpp * stride: VIEW_CREATE means it */
	CHECK_OK(kvb_view_create2(c, ns, parts, LAYERS, 0, &view));
	parts[1].page_stride = 2ull * TPP * BPT;
	CHECK_RC(kvb_view_create2(c, ns, parts, LAYERS, 0, &view), -EOPNOTSUPP);

	fd = memfd_create("t_abi_compat", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	CHECK(fd >= 0);
	CHECK_OK(ftruncate(fd, 65536));
	CHECK_RC(kvb_buf_register_host_fd(c, fd, 0, 65536, NULL, KVB_BUF_SEAL, &hid), -EOPNOTSUPP);
	close(fd);

	cfd = kvb_completion_fd(c);
	CHECK(cfd >= 0);
	{
		struct kvb_op op = {.opcode = KVB_OP_NOP, .user_data = 1};
		struct kvb_completion out;
		struct pollfd p = {.fd = cfd, .events = POLLIN};

		CHECK_RC(kvb_submit(c, &op, 1), 1);
		CHECK_EQ(poll(&p, 1, 5000), 1);
		CHECK_RC(kvb_reap(c, &out, 1, 0, 0), 1);
		CHECK_RC(kvb_reap(c, &out, 1, 0, 0), 0);
	}

	CHECK_EQ(count_type(KVB_MSG_BUF_REG_FD), 0);
	CHECK_EQ(count_type(KVB_MSG_VIEW_CREATE2), 0);
	CHECK_EQ(count_type(KVB_MSG_VIEW_CREATE), 2);
	for (uint32_t i = 0; i < seen->n; i++)
		if (seen->type[i] == KVB_MSG_NS_OPEN)
			CHECK_EQ(seen->len[i],
				 sizeof(struct kvb_msg_hdr) + sizeof(struct kvb_layout));
	CHECK_EQ(count_type(KVB_MSG_NS_OPEN), 2);
	harness_log("ABI 1.1 broker: %u requests, none of ABI 1.2", seen->n);

	/* The same library straight to the broker: a filled PUT, and a byte-exact page. */
	{
		kvb_client *d = harness_connect(b, "t_abi_compat-direct", 0);
		kvb_key k2 = harness_key(77, 2);

		CHECK_OK(kvb_ns_open(d, &l, &ns, &pb));
		harness_fill(page, PB, &k2, 77);
		CHECK_RC(kvb_put(d, ns, k2, page, PB), 0);
		CHECK_EQ(harness_stat(d, "copy.fill_puts"), 1);
		memset(page, 0, PB);
		CHECK_RC(kvb_get(d, ns, k2, page, PB), PB);
		CHECK(harness_verify(page, PB, &k2, 77, "filled PUT") == 0);
		kvb_close(d);
	}

	kvb_close(c);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	harness_broker_stop(b);
	return H_PASS;
}
