// SPDX-License-Identifier: MIT
/*
 * gpu_fake.c - the fake-CUDA tests' shared pieces. See gpu_fake.h.
 */
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "gpu_fake.h"
#include "harness.h"

void gf_reexec(char **argv)
{
	char self[PATH_MAX], dir[PATH_MAX + 8];

	if (getenv("KVB_FAKE_CUDA"))
		return;
	if (!realpath(argv[0], self)) {
		perror("realpath");
		exit(1);
	}
	snprintf(dir, sizeof(dir), "%s/fake", dirname(self));
	setenv("LD_LIBRARY_PATH", dir, 1);
	setenv("KVB_FAKE_CUDA", dir, 1);
	execv(argv[0], argv);
	perror("execv");
	exit(1);
}

uint8_t gf_byte(const struct gf_shape *g, int page, int l, int t, int i)
{
	kvb_key k = harness_key(g->seed, (uint64_t)page);

	return harness_byte(&k, g->seed, ((size_t)l * g->tpp + t) * g->bpt + (size_t)i);
}

static size_t at(const struct gf_shape *g, int slot, int t, int i)
{
	return ((size_t)slot * g->tpp + t) * g->bpt + (size_t)i;
}

void gf_fill(const struct gf_shape *g, uint8_t *const *layer, int page, int slot)
{
	for (int l = 0; l < g->layers; l++)
		for (int t = 0; t < g->tpp; t++)
			for (int i = 0; i < g->bpt; i++)
				layer[l][at(g, slot, t, i)] = gf_byte(g, page, l, t, i);
}

void gf_check(const struct gf_shape *g, uint8_t *const *layer, int page, int slot, const char *what)
{
	for (int l = 0; l < g->layers; l++)
		for (int t = 0; t < g->tpp; t++)
			for (int i = 0; i < g->bpt; i++) {
				uint8_t got = layer[l][at(g, slot, t, i)];
				uint8_t want = gf_byte(g, page, l, t, i);

				CHECKF(got == want,
				       "%s: page %d layer %d token %d byte %d: 0x%02x, want 0x%02x",
				       what, page, l, t, i, got, want);
			}
}
