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
 * Built by nvcc -fatbin at build time, embedded into kvbrokerd (copy_kernels.c) and loaded with
 * cuModuleLoadData: no CUDA runtime library is involved.
 */
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
