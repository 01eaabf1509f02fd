// SPDX-License-Identifier: MIT
/*
 * test_proto.c - every check in proto/proto.c, one malformed field at a time: the ring region
 * geometry and its client-side check, control message framing, namespace layouts (including the
 * real Kimi-K2.5 MLA page), the static shape of each SQE opcode, and the default socket path.
 *
 * These functions are the first thing untrusted bytes meet, on both sides of the socket, so each
 * test starts from a valid input, breaks exactly one field and expects the exact errno.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto.h"

/* ---- region geometry ---- */

static void test_proto_region_layout_geometry(void **state)
{
	struct kvb_region_hdr h;
	int64_t size;

	(void)state;
	size = kvb_region_layout(256, 1u << 20, &h);
	assert_true(size > 0);
	assert_int_equal(h.magic, KVB_REGION_MAGIC);
	assert_int_equal(h.abi_major, KVB_ABI_MAJOR);
	assert_int_equal(h.abi_minor, KVB_ABI_MINOR);
	assert_int_equal(h.hdr_size, sizeof(struct kvb_region_hdr));
	assert_true(h.features & KVB_FEAT_NEED_WAKEUP);
	assert_true(h.features & KVB_FEAT_NOTES);
	assert_int_equal(h.sq_entries, 256);
	assert_int_equal(h.cq_entries, 512);

	/*
	 * Words written by different sides live on different cache lines, and none shares the
	 * header's line: sq tail (client), sq head + flags (broker), cq tail (broker), cq head +
	 * flags (client).
	 */
	assert_int_equal(h.sq_tail_off / 64, 1);
	assert_int_equal(h.sq_head_off / 64, h.sq_flags_off / 64);
	assert_int_equal(h.cq_head_off / 64, h.cq_flags_off / 64);
	{
		uint32_t lines[4] = {h.sq_tail_off / 64, h.sq_head_off / 64, h.cq_tail_off / 64,
				     h.cq_head_off / 64};

		for (int i = 0; i < 4; i++) {
			assert_true(lines[i] > 0);
			for (int j = 0; j < i; j++)
				assert_int_not_equal(lines[i], lines[j]);
		}
	}
	/* Each word is 4-byte aligned (atomics) and the arrays follow the last control line. */
	assert_int_equal(h.sq_flags_off % 4, 0);
	assert_int_equal(h.cq_flags_off % 4, 0);
	assert_int_equal(h.sqes_off, KVB_REGION_SQES);
	assert_true(h.sqes_off >= (h.cq_head_off / 64 + 1) * 64);
	assert_int_equal(h.sqes_off % 64, 0);
	assert_int_equal(h.cqes_off, h.sqes_off + 256 * sizeof(struct kvb_sqe));
	assert_int_equal(h.cqes_off % 64, 0);
	assert_true(h.arg_off >= h.cqes_off + 512 * sizeof(struct kvb_cqe));
	assert_int_equal(h.arg_off % 4096, 0);
	assert_int_equal(h.arg_off, 36864); /* 320 + 16384 + 16384 rounded up to 4 KiB */
	assert_int_equal(h.arg_size, 1u << 20);
	/* [notes] The note ring follows the argument area, its two index lines apart. */
	assert_int_equal(kvb_region_notes_off(&h), (uint64_t)h.arg_off + (1 << 20));
	assert_int_equal(KVB_NOTES_HEAD / 64, KVB_NOTES_TAIL / 64 + 1);
	assert_int_equal(KVB_NOTES_SQES % 64, 0);
	assert_int_equal(kvb_region_hz_off(&h), kvb_region_notes_off(&h) + KVB_NOTES_BYTES);
	assert_true(h.features & KVB_FEAT_HAZARDS);
	assert_int_equal(size, (int64_t)h.arg_off + (1 << 20) + KVB_NOTES_BYTES + KVB_HZ_BYTES);

	/* The argument area is rounded up to 4 KiB; 0 is allowed. */
	size = kvb_region_layout(8, 1, &h);
	assert_int_equal(h.arg_size, 4096);
	assert_int_equal(size, (int64_t)h.arg_off + 4096 + KVB_NOTES_BYTES + KVB_HZ_BYTES);
	size = kvb_region_layout(8, 0, &h);
	assert_int_equal(h.arg_size, 0);
	assert_int_equal(size, (int64_t)h.arg_off + KVB_NOTES_BYTES + KVB_HZ_BYTES);
	assert_int_equal(h.cqes_off, 320 + 8 * 64);
	assert_int_equal(h.arg_off, 4096);

	/* Largest ring and argument area. */
	size = kvb_region_layout(KVB_SQ_MAX, 64u << 20, &h);
	assert_true(size > 0);
	assert_int_equal(h.cq_entries, 2 * KVB_SQ_MAX);
	assert_int_equal(h.arg_size, 64u << 20);
	assert_int_equal(size, (int64_t)h.arg_off + (64 << 20) + KVB_NOTES_BYTES + KVB_HZ_BYTES);
}

static void test_proto_region_layout_bad_sq_entries(void **state)
{
	static const uint32_t bad[] = {0, 1, 2, 4, 3, 12, 255, 257, 8192, 1u << 31, UINT32_MAX};
	struct kvb_region_hdr h;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int64_t rc = kvb_region_layout(bad[i], 4096, &h);

		if (rc != -EINVAL)
			print_error("sq_entries %u: got %lld\n", bad[i], (long long)rc);
		assert_int_equal(rc, -EINVAL);
	}
	for (uint32_t n = KVB_SQ_MIN; n <= KVB_SQ_MAX; n *= 2)
		assert_true(kvb_region_layout(n, 4096, &h) > 0);
	/* Argument area above 64 MiB. */
	assert_int_equal(kvb_region_layout(256, (64u << 20) + 1, &h), -EINVAL);
	assert_int_equal(kvb_region_layout(256, UINT32_MAX, &h), -EINVAL);
}

