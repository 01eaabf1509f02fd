// SPDX-License-Identifier: MIT
/*
 * fuzz_slot.c - libFuzzer target over the disk tier's on-disk format (broker/slot.c): the slot
 * header and superblock checks the warm-restart scan runs on every 4 KiB block of a cache file,
 * whatever the file holds, and the crc32c both rely on.
 *
 * Input: [0] selects the parser.
 *   0  slot header: [1, 17) the cache id to check against, [17, 21) max_len (u32), [21, 23) a
 *      bit to flip, then the header block (up to 4 KiB, zero-padded) and the payload.
 *   1  superblock: [1, 3) a bit to flip, then the block (zero-padded to 80 bytes).
 *   2  crc32c: the bytes.
 * Oracles. slot_hdr_check: the verdict is one of the four, depends only on the header's 128
 * bytes (the rest of the block is ignored), and means what it says - VALID: magic, version,
 * size, flags and cache id as written, 0 < len <= max_len, the crc checks, sealing a copy
 * again changes no byte, and the slot's stride holds the payload in whole blocks; TORN: the
 * magic within SLOT_MAGIC_FLIPS bits and something does not check; STALE: an intact header
 * of another format or size; EMPTY: no magic near. One bit flipped anywhere in a VALID header
 * makes it TORN (crc32c catches every single-bit error; a flipped magic bit is near). A header
 * sealed from the input's fields is VALID exactly when its len is in bounds. A payload is
 * accepted with a header only when its crc32c matches, computed the same by ISA-L and a plain
 * bitwise reference. slot_super_check likewise: accepted means intact, any flipped bit refused,
 * any sealed superblock accepted.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "slot.h"

static void fail(const char *what)
{
	(void)what; /* visible in the debugger and the crash's stack */
	abort();
}

/* Bitwise crc32c (reflected 0x82f63b78), the reference for ISA-L's. */
static uint32_t ref_crc32c(const uint8_t *p, size_t n)
{
	uint32_t c = 0xffffffffu;

	for (size_t i = 0; i < n; i++) {
		c ^= p[i];
		for (int k = 0; k < 8; k++)
			c = c >> 1 ^ (0x82f63b78u & (0u - (c & 1)));
	}
	return ~c;
}

