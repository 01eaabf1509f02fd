// SPDX-License-Identifier: MIT
/*
 * t_limits.c - per-client limits and capability checks, each a regression test for a review
 * finding: registered host memory is capped (--max-buf-bytes), one client cannot use up the
 * namespace table, a layout with bytes after a string's NUL is refused (it would silently split
 * a namespace), a lease id is honoured only for the client holding it, and a connection that
 * never says HELLO is closed while everyone else is served.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"

static void buffers_capped(struct harness_broker *b)
{
	kvb_client *c = harness_connect(b, "bufs", 0);
	uint32_t id1, id2, id3 = 999;
	void *p1, *p2;

	p1 = kvb_buf_alloc_host(c, 4u << 20, &id1);
	p2 = kvb_buf_alloc_host(c, 4u << 20, &id2);
	CHECK(p1 && p2);
	errno = 0;
	CHECK(kvb_buf_alloc_host(c, 4096, &id3) == NULL && errno == ENOMEM); /* 8 MiB cap reached */
	CHECK_EQ(id3, 999);
	CHECK_OK(kvb_buf_unregister(c, id1));
	CHECK(kvb_buf_alloc_host(c, 4096, &id3) != NULL); /* room again */
	kvb_close(c);
}

static void namespaces_capped(struct harness_broker *b)
{
	kvb_client *c = harness_connect(b, "ns-hog", 0), *d = harness_connect(b, "ns-ok", 0);
	struct kvb_layout l;
	char model[32];
	uint32_t ns;
	int i;

	for (i = 0; i < 64; i++) {
		snprintf(model, sizeof(model), "hog-%d", i);
		harness_layout(&l, model, KVB_LAYOUT_MLA, 16, 1, 0, 1, 256);
		CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	}
	harness_layout(&l, "hog-64", KVB_LAYOUT_MLA, 16, 1, 0, 1, 256);
	CHECK_RC(kvb_ns_open(c, &l, &ns, NULL), -EMFILE);
	/* Re-opening one it already has is fine, and other clients are unaffected. */
	harness_layout(&l, "hog-3", KVB_LAYOUT_MLA, 16, 1, 0, 1, 256);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	harness_layout(&l, "other", KVB_LAYOUT_MLA, 16, 1, 0, 1, 256);
	CHECK_OK(kvb_ns_open(d, &l, &ns, NULL));
	kvb_close(c);
	kvb_close(d);
}

static void layout_garbage_after_nul(struct harness_broker *b)
{
	struct harness_raw r;
	struct kvb_layout l;
	uint32_t ns;
	uint64_t pb;

	CHECK_OK(harness_raw_hello(&r, b->sock, KVB_ABI_MAJOR, 8));
	harness_layout(&l, "m", KVB_LAYOUT_MLA, 16, 1, 0, 1, 256);
	l.model[5] = 'x'; /* "m\0\0\0\0x..." */
	CHECK_RC(harness_raw_ns_open(&r, &l, &ns, &pb), -EINVAL);
	harness_layout(&l, "m", KVB_LAYOUT_MLA, 16, 1, 0, 1, 256);
	l.comp[0].name[10] = 'y';
	CHECK_RC(harness_raw_ns_open(&r, &l, &ns, &pb), -EINVAL);
	harness_layout(&l, "m", KVB_LAYOUT_MLA, 16, 1, 0, 1, 256);
	CHECK_OK(harness_raw_ns_open(&r, &l, &ns, &pb));
	harness_raw_close(&r);
}

static void lease_is_a_capability(struct harness_broker *b)
{
	kvb_client *a = harness_connect(b, "holder", 0), *e = harness_connect(b, "thief", 0);
	struct kvb_op op = {.opcode = KVB_OP_RELEASE, .user_data = 42};
	struct kvb_completion cqe;
	struct kvb_layout l;
	struct kvb_lease lease;
	uint8_t page[4096];
	kvb_key k = harness_key(3, 1);
	uint32_t ns;

	harness_layout(&l, "cap", KVB_LAYOUT_MLA, 16, 1, 0, 1, 256);
	CHECK_OK(kvb_ns_open(a, &l, &ns, NULL));
	CHECK_OK(kvb_ns_open(e, &l, &ns, NULL));
	harness_fill(page, sizeof(page), &k, 3);
	CHECK_OK(kvb_put(a, ns, k, page, sizeof(page)));
	CHECK_OK(kvb_acquire(a, ns, k, &lease));
	/* Another client presenting the holder's lease id gets -EINVAL and releases nothing. */
	op.off = lease.id;
	CHECK_RC(kvb_submit(e, &op, 1), 1);
	CHECK_RC(kvb_reap(e, &cqe, 1, 1, 5000), 1);
	CHECK_EQ(cqe.user_data, 42);
	CHECK_RC(cqe.res, -EINVAL);
	CHECK_EQ(harness_stat(a, "leases"), 1);
	/* A forged id (right slot, wrong generation) fails too. */
	op.off = lease.id ^ (1ull << 40);
	CHECK_RC(kvb_submit(a, &op, 1), 1);
	CHECK_RC(kvb_reap(a, &cqe, 1, 1, 5000), 1);
	CHECK_RC(cqe.res, -EINVAL);
	CHECK_OK(harness_verify(lease.data, lease.len, &k, 3, "leased page"));
	CHECK_OK(kvb_release(a, &lease));
	CHECK_EQ(harness_stat(a, "leases"), 0);
	kvb_close(a);
	kvb_close(e);
}

static void silent_connection_closed(struct harness_broker *b)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	struct pollfd p = {.fd = fd, .events = POLLIN};
	kvb_client *c;
	uint64_t t0 = harness_now_ms();

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", b->sock);
	CHECK_OK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)));
	/* Everyone else is served meanwhile. */
	c = harness_connect(b, "honest", 0);
	CHECK_OK(kvb_nop(c));
	CHECK_EQ(poll(&p, 1, 8000), 1);
	CHECKF(harness_now_ms() - t0 >= 4000, "closed after %llu ms, before the HELLO timeout",
	       (unsigned long long)(harness_now_ms() - t0));
	CHECK(harness_broker_log_has(b, "no HELLO in time"));
	CHECK_OK(kvb_nop(c));
	kvb_close(c);
	close(fd);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M", "--max-buf-bytes", "8M");
	buffers_capped(b);
	namespaces_capped(b);
	layout_garbage_after_nul(b);
	lease_is_a_capability(b);
	silent_connection_closed(b);
	CHECK(harness_broker_alive(b));
	harness_broker_stop(b);
	return H_PASS;
}
