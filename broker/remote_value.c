// SPDX-License-Identifier: MIT
/*
 * remote_value.c - the format of a value in the remote tier's store (remote.c). Pure
 * functions, no I/O; any thread.
 *
 * A page is stored under the name prefix + hex(namespace identity) + ":" + hex(key), and its
 * value is a 96-byte header followed by the page (fields little-endian, as the host):
 *
 *     offset  bytes  field
 *     0       4      magic      "KVBR"
 *     4       2      version    2
 *     6       2      hdr_len    96: the page starts here
 *     8       4      flags      0
 *     12      4      crc        crc32c of the page's bytes
 *     16      8      len        page bytes that follow (the namespace's page_bytes)
 *     24      32     ns_ident   namespace identity (ns.c), as in the disk slot header
 *     56      32     key        page key
 *     88      4      resv       0
 *     92      4      hcrc       crc32c of bytes 0..91
 *     96      len    the page
 *
 * Why the header repeats the name. The name says which page a value should be, but anyone who
 * can write to the store can put any value under any name: copy one, swap two, restore a dump
 * under other names. The page's crc vouches that its bytes are intact, not that they are the
 * page of this name, and a moved value is intact. So the header carries the namespace identity
 * and the key under its own crc, and a fetch serves a value only when they are exactly the ones
 * it asked for: a value under another name is a miss (REMOTE_VALUE_WRONG_KEY), counted, never
 * a wrong page. The disk slot header's generation has no counterpart: a key is the content
 * hash of its prefix and a name is written once (SET NX), so two copies of a name are the same
 * bytes, and there is no older copy to tell apart.
 *
 * Versions. magic, version and hdr_len keep their place in every version, so any value of
 * ours is told apart from a value of another version before its header is read further.
 * Version 1 (24 bytes: magic, version, hdr_len, len, crc, hcrc) bound nothing; a value of any
 * other version is REMOTE_VALUE_OTHER_VERSION: a miss, not an error, so brokers of two
 * releases share one store during a rolling upgrade, each ignoring the other's values. flags
 * and resv are 0 in version 2; a writer that needs them is another version.
 *
 * What it does not do: a value forged by someone who recomputes the crcs passes. The crcs
 * guard against damage and the header against values moved between names, not against a
 * writer who means harm (docs/operations.md, "Trust model").
 */
#include <string.h>

#include "remote_value.h"
#include "slot.h"

void remote_value_seal(struct remote_hdr *h, const uint8_t ns_ident[32], const kvb_key *key,
		       uint64_t len, uint32_t crc)
{
	memset(h, 0, sizeof(*h));
	h->magic = REMOTE_MAGIC;
	h->version = REMOTE_VERSION;
	h->hdr_len = sizeof(*h);
	h->crc = crc;
	h->len = len;
	memcpy(h->ns_ident, ns_ident, sizeof(h->ns_ident));
	memcpy(h->key, key->b, sizeof(h->key));
	h->hcrc = slot_crc32c(h, offsetof(struct remote_hdr, hcrc));
}

enum remote_verdict remote_value_check(const struct remote_hdr *h, uint64_t vlen,
				       const uint8_t ns_ident[32], const kvb_key *key,
				       uint64_t page_bytes)
{
	if (h->magic != REMOTE_MAGIC)
		return REMOTE_VALUE_CORRUPT;
	/* Before the crc: another version's header has another layout. */
	if (h->version != REMOTE_VERSION)
		return REMOTE_VALUE_OTHER_VERSION;
	if (h->hdr_len != sizeof(*h) ||
	    h->hcrc != slot_crc32c(h, offsetof(struct remote_hdr, hcrc)) || h->flags || h->resv)
		return REMOTE_VALUE_CORRUPT;
	/* Intact: whose is it? Checked before the length, which another namespace's may differ. */
	if (memcmp(h->ns_ident, ns_ident, sizeof(h->ns_ident)) ||
	    memcmp(h->key, key->b, sizeof(h->key)))
		return REMOTE_VALUE_WRONG_KEY;
	if (h->len != page_bytes || vlen != sizeof(*h) + page_bytes)
		return REMOTE_VALUE_CORRUPT;
	return REMOTE_VALUE_OK;
}
