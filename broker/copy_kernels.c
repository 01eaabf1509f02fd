// SPDX-License-Identifier: MIT
/*
 * copy_kernels.c - the gather/scatter kernel's fatbin (kernels/copy_segs.cu, built by nvcc at
 * build time), embedded as bytes for cuModuleLoadData. Without nvcc there is no kernel and the
 * CUDA engine uses cuMemcpyAsync for every shape.
 */
#include <stddef.h>

#include "copy_cuda.h"

#ifdef KVB_FATBIN
__asm__(".section .rodata\n"
	".balign 64\n"
	".globl kvb_copy_fatbin_start\n"
	".hidden kvb_copy_fatbin_start\n"
	".globl kvb_copy_fatbin_end\n"
	".hidden kvb_copy_fatbin_end\n"
	"kvb_copy_fatbin_start:\n"
	".incbin \"" KVB_FATBIN "\"\n"
	"kvb_copy_fatbin_end:\n"
	".previous\n");
extern const unsigned char kvb_copy_fatbin_start[] __attribute__((visibility("hidden")));
extern const unsigned char kvb_copy_fatbin_end[] __attribute__((visibility("hidden")));

const void *copy_cuda_fatbin(size_t *len)
{
	*len = (size_t)(kvb_copy_fatbin_end - kvb_copy_fatbin_start);
	return kvb_copy_fatbin_start;
}
#else
const void *copy_cuda_fatbin(size_t *len)
{
	*len = 0;
	return NULL;
}
#endif
