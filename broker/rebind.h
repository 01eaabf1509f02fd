/* SPDX-License-Identifier: MIT */
/*
 * rebind.h - a released tenant partition bound to a new tenant in fresh memory files
 * [tenant-rebind]. See rebind.c. Loop thread.
 */
#ifndef KVB_BROKER_REBIND_H
#define KVB_BROKER_REBIND_H

#include <stdint.h>

struct broker;

/*
 * Binds tenant key (one client attaching) to the released partition idle longest that can be
 * emptied now (tenant_rebind_pick, then the next), with new memfds; returns the partition, or
 * -EUSERS when none can (in use, not a sparse pool, or a keeper that cannot take new files).
 */
int part_rebind(struct broker *b, uint32_t key);

#endif /* KVB_BROKER_REBIND_H */
