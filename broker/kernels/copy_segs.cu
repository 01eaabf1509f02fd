// SPDX-License-Identifier: MIT
/*
 * copy_segs.cu - the gather/scatter kernel of the CUDA copy engine (copy_cuda.c): copies a list
 * of segments between client GPU memory and the pinned pool, which the kernel reads and writes
 * through its device mapping (cuMemHostRegister with DEVICEMAP). One kernel serves both
 * directions: a segment is just (dst, src, len) in device-visible addresses.
 *
 * Why a kernel at all: a 64-token Kimi-K2.5 page is 61 layer parts of 72 KiB, each in its own
 * layer buffer. 61 cuMemcpyAsync calls pay a DMA set-up each; one launch moves all of them with
 * every SM issuing PCIe reads or writes at once. Which path wins depends on the shape, so the
 * engine measures both per page shape at first use (copy_cuda.c, [CUDA-PATH]).
 *
 * Grid: blockIdx.y walks the segments (grid-stride), blockIdx.x the KVB_CHUNK-byte chunks of
 * one segment, so a long segment is spread over many blocks. 16-byte vector moves when both
 * sides and the length allow it, bytes otherwise. The descriptor table itself sits in mapped
 * pinned host memory (written by the broker just before the launch).
 *
 * kvb_crc_segs, the checksum of a GPU PUT's slot ([gpu-crc], copy_cuda.c), is here too: one
 * module, one fatbin.
 *
 * Built by nvcc -fatbin at build time, embedded into kvbrokerd (copy_kernels.c) and loaded with
 * cuModuleLoadData: no CUDA runtime library is involved.
 */
#include "crc32c_gf.h"

#define KVB_CHUNK 16384
#define KVB_UNROLL 4

struct kvb_dseg {
	unsigned long long dst, src, len;
};

extern "C" __global__ void kvb_copy_segs(const kvb_dseg *segs, unsigned n)
{
	for (unsigned i = blockIdx.y; i < n; i += gridDim.y) {
		kvb_dseg s = segs[i];
		unsigned long long begin = (unsigned long long)blockIdx.x * KVB_CHUNK;

		for (; begin < s.len; begin += (unsigned long long)gridDim.x * KVB_CHUNK) {
			unsigned long long end = begin + KVB_CHUNK < s.len ? begin + KVB_CHUNK : s.len;
			char *d = (char *)s.dst;
			const char *src = (const char *)s.src;

			if (((s.dst | s.src | begin | end) & 15) == 0) {
				uint4 *d4 = (uint4 *)(d + begin);
				const uint4 *s4 = (const uint4 *)(src + begin);
				unsigned long long n4 = (end - begin) / 16;

				/*
				 * KVB_UNROLL loads in flight per thread before the stores: one side
				 * is host memory across PCIe, microseconds away, and a chunk is
				 * exactly KVB_UNROLL vectors per thread of a 256-thread block.
				 */
				for (unsigned long long j = threadIdx.x; j < n4;
				     j += KVB_UNROLL * blockDim.x) {
					uint4 v[KVB_UNROLL];

#pragma unroll
					for (int k = 0; k < KVB_UNROLL; k++)
						if (j + k * blockDim.x < n4)
							v[k] = s4[j + k * blockDim.x];
#pragma unroll
					for (int k = 0; k < KVB_UNROLL; k++)
						if (j + k * blockDim.x < n4)
							d4[j + k * blockDim.x] = v[k];
				}
			} else {
				for (unsigned long long j = begin + threadIdx.x; j < end; j += blockDim.x)
					d[j] = src[j];
			}
		}
	}
}

struct kvb_cseg {
	unsigned long long src, len, after; /* after: the slot's bytes after this segment */
};

__constant__ unsigned kvb_x8pow[KVB_X8POW_N] = KVB_X8POW;

/*
 * [gpu-crc] The crc32c of a page PUT from GPU memory, from the GPU's copy of its bytes (HBM at
 * TB/s) rather than from the pool after the DMA (a CPU reading 4 MiB back from DRAM, slower
 * than the DMA itself). Each thread takes a KVB_CRC_PIECE-byte piece of a segment, computes its
 * raw crc 4 bytes at a time with tables in shared memory, and moves it to its place in the slot
 * (times x^(8 x the slot's bytes after it)): the slot's raw crc is then the xor of all of them,
 * in any order. Each block writes its threads' xor to out[block] (mapped pinned host memory);
 * the host xors those and finishes the checksum (crccopy.c crc_slot_finish). Grid as
 * kvb_copy_segs, KVB_CRC_THREADS threads a block.
 */
extern "C" __global__ void kvb_crc_segs(const kvb_cseg *segs, unsigned n, unsigned *out)
{
	__shared__ unsigned tab[4 * 256];
	__shared__ unsigned pw[KVB_X8POW_N];
	__shared__ unsigned warp_x[32];
	const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x * KVB_CRC_PIECE;
	unsigned x = 0;

	for (unsigned i = threadIdx.x; i < 256; i += blockDim.x)
		kvb_crc_tab4(tab, i);
	for (unsigned i = threadIdx.x; i < KVB_X8POW_N; i += blockDim.x)
		pw[i] = kvb_x8pow[i];
	__syncthreads();
	for (unsigned i = blockIdx.y; i < n; i += gridDim.y) {
		kvb_cseg s = segs[i];
		unsigned long long lo =
			((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) * KVB_CRC_PIECE;

		for (; lo < s.len; lo += step) {
			unsigned long long hi = lo + KVB_CRC_PIECE < s.len ? lo + KVB_CRC_PIECE : s.len;
			const unsigned char *p = (const unsigned char *)s.src + lo;
			unsigned r = 0;

			if ((((unsigned long long)p | (hi - lo)) & 15) == 0) {
				const uint4 *q = (const uint4 *)p, *e = (const uint4 *)(p + (hi - lo));

				for (; q < e; q++) {
					uint4 v = *q;

					r = kvb_crc_word4(tab, r, v.x);
					r = kvb_crc_word4(tab, r, v.y);
					r = kvb_crc_word4(tab, r, v.z);
					r = kvb_crc_word4(tab, r, v.w);
				}
			} else {
				for (unsigned long long k = 0; k < hi - lo; k++)
					r = kvb_crc_byte(tab, r, p[k]);
			}
			x ^= kvb_gf_mul(r, kvb_gf_x8n_tab(pw, s.len - hi + s.after));
		}
	}
	for (int o = 16; o; o >>= 1)
		x ^= __shfl_xor_sync(0xffffffffu, x, o);
	if ((threadIdx.x & 31) == 0)
		warp_x[threadIdx.x >> 5] = x;
	__syncthreads();
	if (threadIdx.x == 0) {
		for (unsigned w = 1; w < (blockDim.x + 31) / 32; w++)
			x ^= warp_x[w];
		out[blockIdx.y * gridDim.x + blockIdx.x] = x;
		__threadfence_system();
	}
}
