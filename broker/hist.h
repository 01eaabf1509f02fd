/* SPDX-License-Identifier: MIT */
/*
 * hist.h - fixed-bucket histograms of what the broker times: op latency as the broker sees it
 * (from the SQE taken off the ring to its CQE), disk promotion and remote fetch latency, and
 * page age at eviction. Exported as Prometheus classic histograms (common/metrics.c) through
 * the STATS document's "histograms" object (stats.c).
 *
 * [hist] Cheap by construction: the loop thread alone observes and reads them (the broker
 * runs every op on its loop), so a histogram is plain counters with no lock and no atomic;
 * an observation is a short walk up fixed bounds (most values land in the first few) and two
 * additions. Buckets hold their own counts (not cumulative): the exporter sums them.
 */
#ifndef KVB_BROKER_HIST_H
#define KVB_BROKER_HIST_H

#include <stdint.h>

#define HIST_MAX_BOUNDS 22u

struct hist {
	uint64_t n[HIST_MAX_BOUNDS + 1]; /* n[i]: values <= bound i (and > bound i-1); last +Inf */
	uint64_t count;
	double sum;
};

/* Upper bounds (le), seconds, ascending. */
struct hist_bounds {
	const double *le;
	uint32_t n;
};

/* Which histogram: the op ones first, in the order stats.c names them. */
enum hist_id {
	HIST_GET = 0,	/* GET, and the kvb_get() ACQUIRE/RELEASE pair's ACQUIRE */
	HIST_PUT,	/* PUT */
	HIST_LOOKUP,	/* LOOKUP (all its keys) */
	HIST_ACQUIRE,	/* zero-copy ACQUIRE */
	HIST_PROMOTE,	/* disk read of a promotion: submitted to checked and committed */
	HIST_FETCH,	/* remote fetch: sent to value checked and committed */
	HIST_EVICT_AGE, /* a page's age (since stored) when evicted from RAM */
	HIST__COUNT,
};

/* Latencies: 5 us to 10 s. */
static const double hist_lat_le[] = {5e-6,   10e-6,  25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
				     1e-3,   2.5e-3, 5e-3,  10e-3, 25e-3,  50e-3,  100e-3,
				     250e-3, 500e-3, 1,	    2.5,   5,	   10};
/* Ages: 1 s to a week. */
static const double hist_age_le[] = {1,	   5,	 15,	30,    60,    120,   300,    600,
				     1800, 3600, 10800, 21600, 43200, 86400, 259200, 604800};

static inline struct hist_bounds hist_bounds_of(enum hist_id id)
{
	if (id == HIST_EVICT_AGE)
		return (struct hist_bounds){hist_age_le, sizeof(hist_age_le) / sizeof(double)};
	return (struct hist_bounds){hist_lat_le, sizeof(hist_lat_le) / sizeof(double)};
}

/* Counts v (seconds) into h, whose bounds are b. Loop thread. */
static inline void hist_observe(struct hist *h, struct hist_bounds b, double v)
{
	uint32_t i = 0;

	while (i < b.n && v > b.le[i])
		i++;
	h->n[i]++;
	h->count++;
	h->sum += v;
}

#endif /* KVB_BROKER_HIST_H */
