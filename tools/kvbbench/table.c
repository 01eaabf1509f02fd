// SPDX-License-Identifier: MIT
/* table.c - the modes of kvbbench: kvbroker's and the memcpy limit (no peers, no extra deps). */
#include <stddef.h>

#include "kvbbench.h"

const char kvbb_progname[] = "kvbbench";
const struct kvbb_mode *const kvbb_sets[] = {kvbb_broker_modes, NULL};
