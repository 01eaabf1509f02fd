/* SPDX-License-Identifier: MIT */
/*
 * duration.h - the one reading of a time span on every command line and in kvbrokerd's config
 * file: a number, optionally with a fraction, then an optional unit ns, us, ms, s, m or h. A
 * bare number is in the unit the option names (--poll-us 200 is 200 us, --remote-timeout 200
 * is 200 ms, --lease-lifetime 600 is 600 s), so old command lines keep their meaning, and
 * "--lease-lifetime 10m" says the unit itself. docs/operations.md ("Sizes and durations").
 * Pure functions, any thread.
 */
#ifndef KVB_COMMON_DURATION_H
#define KVB_COMMON_DURATION_H

#include <stdint.h>

#define DUR_NS 1ull
#define DUR_US 1000ull
#define DUR_MS 1000000ull
#define DUR_S 1000000000ull

/*
 * s as nanoseconds into *ns; a bare number counts unit_ns each (DUR_US, DUR_MS, DUR_S).
 * Returns 0, or -EINVAL for garbage, a sign, an unknown unit, a fraction of a nanosecond or
 * more than UINT64_MAX ns (584 years); *ns is untouched on error.
 */
int duration_parse(const char *s, uint64_t unit_ns, uint64_t *ns);

#endif /* KVB_COMMON_DURATION_H */