static void test_proto_region_check(void **state)
{
	struct kvb_region_hdr good, h;
	int64_t size;

	(void)state;
	size = kvb_region_layout(128, 65536, &good);
	assert_true(size > 0);
	assert_int_equal(kvb_region_check(&good, (uint64_t)size), 0);
	/* A region larger than needed is fine; a smaller one is not. */
	assert_int_equal(kvb_region_check(&good, (uint64_t)size + 4096), 0);
	assert_int_equal(kvb_region_check(&good, (uint64_t)size - 1), -EPROTO);
	assert_int_equal(kvb_region_check(&good, 0), -EPROTO);
	/*
	 * [notes] A broker of ABI 1.5 or older: no note ring and no hazard table, the region ends
	 * at the arg area; a hazard table without a note ring is not ours.
	 */
	h = good;
	h.features &= ~(KVB_FEAT_NOTES | KVB_FEAT_HAZARDS);
	size -= KVB_NOTES_BYTES + KVB_HZ_BYTES;
	assert_int_equal(kvb_region_check(&h, (uint64_t)size), 0);
	assert_int_equal(kvb_region_check(&good, (uint64_t)size), -EPROTO);
	assert_int_equal(kvb_region_check(&h, (uint64_t)size - 1), -EPROTO);
	h.features |= KVB_FEAT_HAZARDS;
	assert_int_equal(kvb_region_check(&h, (uint64_t)size + KVB_NOTES_BYTES + KVB_HZ_BYTES),
			 -EPROTO);
	assert_int_equal(kvb_region_check(&good, (uint64_t)size + KVB_NOTES_BYTES), -EPROTO);
	size += KVB_NOTES_BYTES + KVB_HZ_BYTES;
	/* A newer broker may have a bigger header; a smaller one is not ours. */
	h = good;
	h.hdr_size = 128;
	assert_int_equal(kvb_region_check(&h, (uint64_t)size), 0);
	h.hdr_size = 63;
	assert_int_equal(kvb_region_check(&h, (uint64_t)size), -EPROTO);
	h = good;
	h.magic ^= 1;
	assert_int_equal(kvb_region_check(&h, (uint64_t)size), -EPROTO);
	h = good;
	h.abi_major++;
	assert_int_equal(kvb_region_check(&h, (uint64_t)size), -EPROTO);
	/* A minor bump is compatible by definition. */
	h = good;
	h.abi_minor++;
	assert_int_equal(kvb_region_check(&h, (uint64_t)size), 0);

	/* sq_entries: not a power of two, out of range, or another valid size (offsets disagree). */
	h = good;
	h.sq_entries = 100;
	assert_int_equal(kvb_region_check(&h, (uint64_t)size), -EPROTO);
	h.sq_entries = 0;
	assert_int_equal(kvb_region_check(&h, (uint64_t)size), -EPROTO);
	h.sq_entries = 1u << 20;
	assert_int_equal(kvb_region_check(&h, (uint64_t)size), -EPROTO);
	h.sq_entries = 64;
	assert_int_equal(kvb_region_check(&h, (uint64_t)size), -EPROTO);
	h.sq_entries = 256;
	assert_int_equal(kvb_region_check(&h, (uint64_t)size + (1 << 20)), -EPROTO);

	/* Every offset and count, moved by a little and by a cache line. */
	{
		static const size_t fields[] = {
			offsetof(struct kvb_region_hdr, cq_entries),
			offsetof(struct kvb_region_hdr, sq_tail_off),
			offsetof(struct kvb_region_hdr, sq_head_off),
			offsetof(struct kvb_region_hdr, sq_flags_off),
			offsetof(struct kvb_region_hdr, cq_tail_off),
			offsetof(struct kvb_region_hdr, cq_head_off),
			offsetof(struct kvb_region_hdr, cq_flags_off),
			offsetof(struct kvb_region_hdr, sqes_off),
			offsetof(struct kvb_region_hdr, cqes_off),
			offsetof(struct kvb_region_hdr, arg_off),
		};
		static const int64_t delta[] = {1, -1, 4, 64, -64, 4096, 1 << 30};

		for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
			for (size_t j = 0; j < sizeof(delta) / sizeof(delta[0]); j++) {
				uint32_t v;
				int rc;

				h = good;
				memcpy(&v, (char *)&h + fields[i], 4);
				v = (uint32_t)((int64_t)v + delta[j]);
				memcpy((char *)&h + fields[i], &v, 4);
				rc = kvb_region_check(&h, (uint64_t)size);
				if (rc != -EPROTO)
					print_error("field at %zu, delta %lld: got %d\n", fields[i],
						    (long long)delta[j], rc);
				assert_int_equal(rc, -EPROTO);
			}
		}
	}

	/* An argument area that runs past the end of the region. */
	h = good;
	h.arg_size = good.arg_size + 4096;
	assert_int_equal(kvb_region_check(&h, (uint64_t)size), -EPROTO);
	h.arg_size = UINT32_MAX;
	assert_int_equal(kvb_region_check(&h, (uint64_t)size), -EPROTO);
	h.arg_size = 128u << 20;
	assert_int_equal(kvb_region_check(&h, 1ull << 40), -EPROTO);
}

/* ---- control messages ---- */

