// SPDX-License-Identifier: MIT
/*
 * test_remote_value.c - the remote tier's value format: a sealed value checks for its own key
 * and namespace only; one of another key or namespace is WRONG_KEY; a flipped bit anywhere in
 * the header, a page that does not match its crc, a value cut short or grown, and values that
 * are not ours are CORRUPT; a version 1 value (and any other version) is OTHER_VERSION. Never
 * OK for any of them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "remote_value.h"
#include "slot.h"

#define PAGE 8192u

static uint8_t ident[32], page[PAGE];
static kvb_key key;

static void fill(void)
{
	for (size_t i = 0; i < sizeof(ident); i++)
		ident[i] = (uint8_t)(0x10 + i);
	for (size_t i = 0; i < sizeof(key.b); i++)
		key.b[i] = (uint8_t)(0xa0 ^ i);
	for (size_t i = 0; i < PAGE; i++)
		page[i] = (uint8_t)(i * 31 + 7);
}

static void seal(struct remote_hdr *h)
{
	remote_value_seal(h, ident, &key, PAGE, slot_crc32c(page, PAGE));
}

/* What the tier does with a whole value: the header, then the page against its crc. */
static enum remote_verdict verify(const struct remote_hdr *h, uint64_t vlen, const uint8_t *p,
				  const uint8_t *id, const kvb_key *k)
{
	enum remote_verdict v = remote_value_check(h, vlen, id, k, PAGE);

	if (v == REMOTE_VALUE_OK && slot_crc32c(p, PAGE) != h->crc)
		v = REMOTE_VALUE_CORRUPT;
	return v;
}

static void test_remote_value_layout(void **state)
{
	struct remote_hdr h;

	(void)state;
	fill();
	seal(&h);
	/* The bytes other releases rely on: magic, version and length of the header first. */
	assert_int_equal(sizeof(h), 96);
	assert_int_equal(offsetof(struct remote_hdr, version), 4);
	assert_int_equal(offsetof(struct remote_hdr, hdr_len), 6);
	assert_int_equal(h.magic, REMOTE_MAGIC);
	assert_memory_equal(&h, "KVBR", 4);
	assert_int_equal(h.version, 2);
	assert_int_equal(h.hdr_len, 96);
	assert_int_equal(h.len, PAGE);
	assert_memory_equal(h.ns_ident, ident, sizeof(ident));
	assert_memory_equal(h.key, key.b, sizeof(key.b));
	assert_int_equal(h.hcrc, slot_crc32c(&h, offsetof(struct remote_hdr, hcrc)));
}

static void test_remote_value_own_key_ok(void **state)
{
	struct remote_hdr h;

	(void)state;
	fill();
	seal(&h);
	assert_int_equal(verify(&h, sizeof(h) + PAGE, page, ident, &key), REMOTE_VALUE_OK);
}

/* Intact values under another name: every byte of the key and of the identity counts. */
static void test_remote_value_other_key_or_ns(void **state)
{
	struct remote_hdr h;
	uint8_t other_id[32];
	kvb_key other;

	(void)state;
	fill();
	seal(&h);
	for (size_t i = 0; i < sizeof(key.b); i++) {
		other = key;
		other.b[i] ^= 0x80;
		assert_int_equal(verify(&h, sizeof(h) + PAGE, page, ident, &other),
				 REMOTE_VALUE_WRONG_KEY);
	}
	for (size_t i = 0; i < sizeof(ident); i++) {
		memcpy(other_id, ident, sizeof(ident));
		other_id[i] ^= 0x01;
		assert_int_equal(verify(&h, sizeof(h) + PAGE, page, other_id, &key),
				 REMOTE_VALUE_WRONG_KEY);
	}
	/* Another namespace's page of another size: still told by whose it is, not its length. */
	remote_value_seal(&h, other_id, &key, 2 * PAGE, 0);
	assert_int_equal(remote_value_check(&h, sizeof(h) + 2 * PAGE, ident, &key, PAGE),
			 REMOTE_VALUE_WRONG_KEY);
}

