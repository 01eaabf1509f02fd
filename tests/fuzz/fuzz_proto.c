// SPDX-License-Identifier: MIT
/*
 * fuzz_proto.c - libFuzzer target over proto/'s pure validators, both directions: what the
 * broker checks (kvb_msg_check of requests, kvb_layout_check, kvb_sqe_check) and what the client
 * checks of the broker (kvb_msg_check of replies, kvb_region_check of a region header).
 *
 * Input: [0] selects the parser, the rest is its bytes. Oracles: whatever a validator accepts
 * must be safe to use the way its callers use it - an accepted region header places every ring
 * and the argument area inside the region; an accepted LOOKUP SQE keeps keys and tier bytes
 * inside the argument area and apart; an accepted layout's page size is what its components
 * add up to and within KVB_MAX_PAGE_BYTES; an accepted message's length is its datagram's; an
 * accepted identity (kvb_ident_check, ABI 1.2) has every rank below its size, known dtypes
 * only for existing components, a terminated page format, and when it is the default it
 * hashes to the ABI 1.1 identity of its layout (ns_identity2 == ns_identity).
 */
#include <stdlib.h>
#include <string.h>

#include "ns.h"
#include "proto.h"

static void fail(const char *what)
{
	(void)what; /* visible in the debugger and the crash's stack */
	abort();
}

static int inside(uint64_t off, uint64_t len, uint64_t size)
{
	return off <= size && len <= size - off;
}

static void region(const uint8_t *p, size_t n)
{
	struct kvb_region_hdr h = {0};
	uint64_t size = 0;

	if (n < 8)
		return;
	memcpy(&size, p, 8);
	size &= (1ull << 40) - 1;
	memcpy(&h, p + 8, n - 8 < sizeof(h) ? n - 8 : sizeof(h));
	if (kvb_region_check(&h, size))
		return;
	if (!kvb_is_pow2(h.sq_entries) || h.cq_entries != 2 * h.sq_entries ||
	    !inside(h.sqes_off, (uint64_t)h.sq_entries * sizeof(struct kvb_sqe), size) ||
	    !inside(h.cqes_off, (uint64_t)h.cq_entries * sizeof(struct kvb_cqe), size) ||
	    !inside(h.arg_off, h.arg_size, size) || !inside(h.sq_tail_off, 4, size) ||
	    !inside(h.sq_head_off, 4, size) || !inside(h.cq_tail_off, 4, size) ||
	    !inside(h.cq_head_off, 4, size) || !inside(h.sq_flags_off, 4, size) ||
	    !inside(h.cq_flags_off, 4, size) || h.sqes_off < sizeof(h))
		fail("accepted region header places something outside the region");
}

static void sqe(const uint8_t *p, size_t n)
{
	struct kvb_sqe s = {0};
	uint32_t arg_size = 4096u << (n ? p[0] % 8 : 0);

	if (n)
		memcpy(&s, p + 1, n - 1 < sizeof(s) ? n - 1 : sizeof(s));
	if (kvb_sqe_check(&s, arg_size))
		return;
	if (s.opcode >= KVB_OP__COUNT || s.resv0)
		fail("accepted SQE with an unknown opcode or reserved bits");
	if (s.opcode == KVB_OP_LOOKUP) {
		uint64_t k0 = s.batch.arg_off, k1 = k0 + (uint64_t)s.batch.count * 32;
		uint64_t t0 = s.batch.out_off, t1 = t0 + s.batch.count;

		if (k1 > arg_size || t1 > arg_size)
			fail("accepted LOOKUP outside the argument area");
		if (s.batch.count && t0 < k1 && k0 < t1)
			fail("accepted LOOKUP whose tiers overlap its keys");
	}
}

static void layout(const uint8_t *p, size_t n)
{
	struct kvb_layout l = {0};
	uint64_t pb = 0, want = 0;

	memcpy(&l, p, n < sizeof(l) ? n : sizeof(l));
	if (kvb_layout_check(&l, &pb))
		return;
	for (uint32_t i = 0; i < l.ncomponents; i++)
		want += (uint64_t)l.comp[i].num_layers * l.comp[i].bytes_per_token_layer;
	want *= l.tokens_per_page;
	if (!pb || pb != want || pb > KVB_MAX_PAGE_BYTES ||
	    kvb_layout_parts(&l) > KVB_MAX_VIEW_PARTS)
		fail("accepted layout with a wrong page size");
}

static void ident(const uint8_t *p, size_t n)
{
	struct kvb_layout l = {0};
	struct kvb_ns_ident id = {0}, nm;
	uint8_t a[32], b[32];

	memcpy(&l, p, n < sizeof(l) ? n : sizeof(l));
	if (n > sizeof(l))
		memcpy(&id, p + sizeof(l), n - sizeof(l) < sizeof(id) ? n - sizeof(l) : sizeof(id));
	if (kvb_layout_check(&l, NULL) || kvb_ident_check(&l, &id))
		return;
	kvb_ident_norm(&id, &nm);
	if (nm.pp_rank >= nm.pp_size || nm.cp_rank >= nm.cp_size || nm.dp_rank >= nm.dp_size)
		fail("accepted an identity with a rank past its size");
	if (!memchr(id.page_format, 0, sizeof(id.page_format)))
		fail("accepted an unterminated page format");
	for (uint32_t i = 0; i < KVB_MAX_COMPONENTS; i++)
		if (id.dtype[i] >= KVB_DTYPE__COUNT || (i >= l.ncomponents && id.dtype[i]))
			fail("accepted a bad dtype");
	ns_identity2(&l, &id, 0, a);
	ns_identity(&l, 0, b);
	if (kvb_ident_is_default(&id) != !memcmp(a, b, sizeof(a)))
		fail("default identity and ABI 1.1 identity disagree");
}

static void msg(const uint8_t *p, size_t n)
{
	struct kvb_msg_hdr h;

	if (kvb_msg_check(p, n))
		return;
	if (n < sizeof(h))
		fail("accepted a datagram shorter than its header");
	memcpy(&h, p, sizeof(h));
	if (h.len != n || h.magic != KVB_MSG_MAGIC)
		fail("accepted a datagram whose length or magic is wrong");
	if (!(h.flags & KVB_MSGF_REPLY) && (n > KVB_MSG_MAX || kvb_msg_body_min(h.type) < 0 ||
					    n - sizeof(h) < (uint64_t)kvb_msg_body_min(h.type)))
		fail("accepted a request too short for its type");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	switch (data[0] % 5) {
	case 0:
		msg(data + 1, size - 1);
		break;
	case 1:
		layout(data + 1, size - 1);
		break;
	case 2:
		region(data + 1, size - 1);
		break;
	case 3:
		sqe(data + 1, size - 1);
		break;
	case 4:
		ident(data + 1, size - 1);
		break;
	}
	return 0;
}
