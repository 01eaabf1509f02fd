/* SPDX-License-Identifier: MIT */
/*
 * bg.h - the broker's background thread: memory work that must not stall the loop (which
 * serves every client), run in the order it was asked for. See bg.c.
 */
#ifndef KVB_BROKER_BG_H
#define KVB_BROKER_BG_H

#include <stddef.h>

struct bg;

/* The thread (NULL when it cannot start: then every call below does its work inline). */
struct bg *bg_start(void);
/* Finishes every job asked for, then stops the thread and frees it. NULL is a no-op. */
void bg_stop(struct bg *g);

/*
 * Maps every page of a client's buffer into our page tables (MADV_POPULATE_WRITE), so that the
 * copies that follow do not fault 4 KiB at a time. Best effort: with no thread, nothing.
 */
void bg_populate(struct bg *g, void *addr, size_t len);
/* munmap(addr, len), later; after every bg_populate() asked before it. */
void bg_unmap(struct bg *g, void *addr, size_t len);

/* Jobs asked for and not yet done (tests, stats). */
size_t bg_pending(struct bg *g);

#endif /* KVB_BROKER_BG_H */
