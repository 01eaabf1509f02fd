// SPDX-License-Identifier: MIT
/*
 * watch.c - the broker's watch over what it relies on but does not hold in its own memory: the
 * keeper of its pool (keeper.c) and the files beside its socket (instance.c).
 *
 * A keeper that dies (a SIGKILL, an OOM kill, an operator's pkill) leaves the pool in the
 * broker's mappings only: the next crash of the broker would lose every page. The keeper's
 * owner connection is in the loop, so its death is seen at once (the kernel hangs the
 * connection up): it is logged, and a new keeper gets the pool's fds from the broker's own
 * (keeper_spawn forks and execs with async-signal-safe calls only, so the loop thread may
 * start one while copy workers run). A start that fails is tried again every
 * WATCH_RETRY seconds; until one runs, the stats say the pool is not restart-safe.
 *
 * The socket file and the lock file can be removed under a running broker (a tmp cleaner, an
 * operator cleaning up): clients could no longer attach, and a second broker would start on
 * the same path. Once a second the broker looks: a file that is gone is made again (the
 * directory first), and logged; a file that another live broker made meanwhile is left to it
 * and logged once (that broker runs a pool of its own: our keeper refuses it ours). The keeper
 * binds its own socket file again while it has an owner (keeper.c [owner]).
 *
 * Loop thread only.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "broker.h"
#include "instance.h"
#include "log.h"
#include "orphan.h"
#include "watch.h"

#define WATCH_EVERY 1.0 /* seconds between looks at the files */
#define WATCH_RETRY 5.0 /* seconds between keeper starts that fail */
/*
 * A keeper killed closes its owner connection before its listening socket is released (an
 * exiting task's files are released last-closed first), so a new one started at once can find
 * the dead one still answering for a moment: it waits a little, and tries soon again after
 * that one reason.
 */
#define WATCH_SETTLE 0.05

int watch_restart_safe(const struct broker *b)
{
	/* [records] ... and it has every session's record: their leases hold too. */
	return (b->fdstore || (b->keeper && b->kl.fd >= 0)) && !b->orphan_st.pending;
}

static void on_keeper(void *arg);

static void keeper_join(struct broker *b)
{
	b->watch.on_keeper = (struct loop_fd){.fn = on_keeper, .arg = b};
	if (b->kl.fd >= 0 && loop_add(&b->loop, b->kl.fd, &b->watch.on_keeper) < 0)
		log_warn("pool keeper: cannot watch it: its death would go unnoticed");
}

/* A new keeper for our pool, from our own fds. */
static void keeper_restart(struct broker *b, double now)
{
	int fds[KEEPER_MAX_FDS], err;
	uint32_t n = pool_handover_fds(&b->pool, fds);

	err = keeper_spawn(b->cfg.socket_path, fds, n, &b->kl);
	if (err == -EADDRINUSE && b->watch.busy_tries++ < 20) {
		b->watch.retry_at = now + 4 * WATCH_SETTLE;
		return;
	}
	if (err) {
		b->watch.retry_at = now + WATCH_RETRY;
		log_error("pool keeper: cannot start a new one (%s%s): the pool will not survive "
			  "a crash of this broker; trying again in %.0f s",
			  strerror(-err),
			  err == -EADDRINUSE ? ": another keeper answers on this socket's path"
					     : "",
			  WATCH_RETRY);
		return;
	}
	b->keeper = 1;
	b->watch.busy_tries = 0;
	b->watch.keeper_starts++;
	keeper_join(b);
	orphan_resend(b); /* [records] what the dead one held */
	log_info("pool keeper: a new one runs (pid %d): the pool survives a crash again",
		 (int)b->kl.pid);
}