/* Builds a request of type with body_len bytes of body into buf; returns the datagram length. */
static size_t mkmsg(void *buf, uint16_t type, uint16_t flags, size_t body_len)
{
	struct kvb_msg_hdr h = {
		.magic = KVB_MSG_MAGIC,
		.type = type,
		.flags = flags,
		.len = (uint32_t)(sizeof(h) + body_len),
		.seq = 7,
	};

	memset(buf, 0, sizeof(h) + body_len);
	memcpy(buf, &h, sizeof(h));
	return sizeof(h) + body_len;
}

static void test_proto_msg_body_min(void **state)
{
	(void)state;
	assert_int_equal(kvb_msg_body_min(KVB_MSG_HELLO), KVB_MSG_HELLO_V0_SIZE);
	assert_int_equal(kvb_msg_body_min(KVB_MSG_NS_OPEN), sizeof(struct kvb_layout));
	assert_int_equal(kvb_msg_body_min(KVB_MSG_BUF_REG), sizeof(struct kvb_msg_buf_reg));
	assert_int_equal(kvb_msg_body_min(KVB_MSG_BUF_UNREG), sizeof(struct kvb_msg_id));
	assert_int_equal(kvb_msg_body_min(KVB_MSG_VIEW_CREATE), sizeof(struct kvb_msg_view_create));
	assert_int_equal(kvb_msg_body_min(KVB_MSG_VIEW_DESTROY), sizeof(struct kvb_msg_id));
	assert_int_equal(kvb_msg_body_min(KVB_MSG_STATS), 0);
	assert_int_equal(kvb_msg_body_min(KVB_MSG_BUF_REG_FD), sizeof(struct kvb_msg_buf_reg_fd));
	assert_int_equal(kvb_msg_body_min(KVB_MSG_VIEW_CREATE2),
			 sizeof(struct kvb_msg_view_create2));
	assert_int_equal(kvb_msg_body_min(0), -1);
	assert_int_equal(kvb_msg_body_min(KVB_MSG__COUNT), -1);
	assert_int_equal(kvb_msg_body_min(0xffff), -1);
}

static void test_proto_msg_check(void **state)
{
	static char buf[KVB_MSG_MAX + 64];
	struct kvb_msg_hdr *h = (struct kvb_msg_hdr *)buf;
	size_t len;

	(void)state;
	/* Every request type at exactly its minimum body, and one byte short of it. */
	for (uint16_t t = 1; t < KVB_MSG__COUNT; t++) {
		size_t min = (size_t)kvb_msg_body_min(t);

		print_message("# type %u, minimum body %zu\n", t, min);
		len = mkmsg(buf, t, 0, min);
		assert_int_equal(kvb_msg_check(buf, len), 0);
		if (min) {
			len = mkmsg(buf, t, 0, min - 1);
			assert_int_equal(kvb_msg_check(buf, len), -EPROTO);
		}
		/* Longer bodies (VIEW_CREATE parts, ...) are the handler's to check. */
		len = mkmsg(buf, t, 0, min + 16);
		assert_int_equal(kvb_msg_check(buf, len), 0);
	}

	/* Short: less than a header. */
	len = mkmsg(buf, KVB_MSG_STATS, 0, 0);
	assert_int_equal(kvb_msg_check(buf, 0), -EPROTO);
	assert_int_equal(kvb_msg_check(buf, sizeof(*h) - 1), -EPROTO);

	/* Bad magic. */
	len = mkmsg(buf, KVB_MSG_STATS, 0, 0);
	h->magic = 0x4d42564b; /* byte-swapped */
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);

	/* The header's length disagrees with the datagram's. */
	len = mkmsg(buf, KVB_MSG_HELLO, 0, sizeof(struct kvb_msg_hello));
	h->len++;
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);
	h->len -= 2;
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);
	h->len = 0;
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);
	h->len = (uint32_t)len;
	assert_int_equal(kvb_msg_check(buf, len + 1), -EPROTO);

	/* Unknown types. */
	len = mkmsg(buf, 0, 0, 64);
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);
	len = mkmsg(buf, KVB_MSG__COUNT, 0, 64);
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);
	len = mkmsg(buf, 0xffff, 0, 64);
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);

	/* Too long: a request may be at most KVB_MSG_MAX bytes in all. */
	len = mkmsg(buf, KVB_MSG_VIEW_CREATE, 0, KVB_MSG_MAX - sizeof(*h));
	assert_int_equal(kvb_msg_check(buf, len), 0);
	len = mkmsg(buf, KVB_MSG_VIEW_CREATE, 0, KVB_MSG_MAX - sizeof(*h) + 1);
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);

	/* Unknown request flags. */
	len = mkmsg(buf, KVB_MSG_STATS, 2, 0);
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);
	len = mkmsg(buf, KVB_MSG_STATS, 0x8000, 0);
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);

	/*
	 * Replies: at least a struct kvb_msg_reply, a known type, and (stats) may exceed
	 * KVB_MSG_MAX; the request minimums do not apply.
	 */
	len = mkmsg(buf, KVB_MSG_HELLO, KVB_MSGF_REPLY, sizeof(struct kvb_msg_reply));
	assert_int_equal(kvb_msg_check(buf, len), 0);
	len = mkmsg(buf, KVB_MSG_HELLO, KVB_MSGF_REPLY, sizeof(struct kvb_msg_reply) - 1);
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);
	len = mkmsg(buf, KVB_MSG_STATS, KVB_MSGF_REPLY, 0);
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);
	len = mkmsg(buf, 0, KVB_MSGF_REPLY, sizeof(struct kvb_msg_reply));
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);
	len = mkmsg(buf, KVB_MSG__COUNT, KVB_MSGF_REPLY, sizeof(struct kvb_msg_reply));
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);
	len = mkmsg(buf, KVB_MSG_STATS, KVB_MSGF_REPLY, KVB_MSG_MAX + 16);
	assert_int_equal(kvb_msg_check(buf, len), 0);
	len = mkmsg(buf, KVB_MSG_STATS, KVB_MSGF_REPLY, sizeof(struct kvb_msg_reply));
	h->magic = 0;
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);
	len = mkmsg(buf, KVB_MSG_STATS, KVB_MSGF_REPLY, sizeof(struct kvb_msg_reply));
	h->len = 0;
	assert_int_equal(kvb_msg_check(buf, len), -EPROTO);
}

