/* SPDX-License-Identifier: MIT */
/*
 * size.h - the one reading of a size on every command line (kvbrokerd, kvbctl, kvbbench,
 * kvbdisk) and in kvbrokerd's config file, so that "300G" means the same bytes everywhere.
 * docs/operations.md ("Sizes and durations") has the table; tests/unit/test_size.c checks the
 * parser against that table. Pure functions, any thread.
 *
 *   300, 300B        bytes
 *   300K, 300Ki, 300KiB   300 x 2^10 (also M 2^20, G 2^30, T 2^40, P 2^50): IEC, as memory
 *                    is sold and as free(1), /proc/meminfo and Kubernetes' "Gi" count it
 *   300KB            300 x 10^3 (MB 10^6, GB 10^9, TB 10^12, PB 10^15): SI, only when
 *                    spelled with a B and no i, as disks are sold
 *   4.5M             a fraction is taken when the result is a whole number of bytes
 *
 * Letters are case-insensitive except that the B of an SI unit may not be followed by
 * anything; "4.5M" is 4718592 and "0.1K" (102.4 bytes) is refused.
 */
#ifndef KVB_COMMON_SIZE_H
#define KVB_COMMON_SIZE_H

#include <stddef.h>
#include <stdint.h>

/*
 * Reads a size at the start of s. With end NULL the whole string must be the size; otherwise
 * *end gets what follows it (a list such as "0:64G,1:32G" goes on there). Returns 0, or
 * -EINVAL for garbage, a sign, an empty number, a fraction of a byte, or a value past
 * UINT64_MAX; *out is untouched on error.
 */
int size_parse_end(const char *s, uint64_t *out, const char **end);

static inline int size_parse(const char *s, uint64_t *out)
{
	return size_parse_end(s, out, (const char **)0);
}

/*
 * bytes as the shortest exact size this parser reads back ("4G", "1536K", "300000000000"),
 * into buf (at least 24 bytes). Returns buf.
 */
const char *size_format(uint64_t bytes, char *buf, size_t len);

#endif /* KVB_COMMON_SIZE_H */