/* The owner connection is readable: the keeper hung up (it died), or said something. */
static void on_keeper(void *arg)
{
	struct broker *b = arg;
	char buf[64];
	ssize_t r = recv(b->kl.fd, buf, sizeof(buf), MSG_DONTWAIT);
	pid_t pid = b->kl.pid;

	if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EINTR)))
		return; /* nothing is expected from it; a keeper that talks is still alive */
	loop_del(&b->loop, b->kl.fd);
	keeper_release(&b->kl, 0);
	b->keeper = 0;
	b->watch.keeper_deaths++;
	orphan_holder_lost(b); /* [records] they died with it */
	log_error("pool keeper (pid %d) died: until a new one runs, a crash of this broker "
		  "loses the pool",
		  (int)pid);
	b->watch.retry_at = clock_now() + WATCH_SETTLE; /* watch_tick starts the next */
}

void watch_start(struct broker *b)
{
	if (b->kl.fd >= 0)
		keeper_join(b);
	if (stat(b->cfg.socket_path, &b->watch.sock) < 0)
		memset(&b->watch.sock, 0, sizeof(b->watch.sock));
	b->watch.at = clock_now();
}

/* The lock file: ours, made again, or another broker's now. */
static void watch_lock(struct broker *b)
{
	char path[sizeof(b->cfg.socket_path) + 8];
	pid_t owner;
	int fd;

	snprintf(path, sizeof(path), "%s.lock", b->cfg.socket_path);
	if (b->lock_fd < 0 || instance_is(path, b->lock_fd, NULL))
		return;
	fd = instance_lock(b->cfg.socket_path, &owner);
	if (fd < 0) {
		if (!b->watch.lock_lost)
			log_error("lock file %s was removed and another kvbrokerd (pid %d) holds "
				  "the new one: it runs a pool of its own (this one's keeper "
				  "refuses it ours); clients attached here go on",
				  path, (int)owner);
		b->watch.lock_lost = 1;
		return;
	}
	close(b->lock_fd); /* an unlinked inode: nobody can find it */
	b->lock_fd = fd;
	b->watch.lock_lost = 0;
	b->watch.files_made++;
	log_warn("lock file %s was removed (a tmp cleaner, an operator?): made again", path);
}

/* The socket file: ours, made again, or another broker's now. */
static void watch_socket(struct broker *b)
{
	int fd;

	if (b->listen_fd < 0 || instance_is(b->cfg.socket_path, -1, &b->watch.sock))
		return;
	fd = instance_listen(b->cfg.socket_path, b->cfg.has_group, b->cfg.group);
	if (fd < 0) {
		if (!b->watch.sock_lost)
			log_error("socket %s was removed or replaced, and cannot be made again "
				  "(%s%s): only clients attached already reach this broker",
				  b->cfg.socket_path, strerror(-fd),
				  fd == -EADDRINUSE ? ": another kvbrokerd answers there" : "");
		b->watch.sock_lost = 1;
		return;
	}
	loop_del(&b->loop, b->listen_fd);
	close(b->listen_fd);
	b->listen_fd = fd;
	if (loop_add(&b->loop, fd, &b->on_listen) < 0)
		log_error("socket %s: cannot listen again: only clients attached already reach "
			  "this broker",
			  b->cfg.socket_path);
	if (stat(b->cfg.socket_path, &b->watch.sock) < 0)
		memset(&b->watch.sock, 0, sizeof(b->watch.sock));
	b->watch.sock_lost = 0;
	b->watch.files_made++;
	log_warn("socket %s was removed (a tmp cleaner, an operator?): listening on a new one",
		 b->cfg.socket_path);
}

void watch_tick(struct broker *b, double now)
{
	if (b->cfg.keep && !b->keeper && !b->fdstore && !b->handover && !b->loop.stop &&
	    now >= b->watch.retry_at)
		keeper_restart(b, now);
	if (now - b->watch.at < WATCH_EVERY)
		return;
	b->watch.at = now;
	if (b->orphan_st.pending)
		orphan_resend(b); /* [records] a keeper that lagged (its socket was full) */
	if (instance_dir(b->cfg.socket_path, b->cfg.has_group, b->cfg.group) < 0)
		return;
	watch_lock(b);
	watch_socket(b);
}