/* ---- layouts ---- */

static void set_comp(struct kvb_component *c, const char *name, uint32_t layers, uint32_t bytes)
{
	size_t n = strlen(name);

	memset(c, 0, sizeof(*c));
	memcpy(c->name, name, n < sizeof(c->name) ? n : sizeof(c->name));
	c->num_layers = layers;
	c->bytes_per_token_layer = bytes;
}

/* Kimi-K2.5 (DeepSeek-V3 MLA): 61 layers, (512 + 64) x bf16 = 1152 B per token per layer. */
static void kimi(struct kvb_layout *l)
{
	memset(l, 0, sizeof(*l));
	strcpy(l->model, "moonshotai/Kimi-K2.5");
	l->kind = KVB_LAYOUT_MLA;
	l->tokens_per_page = 64;
	l->tp_size = 8;
	l->tp_rank = 3;
	l->ncomponents = 1;
	set_comp(&l->comp[0], "kv", 61, 1152);
}

static void expect_layout(const struct kvb_layout *l, int want, const char *what)
{
	uint64_t pb = 12345;
	int rc = kvb_layout_check(l, &pb);

	if (rc != want)
		print_error("layout case '%s': got %d, want %d\n", what, rc, want);
	assert_int_equal(rc, want);
	if (want)
		assert_int_equal(pb, 12345); /* untouched on failure */
}

static void test_proto_layout_valid(void **state)
{
	struct kvb_layout l;
	uint64_t pb = 0;

	(void)state;
	kimi(&l);
	assert_int_equal(kvb_layout_check(&l, &pb), 0);
	assert_int_equal(pb, 4497408);
	assert_int_equal(pb, 61ull * 1152 * 64);
	assert_int_equal(kvb_layout_parts(&l), 61);
	assert_int_equal(kvb_layout_check(&l, NULL), 0);

	/* Main KV plus a sparse-attention indexer cache (DeepSeek-V3.2 style). */
	l.ncomponents = 2;
	set_comp(&l.comp[1], "indexer", 61, 132);
	assert_int_equal(kvb_layout_check(&l, &pb), 0);
	assert_int_equal(pb, 64ull * 61 * (1152 + 132));
	assert_int_equal(kvb_layout_parts(&l), 122);

	/* MHA, all four components, the longest names that fit. */
	memset(&l, 0, sizeof(l));
	memset(l.model, 'm', sizeof(l.model) - 1);
	l.kind = KVB_LAYOUT_MHA;
	l.tokens_per_page = 16;
	l.tp_size = 4;
	l.tp_rank = 3;
	l.ncomponents = 4;
	set_comp(&l.comp[0], "aaaaaaaaaaaaaaa", 2, 1);
	set_comp(&l.comp[1], "b", 3, 10);
	set_comp(&l.comp[2], "c", 4, 100);
	set_comp(&l.comp[3], "aaaaaaaaaaaaaab", 1, 1000);
	assert_int_equal(kvb_layout_check(&l, &pb), 0);
	assert_int_equal(pb, 16ull * (2 + 30 + 400 + 1000));
	assert_int_equal(kvb_layout_parts(&l), 10);

	/* Exactly the largest page and the most layers. */
	kimi(&l);
	l.tokens_per_page = 1;
	set_comp(&l.comp[0], "kv", 1024, 1u << 20);
	assert_int_equal(kvb_layout_check(&l, &pb), 0);
	assert_int_equal(pb, KVB_MAX_PAGE_BYTES);
}

