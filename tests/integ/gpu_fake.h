/* SPDX-License-Identifier: MIT */
/*
 * gpu_fake.h - what the tests against the fake CUDA driver (tests/fake/libcuda.c: its device
 * memory is shared host memory, so the broker's copies land where the test can read them)
 * share: running under the fake, and the bytes of pages laid out as per-layer buffers.
 */
#ifndef KVB_TESTS_GPU_FAKE_H
#define KVB_TESTS_GPU_FAKE_H

#include <stddef.h>
#include <stdint.h>

/*
 * Re-executes the test once with LD_LIBRARY_PATH naming BUILD/tests/fake (the dynamic loader
 * reads it at start-up only), and KVB_FAKE_CUDA set; the brokers it starts inherit both.
 */
void gf_reexec(char **argv);

/* Pages of `layers` layer buffers, each token slot `bpt` bytes, `tpp` tokens a page. */
struct gf_shape {
	int layers, tpp, bpt;
	uint64_t seed;
};

/* Byte i of token t of layer l of page number `page` (its key: harness_key(seed, page)). */
uint8_t gf_byte(const struct gf_shape *g, int page, int l, int t, int i);
/* Writes page `page` into token slots [slot * tpp, (slot + 1) * tpp) of every layer. */
void gf_fill(const struct gf_shape *g, uint8_t *const *layer, int page, int slot);
/* CHECKs that those slots hold page `page`, naming the first byte that differs. */
void gf_check(const struct gf_shape *g, uint8_t *const *layer, int page, int slot,
	      const char *what);

#endif /* KVB_TESTS_GPU_FAKE_H */
