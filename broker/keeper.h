/* SPDX-License-Identifier: MIT */
/*
 * keeper.h - the pool keeper: a small process that holds a broker's pool fds so that the RAM
 * pool outlives a broker that dies, and refuses the pool to a second broker while its owner
 * lives; and the broker side of talking to it. See keeper.c.
 */
#ifndef KVB_BROKER_KEEPER_H
#define KVB_BROKER_KEEPER_H

#include <stdint.h>
#include <sys/types.h>

#include "pool.h"

/* Most fds a pool hands over: its side table and every arena. */
#define KEEPER_MAX_FDS (1 + POOL_MAX_ARENAS) /* the side table and every arena */

/*
 * [owner] A broker's link to the keeper of its pool: the owner connection (-1 none) and the
 * keeper's pid. While fd is open no other broker gets the pool; it hangs up (readable, EOF)
 * when the keeper dies.
 */
struct keeper_link {
	int fd;
	pid_t pid;
};

/* "<socket>.keep" into out (108 bytes); -ENAMETOOLONG when it does not fit a socket address. */
int keeper_path(const char *sock, char *out);

/*
 * The fds the keeper of sock holds (side table first, then the arenas), fresh copies the caller
 * owns, and the pool's ownership with them (*k; k->fd is -1 when the keeper is of an earlier
 * version, which knows no owner). Returns how many, -ENOENT when no keeper answers (a stale
 * socket file is removed), -EBUSY when a live broker owns the pool (k->pid: its pid), or
 * another negative errno (-EPERM: it belongs to another user, -EPROTO).
 */
int keeper_fetch(const char *sock, int *fds, uint32_t max, struct keeper_link *k);

/*
 * Tells the keeper of sock to close its fds and exit (kvbrokerd --free-pool). 0, -ENOENT when
 * none, -EBUSY when a live broker owns the pool (*owner: its pid), or -errno.
 */
int keeper_free(const char *sock, pid_t *owner);

/*
 * Closes the owner connection of k: the pool is then the next broker's to adopt (a hand-over,
 * a crash), or, with free_pool, freed first (the keeper exits). 0, -ENOENT when k holds none,
 * or the FREE's -errno.
 */
int keeper_release(struct keeper_link *k, int free_pool);

/*
 * Starts a keeper for sock holding fds (it gets its own copies; ours stay ours), owned by us
 * through *k. The keeper is not our child (double fork, own session), answers only our uid,
 * and exits when told to, or when it has no owner and its socket file is removed or replaced.
 * Async-signal-safe between fork and exec, so any thread may call it. 0, -EADDRINUSE when a
 * keeper already answers for sock, or a negative errno (the broker then runs without crash
 * survival).
 */
int keeper_spawn(const char *sock, const int *fds, uint32_t n, struct keeper_link *k);

/*
 * [records] What a broker's sessions need to outlive it (orphan.c): per session a tag, its
 * tenant partition and up to KEEPER_REC_FDS fds, kept by the keeper until deleted, and handed
 * to the next owner by keeper_rec_list. Add and delete never wait (the loop thread calls them):
 * -EAGAIN when the keeper lags, -ENOENT when k holds no keeper.
 */
#define KEEPER_REC_FDS 3
int keeper_rec_add(struct keeper_link *k, uint64_t tag, uint32_t part, const int *fds, uint32_t n);
int keeper_rec_del(struct keeper_link *k, uint64_t tag);
/* Calls fn for each record (fn owns the fds); the count or a negative errno. */
typedef void (*keeper_rec_fn)(void *arg, uint64_t tag, uint32_t part, int *fds, uint32_t n);
int keeper_rec_list(struct keeper_link *k, keeper_rec_fn fn, void *arg);

/*
 * [tenant-rebind] Has the keeper of k replace pool fd i (0 the side table, 1 + a arena a) with
 * a copy of fd, and waits for its answer (KEEPER_TIMEOUT_S at most). 0, -ENOENT when k holds
 * no keeper, -ETIMEDOUT (a keeper of an earlier version, which ignores it), -EIO when the
 * keeper could not, or another negative errno.
 */
int keeper_swap(struct keeper_link *k, uint32_t i, int fd);

/* kvbrokerd --keeper N PATH: the keeper's main, on fds 3 (listening), 4 (owner), 5..5+N-1. */
int keeper_main(int nfds);

#endif /* KVB_BROKER_KEEPER_H */