static void test_proto_layout_malformed(void **state)
{
	struct kvb_layout l;

	(void)state;
	kimi(&l);
	l.model[0] = 0;
	expect_layout(&l, -EINVAL, "empty model");
	kimi(&l);
	memset(l.model, 'x', sizeof(l.model));
	expect_layout(&l, -EINVAL, "unterminated model");

	kimi(&l);
	l.comp[0].name[0] = 0;
	expect_layout(&l, -EINVAL, "empty component name");
	kimi(&l);
	memset(l.comp[0].name, 'k', sizeof(l.comp[0].name));
	expect_layout(&l, -EINVAL, "unterminated component name");
	kimi(&l);
	l.ncomponents = 2;
	set_comp(&l.comp[1], "kv", 61, 128);
	expect_layout(&l, -EINVAL, "duplicate component names");
	l.ncomponents = 3;
	set_comp(&l.comp[1], "indexer", 61, 128);
	set_comp(&l.comp[2], "indexer", 1, 1);
	expect_layout(&l, -EINVAL, "duplicate names, not adjacent to the first");

	kimi(&l);
	l.kind = 0;
	expect_layout(&l, -EINVAL, "kind 0");
	l.kind = 3;
	expect_layout(&l, -EINVAL, "kind 3");
	l.kind = UINT32_MAX;
	expect_layout(&l, -EINVAL, "kind ~0");

	kimi(&l);
	l.tokens_per_page = 0;
	expect_layout(&l, -EINVAL, "tokens_per_page 0");
	kimi(&l);
	l.tp_size = 0;
	l.tp_rank = 0;
	expect_layout(&l, -EINVAL, "tp_size 0");
	kimi(&l);
	l.tp_rank = l.tp_size;
	expect_layout(&l, -EINVAL, "tp_rank == tp_size");
	l.tp_rank = UINT32_MAX;
	expect_layout(&l, -EINVAL, "tp_rank ~0");
	l.tp_rank = l.tp_size - 1;
	expect_layout(&l, 0, "tp_rank == tp_size - 1");

	kimi(&l);
	l.ncomponents = 0;
	memset(&l.comp[0], 0, sizeof(l.comp[0]));
	expect_layout(&l, -EINVAL, "ncomponents 0");
	kimi(&l);
	l.ncomponents = 5;
	expect_layout(&l, -EINVAL, "ncomponents 5");
	l.ncomponents = UINT32_MAX;
	expect_layout(&l, -EINVAL, "ncomponents ~0");

	kimi(&l);
	l.comp[0].num_layers = 0;
	expect_layout(&l, -EINVAL, "num_layers 0");
	kimi(&l);
	l.comp[0].bytes_per_token_layer = 0;
	expect_layout(&l, -EINVAL, "bytes_per_token_layer 0");

	/* Unused component slots must be all zero (identity hashing is over the raw struct). */
	for (int slot = 1; slot < KVB_MAX_COMPONENTS; slot++) {
		kimi(&l);
		l.comp[slot].num_layers = 1;
		expect_layout(&l, -EINVAL, "garbage num_layers in an unused slot");
		kimi(&l);
		l.comp[slot].bytes_per_token_layer = 1;
		expect_layout(&l, -EINVAL, "garbage bytes in an unused slot");
		kimi(&l);
		l.comp[slot].name[KVB_COMP_NAME_MAX - 1] = 'z';
		expect_layout(&l, -EINVAL, "garbage name byte in an unused slot");
	}

	kimi(&l);
	l.flags = 1;
	expect_layout(&l, -EINVAL, "flags");
	l.flags = 0x80000000u;
	expect_layout(&l, -EINVAL, "flags high bit");
	for (int i = 0; i < 3; i++) {
		kimi(&l);
		l.resv[i] = 1;
		expect_layout(&l, -EINVAL, "resv");
	}
}

static void test_proto_layout_too_big(void **state)
{
	struct kvb_layout l;

	(void)state;
	/* One byte over 1 GiB. */
	kimi(&l);
	l.tokens_per_page = 1;
	set_comp(&l.comp[0], "kv", 1, (1u << 30) + 1);
	expect_layout(&l, -E2BIG, "page 1 GiB + 1");
	/* 2^20 tokens x 2 KiB = 2 GiB. */
	kimi(&l);
	l.tokens_per_page = 1u << 20;
	set_comp(&l.comp[0], "kv", 1, 2048);
	expect_layout(&l, -E2BIG, "page 2 GiB");
	/* Products that would overflow 32 (and, summed, 64) bits must not wrap around to small. */
	kimi(&l);
	set_comp(&l.comp[0], "kv", UINT32_MAX, UINT32_MAX);
	expect_layout(&l, -E2BIG, "layers x bytes overflow 32 bits");
	kimi(&l);
	l.ncomponents = 4;
	set_comp(&l.comp[0], "a", 1, 1u << 29);
	set_comp(&l.comp[1], "b", 1, 1u << 29);
	set_comp(&l.comp[2], "c", 1, 1u << 29);
	set_comp(&l.comp[3], "d", 1, 1u << 29);
	l.tokens_per_page = 1;
	expect_layout(&l, -E2BIG, "components sum to 2 GiB");
	kimi(&l);
	l.tokens_per_page = UINT32_MAX;
	set_comp(&l.comp[0], "kv", 1, 1);
	expect_layout(&l, -E2BIG, "4 G tokens");
	kimi(&l);
	l.tokens_per_page = UINT32_MAX;
	set_comp(&l.comp[0], "kv", 1000, 1u << 20);
	expect_layout(&l, -E2BIG, "4 G tokens x 1000 MiB per token");
	/* More (component, layer) parts than a view can describe. */
	kimi(&l);
	set_comp(&l.comp[0], "kv", KVB_MAX_VIEW_PARTS + 1, 1);
	expect_layout(&l, -E2BIG, "1025 layers");
	kimi(&l);
	l.ncomponents = 2;
	set_comp(&l.comp[0], "kv", 1000, 1);
	set_comp(&l.comp[1], "ix", 25, 1);
	expect_layout(&l, -E2BIG, "1025 layers over two components");
	set_comp(&l.comp[1], "ix", 24, 1);
	expect_layout(&l, 0, "1024 layers over two components");
}

/* ---- SQEs ---- */

static const uint8_t simple_ops[] = {KVB_OP_NOP, KVB_OP_DELETE, KVB_OP_ACQUIRE, KVB_OP_PREFETCH,
				     KVB_OP_RELEASE};

static void expect_sqe(const struct kvb_sqe *s, uint32_t arg_size, int want, const char *what)
{
	int rc = kvb_sqe_check(s, arg_size);

	if (rc != want)
		print_error("sqe case '%s' (opcode %u): got %d, want %d\n", what, s->opcode, rc,
			    want);
	assert_int_equal(rc, want);
}

static void sqe_init(struct kvb_sqe *s, uint8_t opcode)
{
	memset(s, 0, sizeof(*s));
	s->opcode = opcode;
	s->ns = 3;
	s->user_data = 0xfeedfacecafebeefull;
	if (opcode != KVB_OP_LOOKUP) {
		memset(s->key, 0xa5, sizeof(s->key));
		s->buf = 1;
		s->off = 4096;
	}
}

