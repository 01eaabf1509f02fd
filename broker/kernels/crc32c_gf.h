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
 * kvb_crc_segs: each thread checksums one piece of this many bytes (a 128-thread block a
 * 128 KiB chunk of a segment), then moves it to its place in the slot (kvb_gf_x8n_tab).
 */
#define KVB_CRC_PIECE 1024u
#define KVB_CRC_THREADS 128u

/*
 * x^(8 * 2^k) mod P for k < 31, which repeat from there (x^(8 * 2^31) = x^8 mod P for this P):
 * test_crccopy.c derives them again by squaring (kvb_gf_x8n), and the repetition to k = 63.
 */
#define KVB_X8POW_N 31
#define KVB_X8POW                                                                                  \
	{                                                                                          \
		0x00800000u, 0x00008000u, 0x82f63b78u, 0x6ea2d55cu, 0x18b8ea18u, 0x510ac59au,      \
			0xb82be955u, 0xb8fdb1e7u, 0x88e56f72u, 0x74c360a4u, 0xe4172b16u,           \
			0x0d65762au, 0x35d73a62u, 0x28461564u, 0xbf455269u, 0xe2ea32dcu,           \
			0xfe7740e6u, 0xf946610bu, 0x3c204f8fu, 0x538586e3u, 0x59726915u,           \
			0x734d5309u, 0xbc1ac763u, 0x7d0722ccu, 0xd289cabeu, 0xe94ca9bcu,           \
			0x05b74f3fu, 0xa51e1f42u, 0x40000000u, 0x20000000u, 0x08000000u            \
	}

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

/* x^(8n) mod P by squaring: what KVB_X8POW is derived from. */
KVB_GF unsigned kvb_gf_x8n(unsigned long long n)
{
	unsigned p = 0x80000000u, sq = 0x00800000u; /* x^0; x^8, x^16, x^32, ... */

	for (; n; n >>= 1) {
		if (n & 1)
			p = kvb_gf_mul(p, sq);
		sq = kvb_gf_mul(sq, sq);
	}
	return p;
}

/* x^(8n) mod P from pw = KVB_X8POW: a raw crc times this is the crc moved n (zero) bytes on.
 * One product per bit set in n. */
KVB_GF unsigned kvb_gf_x8n_tab(const unsigned *pw, unsigned long long n)
{
	unsigned p = 0x80000000u;

	for (int k = 0; n; n >>= 1) {
		if (n & 1)
			p = kvb_gf_mul(p, pw[k]);
		if (++k == KVB_X8POW_N)
			k = 0;
	}
	return p;
}

/* Byte i through the register: entry i of the byte-at-a-time table. */
KVB_GF unsigned kvb_crc_tab(unsigned i)
{
	for (int k = 0; k < 8; k++)
		i = (i >> 1) ^ ((i & 1) ? KVB_CRC32C_POLY : 0);
	return i;
}

/* Entry i of the four tables of the 4-bytes-at-a-time loop (t: 4 x 256): byte i followed by
 * k zero bytes in table k; table 0 is the byte table. */
KVB_GF void kvb_crc_tab4(unsigned *t, unsigned i)
{
	unsigned v = kvb_crc_tab(i);

	for (int k = 0; k < 4; k++) {
		t[256 * k + i] = v;
		v = (v >> 8) ^ kvb_crc_tab(v & 0xff);
	}
}

/* The raw crc r continued over the 4 bytes of w, little-endian (t: kvb_crc_tab4's). */
KVB_GF unsigned kvb_crc_word4(const unsigned *t, unsigned r, unsigned w)
{
	r ^= w;
	return t[768 + (r & 0xff)] ^ t[512 + ((r >> 8) & 0xff)] ^ t[256 + ((r >> 16) & 0xff)] ^
	       t[r >> 24];
}

KVB_GF unsigned kvb_crc_byte(const unsigned *t, unsigned r, unsigned char b)
{
	return t[(r ^ b) & 0xff] ^ (r >> 8);
}

#endif /* KVB_BROKER_CRC32C_GF_H */
