/* SPDX-License-Identifier: MIT */
/*
 * crc32c_gf.h - crc32c arithmetic written once for the host and the GPU: crccopy.c's crc_shift
 * and the checksum kernel of a GPU PUT (copy_segs.cu, kvb_crc_segs) are built from it, and the
 * fake drivers of the tests run the kernel's contract with it.
 *
 * Bit-reflected Castagnoli polynomial: bit 31 - d holds the coefficient of x^d (crccopy.h).
 * "Raw" crc: the crc32 instruction's state from 0, no inversions; R(A || B) =
 * R(A) * x^(8|B|) ^ R(B), so parts of a message are checksummed apart and combined by xor.
 */
#ifndef KVB_BROKER_CRC32C_GF_H
#define KVB_BROKER_CRC32C_GF_H

#ifdef __CUDACC__
#define KVB_GF static __host__ __device__ __forceinline__
#else
#define KVB_GF static inline
#endif

#define KVB_CRC32C_POLY 0x82f63b78u

/*
 * kvb_crc_segs: each thread checksums one piece of this many bytes (a 256-thread block a
 * 64 KiB chunk of a segment), then moves it to its place in the slot (one kvb_gf_x8n).
 */
#define KVB_CRC_PIECE 256u

/* a * b mod P. */
KVB_GF unsigned kvb_gf_mul(unsigned a, unsigned b)
{
	unsigned r = 0;

	for (int i = 0; i < 32; i++) {
		if (b & 0x80000000u)
			r ^= a;
		b <<= 1;
		a = (a >> 1) ^ ((a & 1) ? KVB_CRC32C_POLY : 0);
	}
	return r;
}

/* x^(8n) mod P: a raw crc times this is the crc moved n (zero) bytes on. */
KVB_GF unsigned kvb_gf_x8n(unsigned long long n)
{
	unsigned p = 0x80000000u, sq = 0x00800000u; /* x^0; x^8, x^16, x^32, ... by squaring */

	for (; n; n >>= 1) {
		if (n & 1)
			p = kvb_gf_mul(p, sq);
		sq = kvb_gf_mul(sq, sq);
	}
	return p;
}

/* Entry i of the byte-at-a-time table: i's low 8 bits pushed through the register. */
KVB_GF unsigned kvb_crc_tab(unsigned i)
{
	for (int k = 0; k < 8; k++)
		i = (i >> 1) ^ ((i & 1) ? KVB_CRC32C_POLY : 0);
	return i;
}

/* The raw crc r continued over the 4 bytes of w, little-endian. */
KVB_GF unsigned kvb_crc_word(const unsigned *tab, unsigned r, unsigned w)
{
	r ^= w;
	for (int k = 0; k < 4; k++)
		r = tab[r & 0xff] ^ (r >> 8);
	return r;
}

KVB_GF unsigned kvb_crc_byte(const unsigned *tab, unsigned r, unsigned char b)
{
	return tab[(r ^ b) & 0xff] ^ (r >> 8);
}

#endif /* KVB_BROKER_CRC32C_GF_H */
