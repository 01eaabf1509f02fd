// SPDX-License-Identifier: MIT
/*
 * t_ns_ident.c - namespace identity beyond the layout (kvb_ns_open2, struct kvb_ns_ident), in
 * a real broker with several clients, as two deployments on one node would use it:
 *   - MLA stays shared across TP ranks (another process, another tp_rank, same identity: one
 *     namespace, and a page one rank PUT is a hit for the other), and across DP replicas;
 *   - bf16 and fp16 of the same byte size, pipeline stages, context-parallel ranks and page
 *     formats are separate namespaces: a page stored in one is a miss in the other;
 *   - MHA keeps tp_rank in its identity;
 *   - the default identity (NULL, all zero, sizes of 1, dp only) is the namespace kvb_ns_open()
 *     and an ABI 1.1 client's NS_OPEN (the 196-byte layout alone, sent raw here) open;
 *   - malformed identities are refused by the library and, sent raw, by the broker; so are
 *     ABI 1.2 messages with non-zero reserved fields.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"

#define TPP 16
#define LAYERS 2
#define BPT 512
#define PB (TPP * LAYERS * BPT)
#define SEED 4242

static struct harness_broker *br;

static uint32_t open2(kvb_client *c, const struct kvb_layout *l, const struct kvb_ns_ident *id)
{
	uint32_t ns;
	size_t pb;

	CHECK_OK(kvb_ns_open2(c, l, id, &ns, &pb));
	CHECK_EQ(pb, PB);
	return ns;
}

static struct kvb_layout layout(uint32_t kind, uint32_t tp_size, uint32_t tp_rank)
{
	struct kvb_layout l;

	harness_layout(&l, "test/ns-ident", kind, TPP, tp_size, tp_rank, LAYERS, BPT);
	return l;
}

static struct kvb_ns_ident bf16(void)
{
	struct kvb_ns_ident id = {0};

	id.dtype[0] = KVB_DTYPE_BF16;
	return id;
}

/* Another process, another TP rank, another DP replica: PUTs into what it gets for bf16. */
static int other_rank(int idx, void *arg)
{
	kvb_client *c = harness_connect(br, "t_ns_ident-rank", 0);
	struct kvb_layout l = layout(KVB_LAYOUT_MLA, 8, 5);
	struct kvb_ns_ident id = bf16();
	uint32_t *shared = arg, ns;
	uint8_t page[PB];
	kvb_key k = harness_key(SEED, 1);

	(void)idx;
	id.dp_size = 4;
	id.dp_rank = 3;
	ns = open2(c, &l, &id);
	shared[0] = ns;
	harness_fill(page, PB, &k, SEED);
	CHECK_RC(kvb_put(c, ns, k, page, PB), 0);
	kvb_close(c);
	return 0;
}

