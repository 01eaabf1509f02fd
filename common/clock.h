/* SPDX-License-Identifier: MIT */
/*
 * clock.h - the one clock of every program and of the library: CLOCK_MONOTONIC, as
 * nanoseconds (clock_ns) or as seconds in a double (clock_now). Timeouts, deadlines, the
 * broker's poll window, start-up phases, the drain log and every tool's timings read it; none
 * reads the wall clock for an interval. Header-only so that libkvbroker, which does not link
 * common/, uses the same one. Any thread.
 */
#ifndef KVB_COMMON_CLOCK_H
#define KVB_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t clock_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline double clock_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif /* KVB_COMMON_CLOCK_H */