static void test_proto_sqe_simple_ops(void **state)
{
	struct kvb_sqe s;

	(void)state;
	for (size_t i = 0; i < sizeof(simple_ops); i++) {
		uint8_t op = simple_ops[i];

		sqe_init(&s, op);
		expect_sqe(&s, 4096, 0, "valid");
		/* ns, key, buf, off and user_data are broker state, not shape. */
		s.ns = UINT32_MAX;
		s.buf = UINT32_MAX;
		s.off = UINT64_MAX;
		expect_sqe(&s, 0, 0, "any ns/buf/off");
		sqe_init(&s, op);
		s.flags = KVB_OPF_VIEW;
		expect_sqe(&s, 4096, -EINVAL, "VIEW flag");
		sqe_init(&s, op);
		s.layer_first = 1;
		expect_sqe(&s, 4096, -EINVAL, "layer_first");
		sqe_init(&s, op);
		s.layer_count = 1;
		expect_sqe(&s, 4096, -EINVAL, "layer_count");
	}
}

static void test_proto_sqe_put_get(void **state)
{
	struct kvb_sqe s;

	(void)state;
	sqe_init(&s, KVB_OP_PUT);
	expect_sqe(&s, 4096, 0, "put");
	s.flags = KVB_OPF_VIEW;
	expect_sqe(&s, 4096, 0, "view put");
	s.layer_first = 1;
	expect_sqe(&s, 4096, -EINVAL, "view put with layer_first: a put is all or nothing");
	s.layer_first = 0;
	s.layer_count = 2;
	expect_sqe(&s, 4096, -EINVAL, "view put with layer_count");
	s.flags = 0;
	expect_sqe(&s, 4096, -EINVAL, "put with layer_count");
	sqe_init(&s, KVB_OP_PUT);
	s.flags = KVB_SQEF_FILL;
	expect_sqe(&s, 4096, 0, "filled put");
	s.flags = KVB_SQEF_FILL | KVB_OPF_VIEW;
	expect_sqe(&s, 4096, -EINVAL, "filled put of a view: one host buffer only");
	s.flags = KVB_SQEF_FILL;
	s.layer_count = 1;
	expect_sqe(&s, 4096, -EINVAL, "filled put with layer_count");

	sqe_init(&s, KVB_OP_GET);
	expect_sqe(&s, 4096, 0, "get");
	s.layer_first = 2;
	expect_sqe(&s, 4096, -EINVAL, "buffer get with layer_first");
	s.layer_first = 0;
	s.layer_count = 3;
	expect_sqe(&s, 4096, -EINVAL, "buffer get with layer_count");
	s.flags = KVB_OPF_VIEW;
	s.layer_first = 2;
	expect_sqe(&s, 4096, 0, "view get of a layer range");
	s.layer_first = UINT16_MAX;
	s.layer_count = UINT16_MAX;
	expect_sqe(&s, 4096, 0, "view get: the range is checked against the view by the broker");
}

static void test_proto_sqe_bad_header(void **state)
{
	static const uint8_t all_ops[] = {KVB_OP_NOP,	  KVB_OP_PUT,	  KVB_OP_GET,
					  KVB_OP_ACQUIRE, KVB_OP_RELEASE, KVB_OP_DELETE,
					  KVB_OP_LOOKUP,  KVB_OP_PREFETCH};
	struct kvb_sqe s;

	(void)state;
	for (unsigned op = KVB_OP__COUNT; op <= 255; op++) {
		sqe_init(&s, (uint8_t)op);
		expect_sqe(&s, 4096, -EINVAL, "unknown opcode");
	}
	for (size_t i = 0; i < sizeof(all_ops); i++) {
		sqe_init(&s, all_ops[i]);
		if (all_ops[i] == KVB_OP_LOOKUP)
			s.batch.count = 1, s.batch.out_off = 32;
		expect_sqe(&s, 4096, 0, "valid");
		s.resv0 = 1;
		expect_sqe(&s, 4096, -EINVAL, "resv0");
		s.resv0 = 0x8000;
		expect_sqe(&s, 4096, -EINVAL, "resv0 high bit");
		s.resv0 = 0;
		for (unsigned bit = 1; bit < 8; bit++) {
			int get_pair = all_ops[i] == KVB_OP_ACQUIRE || all_ops[i] == KVB_OP_RELEASE;
			int put = all_ops[i] == KVB_OP_PUT;
			/* KVB_OPF_PARENT (ABI 1.4): on a PUT only, view or not. */
			int parent = put && (1u << bit) == KVB_OPF_PARENT;

			s.flags = (uint8_t)(1u << bit);
			/*
			 * KVB_SQEF_GET: on a kvb_get()'s ACQUIRE and RELEASE only, as _HELD
			 * ([hazard]); _FILL on PUT.
			 */
			expect_sqe(&s, 4096,
				   ((s.flags == KVB_SQEF_GET || s.flags == KVB_SQEF_HELD) &&
				    get_pair) || (s.flags == KVB_SQEF_FILL && put) ||
						   parent
					   ? 0
					   : -EINVAL,
				   "unknown flag");
			s.flags = (uint8_t)((1u << bit) | KVB_OPF_VIEW);
			expect_sqe(&s, 4096, parent ? 0 : -EINVAL, "unknown flag with VIEW");
		}
		s.flags = 0;
	}
}

