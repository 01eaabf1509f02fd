/* SPDX-License-Identifier: MIT */
/*
 * keeper.h - the pool keeper: a small process that holds a broker's pool fds so that the RAM
 * pool outlives a broker that dies, and the broker side of talking to it. See keeper.c.
 */
#ifndef KVB_BROKER_KEEPER_H
#define KVB_BROKER_KEEPER_H

#include <stdint.h>

#include "pool.h"

/* Most fds a pool hands over: its side table and every arena. */
#define KEEPER_MAX_FDS (1 + POOL_MAX_ARENAS) /* the side table and every arena */

/* "<socket>.keep" into out (108 bytes); -ENAMETOOLONG when it does not fit a socket address. */
int keeper_path(const char *sock, char *out);

/*
 * The fds the keeper of sock holds (side table first, then the arenas), fresh copies the caller
 * owns. Returns how many, -ENOENT when no keeper answers (a stale socket file is removed), or
 * another negative errno (-EPERM: it belongs to another user, -EPROTO).
 */
int keeper_fetch(const char *sock, int *fds, uint32_t max);

/* Tells the keeper of sock to close its fds and exit. 0, -ENOENT when none, or -errno. */
int keeper_free(const char *sock);

/*
 * Starts a keeper for sock holding fds (it gets its own copies; ours stay ours). The keeper is
 * not our child (double fork, own session), answers only our uid, and exits when told to, when
 * its socket file is removed or replaced, or with its last fd. Must be called while the broker
 * has no other thread. 0 or a negative errno (the broker then runs without crash survival).
 */
int keeper_spawn(const char *sock, const int *fds, uint32_t n);

/* kvbrokerd --keeper N PATH: the keeper's main, on fd 3 (listening) and fds 4..4+N-1. */
int keeper_main(int nfds);

#endif /* KVB_BROKER_KEEPER_H */
