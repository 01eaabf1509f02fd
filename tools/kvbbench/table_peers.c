// SPDX-License-Identifier: MIT
/*
 * table_peers.c - the modes of kvbbench-peers: kvbbench's plus Redis (hiredis) and memcached
 * (libmemcached), timed by the same driver. Built only by `make bench`.
 */
#include <stddef.h>

#include "kvbbench.h"

const char kvbb_progname[] = "kvbbench-peers";
const struct kvbb_mode *const kvbb_sets[] = {kvbb_broker_modes, kvbb_redis_modes, kvbb_memc_modes,
					     NULL};
