/* SPDX-License-Identifier: MIT */
/*
 * crc_segs_emu.h - the checksum kernel (broker/kernels/copy_segs.cu kvb_crc_segs) run on the
 * host by the fake drivers: the same arithmetic (crc32c_gf.h) over the same pieces, block by
 * block and thread by thread as the grid would split them, so the broker's side of [gpu-crc]
 * (descriptor tables, the blocks' parts, the finish) meets what a GPU would write.
 */
#ifndef KVB_TESTS_CRC_SEGS_EMU_H
#define KVB_TESTS_CRC_SEGS_EMU_H

#include <stdint.h>
#include <string.h>

#include "kernels/crc32c_gf.h"

/* One thread's piece [lo, hi) of a segment: its raw crc, as the kernel computes it. */
static inline unsigned crc_piece_emu(const unsigned *tab, const uint8_t *src, uint64_t lo,
				     uint64_t hi)
{
	unsigned r = 0;

	if ((((uintptr_t)(src + lo) | (hi - lo)) & 15) == 0) {
		for (uint64_t k = lo; k < hi; k += 4) {
			uint32_t w;

			memcpy(&w, src + k, 4);
			r = kvb_crc_word4(tab, r, w);
		}
		return r;
	}
	for (uint64_t k = lo; k < hi; k++)
		r = kvb_crc_byte(tab, r, src[k]);
	return r;
}

/* t: n segments of (src, len, after); out: gx * gy parts, block (bx, by) at by * gx + bx. */
static inline void crc_segs_emu(const uint64_t *t, unsigned n, unsigned gx, unsigned gy,
				unsigned threads, uint32_t *out)
{
	static const unsigned pw[KVB_X8POW_N] = KVB_X8POW;
	unsigned tab[4 * 256];
	uint64_t step = (uint64_t)gx * threads * KVB_CRC_PIECE;

	for (unsigned i = 0; i < 256; i++)
		kvb_crc_tab4(tab, i);
	memset(out, 0, (size_t)gx * gy * sizeof(*out));
	/* Thread th of block (bx, by) takes the pieces the kernel's loops give it. */
	for (unsigned b = 0; b < gx * gy; b++) {
		unsigned bx = b % gx, by = b / gx;

		for (unsigned th = 0; th < threads; th++) {
			for (unsigned i = by; i < n; i += gy) {
				const uint8_t *src = (const uint8_t *)(uintptr_t)t[3 * i];
				uint64_t len = t[3 * i + 1], after = t[3 * i + 2];

				for (uint64_t lo = ((uint64_t)bx * threads + th) * KVB_CRC_PIECE;
				     lo < len; lo += step) {
					uint64_t hi = len - lo < KVB_CRC_PIECE ? len
									       : lo + KVB_CRC_PIECE;

					out[b] ^= kvb_gf_mul(crc_piece_emu(tab, src, lo, hi),
							     kvb_gf_x8n_tab(pw, len - hi + after));
				}
			}
		}
	}
}

#endif /* KVB_TESTS_CRC_SEGS_EMU_H */