/* Every bit of the header: never OK; CORRUPT, or OTHER_VERSION for the version's own bits. */
static void test_remote_value_header_bit_flips(void **state)
{
	struct remote_hdr h, good;
	uint8_t *b = (uint8_t *)&h;

	(void)state;
	fill();
	seal(&good);
	for (size_t i = 0; i < sizeof(h); i++) {
		for (int bit = 0; bit < 8; bit++) {
			enum remote_verdict want = i == offsetof(struct remote_hdr, version) ||
								   i == offsetof(struct remote_hdr,
										 version) +
										   1
							   ? REMOTE_VALUE_OTHER_VERSION
							   : REMOTE_VALUE_CORRUPT;

			h = good;
			b[i] ^= (uint8_t)(1u << bit);
			assert_int_equal(verify(&h, sizeof(h) + PAGE, page, ident, &key), want);
		}
	}
}

static void test_remote_value_page_bit_flips(void **state)
{
	struct remote_hdr h;

	(void)state;
	fill();
	seal(&h);
	for (size_t i = 0; i < PAGE; i += 61) {
		page[i] ^= (uint8_t)(1u << (i % 8));
		assert_int_equal(verify(&h, sizeof(h) + PAGE, page, ident, &key),
				 REMOTE_VALUE_CORRUPT);
		page[i] ^= (uint8_t)(1u << (i % 8));
	}
	assert_int_equal(verify(&h, sizeof(h) + PAGE, page, ident, &key), REMOTE_VALUE_OK);
}

/* A value cut short or grown, and a header whose length disagrees with the namespace's. */
static void test_remote_value_lengths(void **state)
{
	struct remote_hdr h;

	(void)state;
	fill();
	seal(&h);
	assert_int_equal(remote_value_check(&h, sizeof(h) + PAGE - 1, ident, &key, PAGE),
			 REMOTE_VALUE_CORRUPT);
	assert_int_equal(remote_value_check(&h, sizeof(h), ident, &key, PAGE),
			 REMOTE_VALUE_CORRUPT);
	assert_int_equal(remote_value_check(&h, sizeof(h) + PAGE + 1, ident, &key, PAGE),
			 REMOTE_VALUE_CORRUPT);
	/* Intact and of this key, but not this namespace's page size: nothing wrote that. */
	remote_value_seal(&h, ident, &key, PAGE / 2, slot_crc32c(page, PAGE / 2));
	assert_int_equal(remote_value_check(&h, sizeof(h) + PAGE / 2, ident, &key, PAGE),
			 REMOTE_VALUE_CORRUPT);
	assert_int_equal(remote_value_check(&h, sizeof(h) + PAGE, ident, &key, PAGE),
			 REMOTE_VALUE_CORRUPT);
}

/* The format before version 2: 24 bytes, valid crcs, bound to nothing. */
struct v1_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t hdr_len;
	uint64_t len;
	uint32_t crc;
	uint32_t hcrc;
};

static void test_remote_value_old_format(void **state)
{
	struct v1_hdr v1 = {.magic = REMOTE_MAGIC, .version = 1, .hdr_len = 24, .len = PAGE};
	struct remote_hdr h;
	uint8_t *value = calloc(1, sizeof(h) + PAGE);

	(void)state;
	assert_non_null(value);
	fill();
	v1.crc = slot_crc32c(page, PAGE);
	v1.hcrc = slot_crc32c(&v1, offsetof(struct v1_hdr, hcrc));
	memcpy(value, &v1, sizeof(v1));
	memcpy(value + sizeof(v1), page, PAGE);
	/* As the tier reads it: the first sizeof(h) bytes of the value as a header. */
	memcpy(&h, value, sizeof(h));
	assert_int_equal(remote_value_check(&h, sizeof(v1) + PAGE, ident, &key, PAGE),
			 REMOTE_VALUE_OTHER_VERSION);
	/* A later version too: ignored, not misread. */
	seal(&h);
	h.version = 3;
	h.hcrc = slot_crc32c(&h, offsetof(struct remote_hdr, hcrc));
	assert_int_equal(remote_value_check(&h, sizeof(h) + PAGE, ident, &key, PAGE),
			 REMOTE_VALUE_OTHER_VERSION);
	/* No header at all (a bare page, anyone else's value): not ours. */
	memcpy(&h, page, sizeof(h));
	assert_int_equal(remote_value_check(&h, PAGE, ident, &key, PAGE), REMOTE_VALUE_CORRUPT);
	free(value);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_remote_value_layout),
		cmocka_unit_test(test_remote_value_own_key_ok),
		cmocka_unit_test(test_remote_value_other_key_or_ns),
		cmocka_unit_test(test_remote_value_header_bit_flips),
		cmocka_unit_test(test_remote_value_page_bit_flips),
		cmocka_unit_test(test_remote_value_lengths),
		cmocka_unit_test(test_remote_value_old_format),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
