/* SPDX-License-Identifier: MIT */
/*
 * loop.h - the event loop, a leaf (as Redis's ae): it knows fds, callbacks, hooks and the
 * clock, and nothing of sessions, the disk tier or the copy engines. Whoever owns an fd
 * registers it with a callback and an argument (struct loop_fd, embedded in the owner, which
 * must stay valid until the epoll batch that may still name it is over: sessions are freed
 * from the graveyard after the batch). What runs every busy round and around a sleep are the
 * hooks the broker gives it (rounds.c). Loop thread only.
 */
#ifndef KVB_BROKER_LOOP_H
#define KVB_BROKER_LOOP_H

#include <stdint.h>

/* A registered fd: fn(arg) runs when it is readable (or hung up). */
struct loop_fd {
	void (*fn)(void *arg);
	void *arg;
	/*
	 * A doorbell of what the rounds poll (an SQ's): its event alone does not restart the
	 * poll window after a sleep; the round after it does if it finds work there.
	 */
	int polled;
};

struct loop_hooks {
	/* Each round while busy: the work done (0: nothing happened). */
	uint32_t (*poll)(void *arg);
	/*
	 * About to sleep: the timeout in microseconds (epoll_pwait2 where the kernel has it,
	 * else rounded up to a millisecond), or 0 when something arrived meanwhile.
	 */
	int (*prepare_sleep)(void *arg);
	/* After a sleep, or a sleep given up: undo what prepare_sleep announced. */
	void (*wake)(void *arg);
	/* An idle polling round: 1 to yield the CPU (a client spins on ours, a worker copies
	 * for us: rounds.c), 2 to sleep at once (a client works on ours for what we wait for:
	 * it wakes us when that is done); may be NULL. After a busy round (busy 1): 1 to yield
	 * (the round completed ops of a client spinning on our CPU: loop.c [busy-share]). */
	int (*share_cpu)(void *arg, int busy);
	/* After each epoll batch; slept: the batch followed a sleep. */
	void (*tick)(void *arg, int slept);
	void *arg;
};

/* [stretch] The thresholds of loop->stretches, in milliseconds: 1, 4, 16 and 64. */
#define LOOP_NSTRETCH 4
extern const unsigned loop_stretch_ms[LOOP_NSTRETCH];

struct loop {
	int epfd;
	int stop;	   /* set by anyone: loop_run returns after the current round */
	double window;	   /* seconds of busy polling after the last work (--poll-us) */
	double hold_until; /* ... and until then, whatever the window (loop_hold) */
	uint64_t sleeps;   /* times it went to sleep (STATS loop_sleeps) */
	uint32_t revents;  /* the epoll events of the fd whose callback runs now */
	/*
	 * [stretch] CPU time of this thread from one look at epoll to the next (loop.c): where
	 * the last one ended, the longest, and how many passed each of loop_stretch_ms.
	 */
	double stretch_at, stretch_max;
	uint64_t stretches[LOOP_NSTRETCH];
	struct loop_hooks h;
};

/*
 * Work the loop expects back within secs (clamped to LOOP_HOLD_MAX): a copy queued on a
 * worker, a client copying a page out of its lease or into its staging buffer before its next
 * op. The loop keeps polling (and yielding its CPU, loop.c) until then rather than sleeping,
 * so the op that follows costs no wake-up. LOOP_HOLD_BPS is the copy rate assumed: the slow
 * end of a loaded machine, so that a window outlasts the copy it covers.
 */
#define LOOP_HOLD_BPS 2e9
#define LOOP_HOLD_MAX 0.005
void loop_hold(struct loop *l, double secs);

/* loop_hold() for a copy of bytes. */
static inline void loop_hold_bytes(struct loop *l, uint64_t bytes)
{
	if (bytes)
		loop_hold(l, (double)bytes / LOOP_HOLD_BPS);
}

/* An epoll set; window in seconds. 0 or a negative errno. */
int loop_init(struct loop *l, double window, const struct loop_hooks *h);
void loop_fini(struct loop *l);

/* Registers fd (level-triggered, readable); h must outlive its registration. */
int loop_add(struct loop *l, int fd, struct loop_fd *h);

/*
 * Registers fd for events (EPOLLIN and/or EPOLLOUT, level-triggered), or changes what an fd
 * registered before waits for (loop_mod): the remote tier's connections want EPOLLOUT only
 * while hiredis has bytes to write. Their callbacks read l->revents.
 */
int loop_add_events(struct loop *l, int fd, struct loop_fd *h, uint32_t events);
int loop_mod(struct loop *l, int fd, struct loop_fd *h, uint32_t events);

/* Unregisters fd (needed when another process holds a dup of it, or the fd lives on). */
void loop_del(struct loop *l, int fd);

/* Runs until l->stop: 0, or a negative errno when epoll_wait failed. */
int loop_run(struct loop *l);

#endif /* KVB_BROKER_LOOP_H */
