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
};

struct loop_hooks {
	/* Each round while busy: the work done (0: nothing happened). */
	uint32_t (*poll)(void *arg);
	/* About to sleep: the epoll timeout in ms, or 0 when something arrived meanwhile. */
	int (*prepare_sleep)(void *arg);
	/* After a sleep, or a sleep given up: undo what prepare_sleep announced. */
	void (*wake)(void *arg);
	/* After each epoll batch; slept: the batch followed a sleep. */
	void (*tick)(void *arg, int slept);
	void *arg;
};

struct loop {
	int epfd;
	int stop;	  /* set by anyone: loop_run returns after the current round */
	double window;	  /* seconds of busy polling after the last work (--poll-us) */
	uint32_t revents; /* the epoll events of the fd whose callback runs now */
	struct loop_hooks h;
};

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