static void header(const uint8_t *in, size_t n)
{
	static uint8_t blk[SLOT_BLOCK], blk2[SLOT_BLOCK];
	uint8_t id[16] = {0};
	uint32_t max_len = 0;
	uint16_t bit = 0;
	const uint8_t *pay = NULL;
	size_t npay = 0, nb;
	struct slot_hdr h, s;
	enum slot_verdict v;

	if (n < 23)
		return;
	memcpy(id, in + 1, 16);
	memcpy(&max_len, in + 17, 4);
	memcpy(&bit, in + 21, 2);
	in += 23;
	n -= 23;
	nb = n < SLOT_BLOCK ? n : SLOT_BLOCK;
	memset(blk, 0, sizeof(blk));
	memcpy(blk, in, nb);
	if (n > SLOT_BLOCK) {
		pay = in + SLOT_BLOCK;
		npay = n - SLOT_BLOCK;
	}
	v = slot_hdr_check(blk, id, max_len);
	memcpy(&h, blk, sizeof(h));
	if (v != SLOT_EMPTY && v != SLOT_VALID && v != SLOT_TORN && v != SLOT_STALE)
		fail("unknown verdict");
	/* Only the 128 header bytes count; the rest of the block is never read. */
	memcpy(blk2, blk, sizeof(h));
	memset(blk2 + sizeof(h), 0xa5, sizeof(blk2) - sizeof(h));
	if (slot_hdr_check(blk2, id, max_len) != v)
		fail("verdict depends on bytes past the header");
	switch (v) {
	case SLOT_VALID:
		if (h.magic != SLOT_MAGIC || h.version != SLOT_VERSION || h.hdr_size != sizeof(h) ||
		    h.flags || memcmp(h.cache_id, id, 16) || !h.len || h.len > max_len ||
		    h.hdr_crc != ref_crc32c(blk, offsetof(struct slot_hdr, hdr_crc)))
			fail("VALID header that does not check");
		s = h;
		slot_hdr_seal(&s);
		if (memcmp(&s, &h, sizeof(h)))
			fail("VALID header changes when sealed again");
		if (slot_stride(h.len) % SLOT_BLOCK || slot_stride(h.len) < SLOT_BLOCK + h.len ||
		    slot_stride(h.len) >= 2 * SLOT_BLOCK + h.len ||
		    slot_stride(h.len) > slot_stride(max_len))
			fail("stride does not hold the payload in whole blocks");
		/* One flipped bit, anywhere in the header: TORN, never VALID. */
		blk2[bit % (sizeof(h) * 8) / 8] ^= (uint8_t)(1u << bit % 8);
		if (slot_hdr_check(blk2, id, max_len) != SLOT_TORN)
			fail("a header with one flipped bit is not TORN");
		/* The payload is taken only when its crc matches, by either implementation. */
		if (pay && npay >= h.len &&
		    (slot_crc32c(pay, h.len) == h.payload_crc) !=
			    (ref_crc32c(pay, h.len) == h.payload_crc))
			fail("ISA-L and the reference crc32c disagree on a payload");
		break;
	case SLOT_TORN:
		if (__builtin_popcountll(h.magic ^ SLOT_MAGIC) > SLOT_MAGIC_FLIPS)
			fail("TORN without a magic");
		if (h.magic == SLOT_MAGIC &&
		    h.hdr_crc == ref_crc32c(blk, offsetof(struct slot_hdr, hdr_crc)))
			fail("TORN header whose crc checks");
		break;
	case SLOT_STALE:
		if (h.magic != SLOT_MAGIC ||
		    h.hdr_crc != ref_crc32c(blk, offsetof(struct slot_hdr, hdr_crc)))
			fail("STALE header that is not intact");
		if (h.version == SLOT_VERSION && h.hdr_size == sizeof(h) && !h.flags &&
		    !memcmp(h.cache_id, id, 16) && h.len && h.len <= max_len)
			fail("STALE header of this cache and in bounds");
		break;
	case SLOT_EMPTY:
		if (__builtin_popcountll(h.magic ^ SLOT_MAGIC) <= SLOT_MAGIC_FLIPS)
			fail("EMPTY block with a magic near SLOT_MAGIC");
		break;
	}
	/* A header sealed from the input's fields, as tier.c writes one: VALID iff in bounds. */
	memset(blk2, 0, sizeof(blk2));
	memset(&s, 0, sizeof(s));
	memcpy(s.cache_id, id, 16);
	s.gen = h.gen;
	memcpy(s.ns_ident, h.ns_ident, sizeof(s.ns_ident));
	memcpy(s.key, h.key, sizeof(s.key));
	s.len = h.len;
	s.payload_crc = h.payload_crc;
	slot_hdr_seal(&s);
	memcpy(blk2, &s, sizeof(s));
	if ((slot_hdr_check(blk2, id, max_len) == SLOT_VALID) != (s.len && s.len <= max_len))
		fail("a freshly sealed header is judged wrongly");
}

static void super(const uint8_t *in, size_t n)
{
	struct slot_super sb, s2;
	uint16_t bit = 0;

	if (n < 3)
		return;
	memcpy(&bit, in + 1, 2);
	in += 3;
	n -= 3;
	memset(&sb, 0, sizeof(sb));
	memcpy(&sb, in, n < sizeof(sb) ? n : sizeof(sb));
	if (slot_super_check(&sb) == 0) {
		if (sb.magic != SUPER_MAGIC || sb.version != SLOT_VERSION ||
		    sb.data_off != SLOT_DATA_OFF ||
		    sb.crc != ref_crc32c((const uint8_t *)&sb, offsetof(struct slot_super, crc)))
			fail("accepted superblock that does not check");
		s2 = sb;
		slot_super_seal(&s2);
		if (memcmp(&s2, &sb, sizeof(sb)))
			fail("accepted superblock changes when sealed again");
		((uint8_t *)&s2)[bit % (sizeof(s2) * 8) / 8] ^= (uint8_t)(1u << bit % 8);
		if (slot_super_check(&s2) == 0)
			fail("a superblock with one flipped bit is accepted");
	} else if (slot_super_check(&sb) != -EINVAL) {
		fail("superblock refused with another error than -EINVAL");
	}
	slot_super_seal(&sb);
	if (slot_super_check(&sb))
		fail("a sealed superblock is refused");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int vector_checked;

	if (!vector_checked) {
		vector_checked = 1;
		if (slot_crc32c("123456789", 9) != 0xe3069283u ||
		    ref_crc32c((const uint8_t *)"123456789", 9) != 0xe3069283u)
			fail("crc32c test vector");
	}
	if (!size)
		return 0;
	switch (data[0] % 3) {
	case 0:
		header(data, size);
		break;
	case 1:
		super(data, size);
		break;
	default:
		if (slot_crc32c(data + 1, size - 1) != ref_crc32c(data + 1, size - 1))
			fail("ISA-L and the reference crc32c disagree");
		break;
	}
	return 0;
}
