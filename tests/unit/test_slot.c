// SPDX-License-Identifier: MIT
/*
 * test_slot.c - the disk tier's on-disk format: the crc32c is the standard Castagnoli one, a
 * sealed header checks, any flipped header byte makes it torn, a header of another cache (or
 * version, or an impossible length) is stale, never valid, and superblocks check the same way.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "slot.h"

static const uint8_t id[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static void test_slot_crc32c_vector(void **state)
{
	(void)state;
	assert_int_equal(slot_crc32c("123456789", 9), 0xe3069283u);
	assert_int_equal(slot_crc32c("", 0), 0);
	/* Chained, as the remote tier checks a value while it lands: the same crc. */
	assert_int_equal(slot_crc32c_more(slot_crc32c("1234", 4), "56789", 5), 0xe3069283u);
	assert_int_equal(slot_crc32c_more(0, "123456789", 9), 0xe3069283u);
}

static void make_hdr(uint8_t *blk)
{
	struct slot_hdr h;

	memset(&h, 0, sizeof(h));
	memcpy(h.cache_id, id, sizeof(id));
	h.gen = 42;
	memset(h.key, 0xab, sizeof(h.key));
	h.len = 1 << 20;
	h.payload_crc = 0x12345678;
	slot_hdr_seal(&h);
	memset(blk, 0, SLOT_BLOCK);
	memcpy(blk, &h, sizeof(h));
}

static void test_slot_hdr_valid_torn_stale(void **state)
{
	static uint8_t blk[SLOT_BLOCK];
	uint8_t other[16];

	(void)state;
	make_hdr(blk);
	assert_int_equal(slot_hdr_check(blk, id, 1 << 20), SLOT_VALID);
	/* Every byte after the magic is covered by the header crc. */
	for (size_t i = 8; i < sizeof(struct slot_hdr); i++) {
		blk[i] ^= 0x01;
		assert_int_equal(slot_hdr_check(blk, id, 1 << 20), SLOT_TORN);
		blk[i] ^= 0x01;
	}
	assert_int_equal(slot_hdr_check(blk, id, (1 << 20) - 1), SLOT_STALE); /* too long */
	memcpy(other, id, sizeof(other));
	other[0] ^= 0xff;
	assert_int_equal(slot_hdr_check(blk, other, 1 << 20), SLOT_STALE);
	memset(blk, 0, 8);
	assert_int_equal(slot_hdr_check(blk, id, 1 << 20), SLOT_EMPTY);
	assert_int_equal(slot_stride(1 << 20), (1 << 20) + SLOT_BLOCK);
	assert_int_equal(slot_stride(4718592 + 1), 4718592 + 2 * SLOT_BLOCK);
}

static void test_slot_super(void **state)
{
	static uint8_t blk[SLOT_BLOCK];
	struct slot_super s;

	(void)state;
	memset(&s, 0, sizeof(s));
	s.npaths = 2;
	s.index = 1;
	s.path_bytes = 1ull << 30;
	memcpy(s.cache_id, id, sizeof(id));
	slot_super_seal(&s);
	memcpy(blk, &s, sizeof(s));
	assert_int_equal(slot_super_check(blk), 0);
	blk[20] ^= 0x10;
	assert_int_equal(slot_super_check(blk), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_slot_crc32c_vector),
		cmocka_unit_test(test_slot_hdr_valid_torn_stale),
		cmocka_unit_test(test_slot_super),
	};

	return cmocka_run_group_tests_name("slot", tests, NULL, NULL);
}
