/* SPDX-License-Identifier: MIT */
/*
 * crccopy.h - a PUT's copy into the pool that yields the crc32c of the bytes it stored in the
 * same pass ([crc-fused], crccopy.c). Any thread.
 */
#ifndef KVB_BROKER_CRCCOPY_H
#define KVB_BROKER_CRCCOPY_H

#include <stddef.h>
#include <stdint.h>

/*
 * The folding constants (crccopy.c): x^e mod P for P the reflected Castagnoli polynomial,
 * bit-reflected (bit 31 - d holds the coefficient of x^d). test_crccopy.c derives them again.
 */
#define CRC_X2111 0xe9a5d8beull /* the 512-bit loop, D = 2048 bits (256 bytes): x^(D + 63) */
#define CRC_X2047 0x1426a815ull /* x^(D - 1) */
#define CRC_X1087 0x6577b245ull /* the 256-bit loop, D = 1024 bits (128 bytes) */
#define CRC_X1023 0x7417153full

/*
 * Copies n bytes from src to dst (streaming stores into dst where it is long enough, as
 * kvb_copy_nt) and returns slot_crc32c_more(crc, <the bytes stored>, n): crc 0 starts, as
 * slot_crc32c. The checksum is of what was loaded and stored, so a source changed during the
 * copy still yields the checksum of the destination's bytes. Regions must not overlap.
 */
uint32_t crc_copy(void *dst, const void *src, size_t n, uint32_t crc);

/*
 * [cqe-first] crc_copy without the store fence that ends it: the caller calls crc_copy_fence()
 * before anyone may read the bytes it stored (streaming stores are weakly ordered).
 */
uint32_t crc_copy_unfenced(void *dst, const void *src, size_t n, uint32_t crc);
void crc_copy_fence(void);

/* How crc_copy runs on this CPU: 2 fused with 512-bit vectors, 1 with 256-bit ones, 0 a copy
 * then ISA-L's crc32c of the source. */
int crc_copy_level(void);

/* crc_copy at level at most max (tests: each loop checked on its own). */
uint32_t crc_copy_at(int max, void *dst, const void *src, size_t n, uint32_t crc);

/*
 * r * x^(8n) mod P: a crc state moved n bytes on, for checksums of parts computed apart (a
 * worker's share of a split job, copy_host.c). With R(M) the raw crc (the crc32 instruction's
 * state from 0, ~slot_crc32c_more(~0u, M)), R(A || B) = crc_shift(R(A), |B|) ^ R(B), and
 * slot_crc32c(M) = R(M) ^ crc_shift(~0u, |M|) ^ ~0u. Software carry-less arithmetic, about a
 * microsecond: for parts of hundreds of KiB.
 */
uint32_t crc_shift(uint32_t r, uint64_t n);

/*
 * The crc32c of a slot of slot_len bytes from x, the xor of the raw crcs of its first covered
 * bytes' parts, each moved to the slot's end (crc_shift by the slot's bytes after it): the
 * bytes past them are read from the slot. For checksums computed by parts, on host workers
 * ([crc-worker]) or on the GPU ([gpu-crc]).
 */
uint32_t crc_slot_finish(uint32_t x, const void *slot, uint64_t covered, uint64_t slot_len);

#endif /* KVB_BROKER_CRCCOPY_H */
