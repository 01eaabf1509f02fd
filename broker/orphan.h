/* SPDX-License-Identifier: MIT */
/*
 * orphan.h - leases that outlive their broker: records of this broker's sessions kept by the
 * keeper, and the previous broker's clients whose leases the adopting broker holds. See
 * orphan.c.
 */
#ifndef KVB_BROKER_ORPHAN_H
#define KVB_BROKER_ORPHAN_H

#include <stdint.h>

struct broker;
struct session;
struct page;

/* A random id of this broker's run, for the tags of its sessions' records. */
uint32_t orphan_run_id(void);

/* [records] At attach, while region_fd is open: the session's record goes to the keeper. */
void orphan_session_keep(struct broker *b, struct session *s, int region_fd);
/* [records] Lease i of s (or only the count, i >= nleases) changed: the ledger follows. */
void orphan_ledger(struct broker *b, struct session *s, uint32_t i);
/* [records] The session ends: its record goes (unless the broker hands over). */
void orphan_session_drop(struct broker *b, struct session *s);

/* [records] The keeper died: every record must go to the next one (orphan_resend). */
void orphan_holder_lost(struct broker *b);
/* [records] Sends the records the current keeper (or fd store) lacks; watch.c, each look. */
void orphan_resend(struct broker *b);

/* [orphans] Before adopt_pool installs pages: the previous broker's records. 0 or -errno. */
int orphan_load(struct broker *b);
/* [orphans] adopt_pool installed pg: pinned for every orphan that leases it. */
void orphan_adopted(struct broker *b, struct page *pg);
/* [orphans] Once the loop exists: orphans that hold nothing go, the others are watched. */
void orphan_start(struct broker *b);
/* [orphans] Each tick while any is left: those whose client let go, or exited, go. */
void orphan_tick(struct broker *b);
void orphan_fini(struct broker *b);
/* [tenant-rebind] Whether a client of the previous broker still leases in partition part. */
int orphan_in_part(struct broker *b, uint32_t part);

#endif /* KVB_BROKER_ORPHAN_H */
