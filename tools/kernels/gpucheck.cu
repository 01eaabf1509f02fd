// SPDX-License-Identifier: MIT
/*
 * gpucheck.cu - kernels of the GPU check (tools/kvbgpucheck.c): fill a layer's KV buffer with
 * the pattern of pages [0, npages), and count the bytes of a layer buffer that differ from it,
 * so that pages are produced and compared on the device, never staged through the host.
 * Page p sits in token slots [s * tpp, s * tpp + tpp) with s = p, or npages - 1 - p when
 * reversed (the loading process puts pages elsewhere than the storing one did).
 */
__device__ unsigned char kvb_pat(unsigned page, unsigned layer, unsigned tok, unsigned i)
{
	unsigned x = page * 0x9E3779B1u ^ layer * 0x85EBCA77u ^ tok * 0xC2B2AE3Du ^ i * 0x27D4EB2Fu;

	x ^= x >> 15;
	x *= 0x2C1B3C6Du;
	x ^= x >> 12;
	return (unsigned char)x;
}

__device__ unsigned long long kvb_slot_off(unsigned long long idx, unsigned npages, unsigned tpp,
					   unsigned bpt, unsigned stride, int reverse,
					   unsigned *page, unsigned *tok, unsigned *i)
{
	unsigned long long per_page = (unsigned long long)tpp * bpt;
	unsigned slot;

	*page = (unsigned)(idx / per_page);
	*tok = (unsigned)(idx % per_page / bpt);
	*i = (unsigned)(idx % bpt);
	slot = (reverse ? npages - 1 - *page : *page) * tpp + *tok;
	return (unsigned long long)slot * stride + *i;
}

extern "C" __global__ void kvb_fill(unsigned char *buf, unsigned layer, unsigned npages,
				    unsigned tpp, unsigned bpt, unsigned stride, int reverse)
{
	unsigned long long n = (unsigned long long)npages * tpp * bpt;

	for (unsigned long long k = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; k < n;
	     k += (unsigned long long)gridDim.x * blockDim.x) {
		unsigned page, tok, i;
		unsigned long long off =
			kvb_slot_off(k, npages, tpp, bpt, stride, reverse, &page, &tok, &i);

		buf[off] = kvb_pat(page, layer, tok, i);
	}
}

extern "C" __global__ void kvb_check(const unsigned char *buf, unsigned layer, unsigned npages,
				     unsigned tpp, unsigned bpt, unsigned stride, int reverse,
				     unsigned long long *bad)
{
	unsigned long long n = (unsigned long long)npages * tpp * bpt, mine = 0;

	for (unsigned long long k = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; k < n;
	     k += (unsigned long long)gridDim.x * blockDim.x) {
		unsigned page, tok, i;
		unsigned long long off =
			kvb_slot_off(k, npages, tpp, bpt, stride, reverse, &page, &tok, &i);

		mine += buf[off] != kvb_pat(page, layer, tok, i);
	}
	if (mine)
		atomicAdd(bad, mine);
}
