/* SPDX-License-Identifier: MIT */
/*
 * clock.h - the broker's one clock: monotonic seconds as a double. Timeouts, the poll window,
 * start-up phases and the drain log all read it, so no file needs the loop to tell the time.
 * Any thread.
 */
#ifndef KVB_BROKER_CLOCK_H
#define KVB_BROKER_CLOCK_H

#include <time.h>

static inline double clock_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif /* KVB_BROKER_CLOCK_H */
