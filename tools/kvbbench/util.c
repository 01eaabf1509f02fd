// SPDX-License-Identifier: MIT
/*
 * util.c - kvbbench's small pure helpers: the latency histogram, random numbers and the Zipf
 * sampler, synthetic keys and page contents, size parsing. No state; safe from any thread.
 *
 * Histogram: log-linear, 64 sub-buckets per power of two of nanoseconds (<1.6% error), so one
 * array of 3776 counters covers 1 ns .. centuries and merging two is adding them.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "kvbbench.h"

const char *const kvbb_kind_name[NKIND] = {"all",     "get",  "put",	    "lookup",
					   "acquire", "load", "write_back", "load_first"};

unsigned kvbb_h_index(uint64_t v)
{
	unsigned e;

	if (v < H_SUB)
		return (unsigned)v;
	e = 63 - (unsigned)__builtin_clzll(v);
	return (e - H_SUB_BITS + 1) * H_SUB + (unsigned)((v >> (e - H_SUB_BITS)) & (H_SUB - 1));
}

/* Midpoint of a bucket, in ns: the error is at most half a bucket (0.8%). */
static double h_value(unsigned idx)
{
	unsigned e, sub;

	if (idx < H_SUB)
		return idx;
	e = idx / H_SUB + H_SUB_BITS - 1;
	sub = idx % H_SUB;
	return (double)((uint64_t)(H_SUB + sub) << (e - H_SUB_BITS)) +
	       (double)(1ull << (e - H_SUB_BITS)) / 2.0;
}

double kvbb_h_quantile(const uint64_t *h, double q)
{
	uint64_t total = 0, want, acc = 0;
	unsigned i;

	for (i = 0; i < H_BUCKETS; i++)
		total += h[i];
	if (!total)
		return 0;
	want = (uint64_t)ceil(q * (double)total);
	if (want < 1)
		want = 1;
	for (i = 0; i < H_BUCKETS; i++) {
		acc += h[i];
		if (acc >= want)
			return h_value(i);
	}
	return h_value(H_BUCKETS - 1);
}

uint64_t kvbb_mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* splitmix64 as a generator: one add and the finaliser per draw. */
uint64_t kvbb_rand(uint64_t *state)
{
	*state += 0x9e3779b97f4a7c15ull;
	return kvbb_mix64(*state);
}

/* 256 random-looking bits: the broker hashes keys as uniformly random SHA-256 output. */
kvb_key kvbb_key(uint64_t seed, uint64_t stream, uint64_t i)
{
	uint64_t h = kvbb_mix64(seed ^ kvbb_mix64(stream * 0x100000001b3ull ^ kvbb_mix64(i)));
	kvb_key k;
	unsigned w;

	for (w = 0; w < 4; w++) {
		h = kvbb_mix64(h + w);
		memcpy(k.b + 8 * w, &h, 8);
	}
	return k;
}

/*
 * The CDF of Zipf(s) over n ranks, built once in the parent (the workers inherit it by fork):
 * n doubles, so a 1M-page working set costs 8 MiB and a draw is one binary search.
 */
int kvbb_zipf_init(struct kvbb_zipf *z, uint64_t n, double s)
{
	double sum = 0;
	uint64_t i;

	z->n = n;
	z->cdf = malloc(n * sizeof(*z->cdf));
	if (!z->cdf)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		sum += 1.0 / pow((double)(i + 1), s);
		z->cdf[i] = sum;
	}
	for (i = 0; i < n; i++)
		z->cdf[i] /= sum;
	return 0;
}

uint64_t kvbb_zipf_draw(const struct kvbb_zipf *z, uint64_t *rng)
{
	double u = (double)(kvbb_rand(rng) >> 11) * 0x1.0p-53;
	uint64_t lo = 0, hi = z->n - 1;

	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;

		if (z->cdf[mid] < u)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

uint64_t kvbb_pick(struct kvbb_w *w, uint64_t i)
{
	const struct kvbb_cfg *cfg = w->cfg;

	switch (cfg->dist) {
	case D_UNIFORM:
		return kvbb_rand(&w->rng) % cfg->pages;
	case D_ZIPF:
		/* Scatter the ranks over the working set so hot pages are not neighbours. */
		return kvbb_mix64(kvbb_zipf_draw(&cfg->zipf, &w->rng) ^ cfg->ws_seed) % cfg->pages;
	case D_SEQ:
	default:
		return (w->start + i) % cfg->pages;
	}
}

const char *kvbb_fmt_bytes(double b, char *buf, size_t len)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	unsigned u = 0;

	while (b >= 1024.0 && u < 4) {
		b /= 1024.0;
		u++;
	}
	snprintf(buf, len, u ? "%.4g %s" : "%.0f %s", b, unit[u]);
	return buf;
}

/* Page content: a fixed pattern with the key in the first 32 bytes, so reads can be checked. */
/* The key at both ends of a page (one end when the page is under two keys): a copy cut short
 * or landing elsewhere misses one of them. */
void kvbb_fill_page(uint8_t *p, size_t len, const kvb_key *k)
{
	size_t i;

	for (i = 0; i < len; i += 4096)
		memset(p + i, (int)(0xa5 ^ (i >> 12)), len - i < 4096 ? len - i : 4096);
	memcpy(p, k->b, len < 32 ? len : 32);
	if (len >= 64)
		memcpy(p + len - 32, k->b, 32);
}

int kvbb_check_page(const uint8_t *p, size_t len, const kvb_key *k)
{
	if (memcmp(p, k->b, len < 32 ? len : 32) || (len >= 64 && memcmp(p + len - 32, k->b, 32)))
		return -EBADMSG;
	return 0;
}

void kvbb_clobber_page(uint8_t *p, size_t len)
{
	memset(p, 0, len < 32 ? len : 32);
	if (len >= 64)
		memset(p + len - 32, 0, 32);
}

void *kvbb_alloc_touched(size_t len)
{
	void *p = NULL;

	/*
	 * On 2 MiB pages where the kernel gives them (THP "madvise" or "always"): on 4 KiB ones
	 * the same memcpy ran 0.84 to 1.20 times as fast as itself into a second buffer of the
	 * same process (`--pair memcpy`, one VM, six runs), whatever physical pages each drew;
	 * on THP 0.997 to 1.011, and 10-20% faster. The registered buffers (client/buf.c) and a
	 * broker's pool are advised the same.
	 */
	if (posix_memalign(&p, len >= (2u << 20) ? 2u << 20 : 4096, len))
		return NULL;
	(void)madvise(p, len, MADV_HUGEPAGE); /* EINVAL where THP is compiled out */
	memset(p, 0x5a, len);		      /* fault every page in before timing */
	return p;
}

void kvbb_record(struct kvbb_w *w, enum kvbb_kind kind, uint64_t ns)
{
	w->s->hist[kind][kvbb_h_index(ns)]++;
	w->s->kops[kind]++;
	w->s->kns[kind] += ns;
}

void kvbb_fail(struct kvbb_slot *s, int rc, const char *what)
{
	s->rc = rc ? rc : -EIO;
	snprintf(s->err, sizeof(s->err), "%s: %s", what, kvb_strerror(rc));
}

int kvbb_text_key(char *out, size_t len, size_t page_bytes, uint64_t i)
{
	return snprintf(out, len, "kvbb:%zu:%" PRIu64, page_bytes, i);
}