/* [chain] The parent key of a PUT lies inside the arg area, and needs one. */
static void test_proto_sqe_parent(void **state)
{
	struct kvb_sqe s;

	(void)state;
	sqe_init(&s, KVB_OP_PUT);
	s.flags = KVB_OPF_PARENT;
	s.parent_off = 4096 - 32;
	expect_sqe(&s, 4096, 0, "parent at the end");
	s.parent_off = 4096 - 31;
	expect_sqe(&s, 4096, -EINVAL, "parent past the end");
	s.parent_off = UINT32_MAX;
	expect_sqe(&s, 4096, -EINVAL, "parent offset wraps");
	s.parent_off = 0;
	expect_sqe(&s, 0, -EINVAL, "no arg area");
	s.flags = 0;
	s.parent_off = 32; /* the layer fields of a plain PUT */
	expect_sqe(&s, 4096, -EINVAL, "parent_off without the flag");
	sqe_init(&s, KVB_OP_GET);
	s.flags = KVB_OPF_PARENT | KVB_OPF_VIEW;
	expect_sqe(&s, 4096, -EINVAL, "parent on a view GET");
}

static void lookup_init(struct kvb_sqe *s, uint32_t arg_off, uint32_t count, uint32_t out_off)
{
	sqe_init(s, KVB_OP_LOOKUP);
	s->batch.arg_off = arg_off;
	s->batch.count = count;
	s->batch.out_off = out_off;
}

static void test_proto_sqe_lookup(void **state)
{
	const uint32_t arg = 1u << 20;
	struct kvb_sqe s;

	(void)state;
	/* 100 keys at 0 and their tier bytes right after. */
	lookup_init(&s, 0, 100, 3200);
	expect_sqe(&s, arg, 0, "keys then tiers");
	/* Tiers first, keys after; both ending exactly at the end of the argument area. */
	lookup_init(&s, arg - 3200, 100, arg - 3300);
	expect_sqe(&s, arg, 0, "tiers then keys, flush with the end");
	lookup_init(&s, 0, 0, 0);
	expect_sqe(&s, arg, 0, "empty batch");
	lookup_init(&s, arg, 0, arg);
	expect_sqe(&s, arg, 0, "empty batch at the end");
	/* Fills the whole area: 31775 keys + 31775 bytes <= 1 MiB. */
	lookup_init(&s, 0, arg / 33, (arg / 33) * 32);
	expect_sqe(&s, arg, 0, "as many keys as fit");

	/* Keys or tiers past the end. */
	lookup_init(&s, arg - 3199, 100, 0);
	expect_sqe(&s, arg, -EINVAL, "keys one byte past the end");
	lookup_init(&s, 0, 100, arg - 99);
	expect_sqe(&s, arg, -EINVAL, "tiers one byte past the end");
	lookup_init(&s, arg + 1, 0, 0);
	expect_sqe(&s, arg, -EINVAL, "empty batch past the end");
	lookup_init(&s, 0, 1, 32);
	expect_sqe(&s, 0, -EINVAL, "no argument area");

	/* Overflow: sums that would wrap in 32 bits must not. */
	lookup_init(&s, 0, 1u << 27, 0); /* 2^27 * 32 == 2^32 */
	expect_sqe(&s, arg, -EINVAL, "count x 32 wraps to 0 in 32 bits");
	lookup_init(&s, UINT32_MAX, 1, 0);
	expect_sqe(&s, arg, -EINVAL, "arg_off ~0");
	lookup_init(&s, UINT32_MAX - 31, 1, 0);
	expect_sqe(&s, UINT32_MAX, -EINVAL, "offset + 32 wraps in 32 bits");
	lookup_init(&s, 0, 1, UINT32_MAX);
	expect_sqe(&s, UINT32_MAX, -EINVAL, "out_off + count wraps in 32 bits");
	lookup_init(&s, 0, UINT32_MAX, 0);
	expect_sqe(&s, UINT32_MAX, -EINVAL, "count ~0");
	lookup_init(&s, 64, UINT32_MAX, 0);
	expect_sqe(&s, arg, -EINVAL, "count ~0 with keys after tiers");

	/* Tiers written back over the keys being read. */
	lookup_init(&s, 0, 100, 3199);
	expect_sqe(&s, arg, -EINVAL, "tiers overlap the last key");
	lookup_init(&s, 0, 100, 0);
	expect_sqe(&s, arg, -EINVAL, "tiers on top of the keys");
	lookup_init(&s, 100, 100, 1);
	expect_sqe(&s, arg, -EINVAL, "tiers overlap the first key");
	lookup_init(&s, 100, 100, 0);
	expect_sqe(&s, arg, 0, "tiers end where the keys start");
	lookup_init(&s, 1000, 10, 1100);
	expect_sqe(&s, arg, -EINVAL, "tiers inside the keys");

	/* Fields that a LOOKUP does not use. */
	lookup_init(&s, 0, 1, 32);
	s.flags = KVB_OPF_VIEW;
	expect_sqe(&s, arg, -EINVAL, "lookup with VIEW");
	lookup_init(&s, 0, 1, 32);
	s.buf = 1;
	expect_sqe(&s, arg, -EINVAL, "lookup with buf");
	lookup_init(&s, 0, 1, 32);
	s.off = 1;
	expect_sqe(&s, arg, -EINVAL, "lookup with off");
	lookup_init(&s, 0, 1, 32);
	s.layer_first = 1;
	expect_sqe(&s, arg, -EINVAL, "lookup with layer_first");
	lookup_init(&s, 0, 1, 32);
	s.layer_count = 1;
	expect_sqe(&s, arg, -EINVAL, "lookup with layer_count");
	for (int i = 0; i < 5; i++) {
		lookup_init(&s, 0, 1, 32);
		s.batch.resv1[i] = 1;
		expect_sqe(&s, arg, -EINVAL, "lookup resv1");
	}
}

/* ---- misc ---- */

static void test_proto_is_pow2(void **state)
{
	(void)state;
	assert_false(kvb_is_pow2(0));
	assert_true(kvb_is_pow2(1));
	assert_true(kvb_is_pow2(2));
	assert_false(kvb_is_pow2(3));
	assert_true(kvb_is_pow2(1ull << 63));
	assert_false(kvb_is_pow2(UINT64_MAX));
}

