/* SPDX-License-Identifier: MIT */
/*
 * remote_value.h - the format of a value in the remote tier's store: a header that binds the
 * page to its namespace and key, then the page. See remote_value.c for the format essay.
 */
#ifndef KVB_BROKER_REMOTE_VALUE_H
#define KVB_BROKER_REMOTE_VALUE_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbroker.h"

#define REMOTE_MAGIC 0x5242564bu /* "KVBR" little-endian, in every version */
#define REMOTE_VERSION 2u

/* The value header (little-endian, as the host), before the page's bytes. */
struct remote_hdr {
	uint32_t magic;	      /* REMOTE_MAGIC */
	uint16_t version;     /* REMOTE_VERSION: magic and version keep their place in all */
	uint16_t hdr_len;     /* sizeof(struct remote_hdr): the page starts here */
	uint32_t flags;	      /* 0 */
	uint32_t crc;	      /* crc32c of the page bytes (slot_crc32c) */
	uint64_t len;	      /* page bytes that follow */
	uint8_t ns_ident[32]; /* namespace identity (ns.c), as the disk slot header's */
	uint8_t key[32];      /* the page key */
	uint32_t resv;	      /* 0 */
	uint32_t hcrc;	      /* crc32c of the bytes before it */
};
static_assert(sizeof(struct remote_hdr) == 96, "remote value header");
static_assert(offsetof(struct remote_hdr, ns_ident) == 24, "remote value header");
static_assert(offsetof(struct remote_hdr, hcrc) == 92, "remote value header");

enum remote_verdict {
	REMOTE_VALUE_OK = 0,
	REMOTE_VALUE_CORRUPT = 1,	/* not a value of ours, or bytes that do not check */
	REMOTE_VALUE_WRONG_KEY = 2,	/* intact, of another key or namespace: copied, swapped */
	REMOTE_VALUE_OTHER_VERSION = 3, /* of another format version (another release) */
};

/* Fills and seals h for a len-byte page of crc32c crc under (ns_ident, key). */
void remote_value_seal(struct remote_hdr *h, const uint8_t ns_ident[32], const kvb_key *key,
		       uint64_t len, uint32_t crc);

/*
 * Judges header h of a vlen-byte value (header included) fetched for key of the namespace
 * ns_ident, whose pages are page_bytes: OK only when it is intact, of this format, of exactly
 * this namespace and key, and as long as such a page. The payload is the caller's to check
 * against h->crc, as its bytes land. Pure; any thread.
 */
enum remote_verdict remote_value_check(const struct remote_hdr *h, uint64_t vlen,
				       const uint8_t ns_ident[32], const kvb_key *key,
				       uint64_t page_bytes);

#endif /* KVB_BROKER_REMOTE_VALUE_H */