int main(int argc, char **argv)
{
	struct kvb_layout mla = layout(KVB_LAYOUT_MLA, 8, 0), l;
	struct kvb_ns_ident id, z = {0};
	uint32_t *shared, base, nb, nf, n, def;
	kvb_key k = harness_key(SEED, 1);
	uint8_t page[PB];
	kvb_client *c;
	size_t hits;

	harness_init(argc, argv);
	br = harness_broker_start("--pool", "32M");
	c = harness_connect(br, "t_ns_ident", 0);
	shared = harness_shared(64);

	/* The default identity, every way it can be spelled. */
	def = open2(c, &mla, NULL);
	CHECK_EQ(open2(c, &mla, &z), def);
	id = z;
	id.pp_size = id.cp_size = id.dp_size = 1;
	CHECK_EQ(open2(c, &mla, &id), def);
	id.dp_size = 2;
	id.dp_rank = 1;
	CHECK_EQ(open2(c, &mla, &id), def);
	{
		size_t pb;

		CHECK_OK(kvb_ns_open(c, &mla, &n, &pb));
		CHECK_EQ(n, def);
	}

	/* MLA, bf16: shared with another process on another TP rank and DP replica. */
	id = bf16();
	nb = open2(c, &mla, &id);
	CHECK_NE(nb, def);
	CHECK_EQ(harness_run_children(1, other_rank, shared, 30000), 0);
	CHECK_EQ(shared[0], nb);
	CHECK_RC(kvb_get(c, nb, k, page, PB), PB);
	CHECK(harness_verify(page, PB, &k, SEED, "bf16 page another TP rank stored") == 0);

	/* fp16 of the same bytes is other data: its own namespace, where the page is a miss. */
	id.dtype[0] = KVB_DTYPE_FP16;
	nf = open2(c, &mla, &id);
	CHECK_NE(nf, nb);
	CHECK_NE(nf, def);
	CHECK_RC(kvb_get(c, nf, k, page, PB), -ENOENT);
	CHECK_RC(kvb_get(c, def, k, page, PB), -ENOENT);
	CHECK_OK(kvb_lookup(c, nf, &k, 1, &hits));
	CHECK_EQ(hits, 0);

	/* Pipeline stages, context-parallel ranks, page formats: each its own namespace. */
	id = bf16();
	id.pp_size = 2;
	base = open2(c, &mla, &id);
	CHECK_NE(base, nb);
	id.pp_rank = 1;
	n = open2(c, &mla, &id);
	CHECK_NE(n, base);
	CHECK_RC(kvb_get(c, n, k, page, PB), -ENOENT);
	{
		char *js = harness_stats(c), path[64];

		snprintf(path, sizeof(path), "namespaces[id=%u].pp_size", n);
		CHECK_EQ(harness_stat_u64(js, path), 2);
		snprintf(path, sizeof(path), "namespaces[id=%u].pp_rank", n);
		CHECK_EQ(harness_stat_u64(js, path), 1);
		snprintf(path, sizeof(path), "namespaces[id=%u].cp_size", def);
		CHECK_EQ(harness_stat_u64(js, path), 1);
		CHECK(strstr(js, "\"dtype\":[\"bf16\"]") != NULL);
		CHECK(strstr(js, "\"dtype\":[\"unspec\"]") != NULL);
		free(js);
	}
	id = bf16();
	id.cp_size = 2;
	id.cp_rank = 1;
	n = open2(c, &mla, &id);
	CHECK_NE(n, nb);
	CHECK_RC(kvb_get(c, n, k, page, PB), -ENOENT);
	id = bf16();
	strcpy(id.page_format, "sglang:page_first");
	n = open2(c, &mla, &id);
	CHECK_NE(n, nb);
	CHECK_RC(kvb_get(c, n, k, page, PB), -ENOENT);

	/* MHA: tp_rank stays identity. */
	id = bf16();
	l = layout(KVB_LAYOUT_MHA, 2, 0);
	n = open2(c, &l, &id);
	l = layout(KVB_LAYOUT_MHA, 2, 1);
	CHECK_NE(open2(c, &l, &id), n);
	l = layout(KVB_LAYOUT_MHA, 2, 0);
	CHECK_EQ(open2(c, &l, &id), n);

	/* Malformed identities, refused by the library. */
	id = bf16();
	id.pp_rank = 1;
	CHECK_RC(kvb_ns_open2(c, &mla, &id, &n, NULL), -EINVAL);
	id = bf16();
	id.dtype[1] = KVB_DTYPE_BF16;
	CHECK_RC(kvb_ns_open2(c, &mla, &id, &n, NULL), -EINVAL);
	id = bf16();
	id.flags = 1;
	CHECK_RC(kvb_ns_open2(c, &mla, &id, &n, NULL), -EINVAL);
	id = bf16();
	id.dtype[0] = 200;
	CHECK_RC(kvb_ns_open2(c, &mla, &id, &n, NULL), -EINVAL);
	harness_log("identity: MLA shared across TP and DP; dtype, pp, cp, format separate");

	/* Raw: an ABI 1.1 client's NS_OPEN is the layout alone; 1.2 messages checked by the broker. */
	{
		struct harness_raw r;
		struct kvb_msg_ns_reply rep;
		uint8_t body[KVB_MSG_NS_OPEN_V2_SIZE];
		uint64_t pb;
		uint32_t rns;

		CHECK_OK(harness_raw_hello(&r, br->sock, KVB_ABI_MAJOR, 0));
		CHECK_OK(harness_raw_ns_open(&r, &mla, &rns, &pb));
		CHECK_EQ(rns, def);
		CHECK_EQ(pb, PB);
		id = bf16();
		memcpy(body, &mla, sizeof(mla));
		memcpy(body + sizeof(mla), &id, sizeof(id));
		CHECK_RC(harness_raw_call(&r, KVB_MSG_NS_OPEN, body, sizeof(body), -1, &rep,
					  sizeof(rep)),
			 0);
		CHECK_EQ(rep.ns, nb);
		id.resv[0] = 1;
		memcpy(body + sizeof(mla), &id, sizeof(id));
		CHECK_RC(harness_raw_call(&r, KVB_MSG_NS_OPEN, body, sizeof(body), -1, &rep,
					  sizeof(rep)),
			 -EINVAL);
		id = bf16();
		strcpy(id.page_format, "bad format");
		memcpy(body + sizeof(mla), &id, sizeof(id));
		CHECK_RC(harness_raw_call(&r, KVB_MSG_NS_OPEN, body, sizeof(body), -1, &rep,
					  sizeof(rep)),
			 -EINVAL);
		{
			/* Bit 0 is KVB_BUF_REG_FD_FDCOPY: an unknown flag bit. */
			struct kvb_msg_buf_reg_fd m = {.off = 0, .len = 4096, .flags = 2};
			int fd = memfd_create("t_ns_ident", MFD_CLOEXEC | MFD_ALLOW_SEALING);

			CHECK(fd >= 0);
			CHECK_OK(ftruncate(fd, 4096));
			CHECK_OK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK));
			CHECK_RC(harness_raw_call(&r, KVB_MSG_BUF_REG_FD, &m, sizeof(m), fd, NULL,
						  0),
				 -EINVAL);
			m.flags = 0;
			m.resv = 1;
			CHECK_RC(harness_raw_call(&r, KVB_MSG_BUF_REG_FD, &m, sizeof(m), fd, NULL,
						  0),
				 -EINVAL);
			close(fd);
		}
		{
			struct {
				struct kvb_msg_view_create2 h;
				struct kvb_view_part2 p[LAYERS];
			} vc;

			memset(&vc, 0, sizeof(vc));
			vc.h.ns = rns;
			vc.h.nparts = LAYERS;
			vc.h.flags = 1;
			CHECK_RC(harness_raw_call(&r, KVB_MSG_VIEW_CREATE2, &vc, sizeof(vc), -1,
						  NULL, 0),
				 -EINVAL);
		}
		/* The broker is still talking to this session. */
		CHECK_OK(harness_raw_ns_open(&r, &mla, &rns, &pb));
		harness_raw_close(&r);
	}
	kvb_close(c);
	harness_broker_stop(br);
	return H_PASS;
}