/* Open fds of this process, from /proc/self/fd. */
static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	assert_non_null(d);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

/* Sends "x" with n copies of fd 0 through s (kvb_msg_attach_fds). */
static void send_fds(int s, uint32_t n)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * 8)];
		struct cmsghdr align;
	} cm;
	int fds[8] = {0, 0, 0, 0, 0, 0, 0, 0};
	char x = 'x';
	struct iovec iov = {&x, 1};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

	kvb_msg_attach_fds(&mh, cm.b, fds, n);
	assert_int_equal(sendmsg(s, &mh, 0), 1);
}

static int recv_fds(int s, int *fds, uint32_t max, uint32_t *n)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * 8)];
		struct cmsghdr align;
	} cm;
	char c;
	struct iovec iov = {&c, 1};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cm.b,
			    .msg_controllen = sizeof(cm.b)};

	assert_int_equal(recvmsg(s, &mh, MSG_CMSG_CLOEXEC), 1);
	return kvb_msg_take_fds(&mh, fds, max, n);
}

/* The fd-passing pair: what is sent arrives; too many is -EPROTO with nothing left open. */
static void test_proto_fds_pair(void **state)
{
	int sv[2], fds[8], base;
	uint32_t n = 99;

	(void)state;
	assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv), 0);
	base = count_fds();
	send_fds(sv[0], 3);
	assert_int_equal(recv_fds(sv[1], fds, 4, &n), 0);
	assert_int_equal(n, 3);
	assert_int_equal(count_fds(), base + 3);
	for (uint32_t i = 0; i < n; i++)
		close(fds[i]);
	send_fds(sv[0], 5);
	assert_int_equal(recv_fds(sv[1], fds, 2, &n), -EPROTO);
	assert_int_equal(n, 0);
	assert_int_equal(count_fds(), base); /* the 2 taken and the 3 past max: all closed */
	send_fds(sv[0], 0);
	assert_int_equal(recv_fds(sv[1], fds, 2, &n), 0);
	assert_int_equal(n, 0);
	close(sv[0]);
	close(sv[1]);
}

static void test_proto_default_socket(void **state)
{
	char buf[256], big[300];

	(void)state;
	setenv("KVB_SOCKET", "/some/where.sock", 1);
	setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
	assert_int_equal(kvb_default_socket(buf, sizeof(buf)), 0);
	assert_string_equal(buf, "/some/where.sock");
	/* An empty $KVB_SOCKET counts as unset; $XDG_RUNTIME_DIR never counts [socket-rule]. */
	setenv("KVB_SOCKET", "", 1);
	assert_int_equal(kvb_default_socket(buf, sizeof(buf)), 0);
	assert_string_equal(buf, "/run/kvbroker/kvbroker.sock");
	unsetenv("KVB_SOCKET");
	assert_int_equal(kvb_default_socket(buf, sizeof(buf)), 0);
	assert_string_equal(buf, KVB_SOCKET_DEFAULT);
	unsetenv("XDG_RUNTIME_DIR");
	assert_int_equal(kvb_default_socket(buf, sizeof(buf)), 0);
	assert_string_equal(buf, "/run/kvbroker/kvbroker.sock");
	/* The library's public rule is the same one, and a given path wins. */
	setenv("XDG_RUNTIME_DIR", "/run/user/1000", 1);
	assert_int_equal(kvb_socket_path(NULL, buf, sizeof(buf)), 0);
	assert_string_equal(buf, KVB_SOCKET_DEFAULT);
	setenv("KVB_SOCKET", "/some/where.sock", 1);
	assert_int_equal(kvb_socket_path(NULL, buf, sizeof(buf)), 0);
	assert_string_equal(buf, "/some/where.sock");
	assert_int_equal(kvb_socket_path("/given.sock", buf, sizeof(buf)), 0);
	assert_string_equal(buf, "/given.sock");
	unsetenv("KVB_SOCKET");
	unsetenv("XDG_RUNTIME_DIR");
	/* Too long for the caller's buffer, or for a sockaddr_un (108 bytes with the NUL). */
	assert_int_equal(kvb_default_socket(buf, 10), -ENAMETOOLONG);
	memset(big, 'a', sizeof(big));
	big[0] = '/';
	big[108] = 0;
	setenv("KVB_SOCKET", big, 1);
	assert_int_equal(kvb_default_socket(buf, sizeof(buf)), -ENAMETOOLONG);
	big[107] = 0;
	setenv("KVB_SOCKET", big, 1);
	assert_int_equal(kvb_default_socket(buf, sizeof(buf)), 0);
	unsetenv("KVB_SOCKET");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_proto_region_layout_geometry),
		cmocka_unit_test(test_proto_region_layout_bad_sq_entries),
		cmocka_unit_test(test_proto_region_check),
		cmocka_unit_test(test_proto_msg_body_min),
		cmocka_unit_test(test_proto_msg_check),
		cmocka_unit_test(test_proto_layout_valid),
		cmocka_unit_test(test_proto_layout_malformed),
		cmocka_unit_test(test_proto_layout_too_big),
		cmocka_unit_test(test_proto_sqe_simple_ops),
		cmocka_unit_test(test_proto_sqe_put_get),
		cmocka_unit_test(test_proto_sqe_bad_header),
		cmocka_unit_test(test_proto_sqe_lookup),
		cmocka_unit_test(test_proto_sqe_parent),
		cmocka_unit_test(test_proto_is_pow2),
		cmocka_unit_test(test_proto_default_socket),
		cmocka_unit_test(test_proto_fds_pair),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
