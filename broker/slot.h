/* SPDX-License-Identifier: MIT */
/*
 * slot.h - the disk tier's on-disk format: the superblock at the start of every cache path and
 * the header in front of every page slot. Everything that outlives the broker carries magic,
 * version, the cache's identity and a checksum; see slot.c for the format essay.
 */
#ifndef KVB_BROKER_SLOT_H
#define KVB_BROKER_SLOT_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#define SLOT_BLOCK 4096u	 /* O_DIRECT unit: headers, offsets and lengths are multiples */
#define SLOT_DATA_OFF (1u << 20) /* first slot of a path: the superblock has the first MiB */
#define SLOT_PROBE_OFF 4096u	 /* the block after the superblock: tier.c probes it */
#define SLOT_VERSION 1
#define SLOT_MAGIC 0x31544f4c5342564bull  /* "KVBSLOT1" little-endian */
#define SUPER_MAGIC 0x314b53494442564bull /* "KVBDISK1" little-endian */
/* A block whose first 8 bytes are at most this many bits from SLOT_MAGIC is a damaged header
 * (counted torn), not payload: random data lands that close with odds of 2^-44 per block. */
#define SLOT_MAGIC_FLIPS 4

/* The superblock, in the first block of every path (fields little-endian, as the host). */
struct slot_super {
	uint64_t magic;	      /* SUPER_MAGIC */
	uint16_t version;     /* SLOT_VERSION */
	uint16_t resv0;	      /* 0 */
	uint32_t npaths;      /* paths of the cache (striping) */
	uint32_t index;	      /* this path's place among them */
	uint32_t resv1;	      /* 0 */
	uint64_t path_bytes;  /* bytes of this path the cache uses (superblock included) */
	uint64_t data_off;    /* first slot: SLOT_DATA_OFF */
	uint8_t cache_id[16]; /* random at format time, the same on every path */
	uint64_t created;     /* unix seconds of the format */
	uint32_t resv2[3];    /* 0 */
	uint32_t crc;	      /* crc32c of the bytes before it */
};
static_assert(sizeof(struct slot_super) == 80, "superblock layout");

/*
 * The header of a slot: the first block of the slot, the payload (the page) follows at
 * off + SLOT_BLOCK, padded to a block.
 */
struct slot_hdr {
	uint64_t magic;	      /* SLOT_MAGIC */
	uint16_t version;     /* SLOT_VERSION */
	uint16_t hdr_size;    /* sizeof(struct slot_hdr) */
	uint32_t flags;	      /* 0 */
	uint8_t cache_id[16]; /* the superblock's: slots of an earlier format never come back */
	uint64_t gen;	      /* write sequence number: the newest copy of a key wins */
	uint8_t ns_ident[32]; /* namespace identity (ns.c: SHA-256 of the layout and tenant) */
	uint8_t key[32];      /* page key */
	uint32_t len;	      /* payload bytes (the namespace's page_bytes) */
	uint32_t payload_crc; /* crc32c of the len payload bytes */
	uint32_t resv[3];     /* 0 */
	uint32_t hdr_crc;     /* crc32c of the bytes before it */
};
static_assert(sizeof(struct slot_hdr) == 128, "slot header layout");
static_assert(offsetof(struct slot_hdr, hdr_crc) == 124, "slot header layout");

/* crc32c (Castagnoli, the iSCSI polynomial; "123456789" -> 0xe3069283), through ISA-L. */
uint32_t slot_crc32c(const void *p, size_t len);
/* The crc32c of (the bytes crc was of) followed by p: crc 0 starts, as slot_crc32c(p, len). */
uint32_t slot_crc32c_more(uint32_t crc, const void *p, size_t len);

/* Bytes a slot of a len-byte payload takes on disk: header block + payload rounded to blocks. */
static inline uint64_t slot_stride(uint64_t len)
{
	return SLOT_BLOCK + ((len + SLOT_BLOCK - 1) & ~(uint64_t)(SLOT_BLOCK - 1));
}

/* Fills h (zeroing the rest of its block is the caller's) and seals it with its crc. */
void slot_hdr_seal(struct slot_hdr *h);

enum slot_verdict {
	SLOT_EMPTY = 0, /* no header here (never written, or payload bytes) */
	SLOT_VALID = 1, /* header intact and of this cache */
	SLOT_TORN = 2,	/* a header whose bytes do not check: a write cut short, flipped bits */
	SLOT_STALE = 3, /* an intact header of another cache format: ignored */
};

/*
 * Judges the header block at p (SLOT_BLOCK bytes readable) for a cache of this id whose slots
 * are at most max_len payload bytes. Does not look at the payload.
 */
enum slot_verdict slot_hdr_check(const void *p, const uint8_t cache_id[16], uint64_t max_len);

void slot_super_seal(struct slot_super *s);
/* 0 when the superblock at p is intact (magic, version, crc), else -EINVAL. */
int slot_super_check(const void *p);

#endif /* KVB_BROKER_SLOT_H */
