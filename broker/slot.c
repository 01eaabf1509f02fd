// SPDX-License-Identifier: MIT
/*
 * slot.c - the disk tier's on-disk format. Pure functions, no I/O; any thread.
 *
 * A cache is one or more paths (files or block devices), each used as its own circular log:
 *
 *     offset 0          superblock (struct slot_super, 80 bytes in a 4 KiB block)
 *     offset 4 KiB      probe block: a failed tier's recovery probe writes and reads it back
 *                       (tier.c); never data, any contents
 *     offset 1 MiB      slot, slot, slot, ...  (written at the log head, wrapping at the end)
 *
 *     slot at off:      [off, off + 4 KiB)            struct slot_hdr (128 bytes, rest zero)
 *                       [off + 4 KiB, off + stride)   payload: the page, padded to 4 KiB
 *
 * The superblock names the geometry (number of paths, this path's index, bytes used, where the
 * slots start) and a random 16-byte cache id drawn at format time. A broker started on paths
 * whose superblocks agree with its flags adopts the cache (warm restart); anything else is
 * formatted afresh, with a new id.
 *
 * The header says what the slot holds: the namespace identity (SHA-256 of layout and tenant,
 * ns.c; namespace ids are per-run numbers, identities are forever), the key, the payload length,
 * the payload's crc32c and a generation (a store-wide write counter: of two copies of one key,
 * the newer wins). Two checksums: hdr_crc over the header, payload_crc over the payload.
 *
 * Commit order: a slot is written as two linked writes, payload first, header second, and is
 * committed once the header write completed. What a crash can leave:
 *   - payload partly written, header not: the old contents of the block, which is an older
 *     slot's intact header only if an older slot started exactly here, and then its payload
 *     crc no longer matches (the new payload replaced some of it): discarded;
 *   - header partly written: its crc fails (TORN);
 *   - the file cut short (a torn append, or a truncation): the payload is incomplete, the crc
 *     fails or the slot runs past the end of the file (torn).
 * So a slot is only ever served when header and payload both check, and a header never vouches
 * for a payload that was not written with it: the payload crc binds them. A slot of another
 * format (a different cache id) is ignored, never served.
 *
 * Recovery (tier.c) reads each path sequentially and looks for a header at every 4 KiB block:
 * a valid slot is taken whole (the scan jumps over it), anything else advances one block, so a
 * newer slot written over the middle of an older one is still found.
 */
#include <errno.h>
#include <isa-l/crc.h>
#include <string.h>

#include "slot.h"

uint32_t slot_crc32c(const void *p, size_t len)
{
	return slot_crc32c_more(0, p, len);
}

uint32_t slot_crc32c_more(uint32_t crc, const void *p, size_t len)
{
	unsigned char *q;

	crc = ~crc;
	/* ISA-L takes a non-const pointer and an int length; it never writes through it. */
	memcpy(&q, &p, sizeof(q));
	while (len) {
		int n = len > (1u << 30) ? (1 << 30) : (int)len;

		crc = crc32_iscsi(q, n, crc);
		q += n;
		len -= (size_t)n;
	}
	return ~crc;
}

void slot_hdr_seal(struct slot_hdr *h)
{
	h->magic = SLOT_MAGIC;
	h->version = SLOT_VERSION;
	h->hdr_size = sizeof(*h);
	h->hdr_crc = slot_crc32c(h, offsetof(struct slot_hdr, hdr_crc));
}

enum slot_verdict slot_hdr_check(const void *p, const uint8_t cache_id[16], uint64_t max_len)
{
	struct slot_hdr h;

	memcpy(&h, p, sizeof(h));
	/* A magic a few bits off is a header with flipped bits, not payload: count it torn. */
	if (h.magic != SLOT_MAGIC)
		return __builtin_popcountll(h.magic ^ SLOT_MAGIC) <= SLOT_MAGIC_FLIPS ? SLOT_TORN
										      : SLOT_EMPTY;
	if (h.hdr_crc != slot_crc32c(&h, offsetof(struct slot_hdr, hdr_crc)))
		return SLOT_TORN;
	if (h.version != SLOT_VERSION || h.hdr_size != sizeof(h) || h.flags ||
	    memcmp(h.cache_id, cache_id, sizeof(h.cache_id)) || !h.len || h.len > max_len)
		return SLOT_STALE;
	return SLOT_VALID;
}

void slot_super_seal(struct slot_super *s)
{
	s->magic = SUPER_MAGIC;
	s->version = SLOT_VERSION;
	s->data_off = SLOT_DATA_OFF;
	s->crc = slot_crc32c(s, offsetof(struct slot_super, crc));
}

int slot_super_check(const void *p)
{
	struct slot_super s;

	memcpy(&s, p, sizeof(s));
	if (s.magic != SUPER_MAGIC || s.version != SLOT_VERSION ||
	    s.crc != slot_crc32c(&s, offsetof(struct slot_super, crc)) ||
	    s.data_off != SLOT_DATA_OFF)
		return -EINVAL;
	return 0;
}
