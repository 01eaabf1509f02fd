// SPDX-License-Identifier: MIT
/*
 * keeper.c - the pool keeper, which lets a RAM pool outlive a broker that dies, and guards the
 * pool's identity: one pool, one broker.
 *
 * A pool's arenas are memfds: they have no name, and the memory goes with the last fd or
 * mapping. The keeper is a process that holds one more fd of each (and of the side table,
 * pagehdr.c), does nothing else, and gives them to the next broker on the same socket, which
 * adopts the pool (adopt.c). It is kvbrokerd itself, exec'd as "kvbrokerd --keeper N PATH" from
 * a double fork (its own session, not the broker's child, so a SIGKILL of the broker or of its
 * process group leaves it alone), with its listening socket on fd 3, its owner's connection on
 * fd 4 and the pool on fds 5... It maps nothing: its cost is a few fds and a page of memory.
 *
 * [owner] The pool has one owner at a time: the broker at the other end of the keeper's owner
 * connection (a socketpair made by the broker that spawns the keeper, or the connection over
 * which a broker adopting the pool fetched it). While that connection is open the keeper
 * refuses the pool to everyone else, whatever happened to the files: a second broker started on
 * the same path after an operator or a tmp cleaner removed the socket and its lock file is told
 * the owner's pid (KEEPER_BUSY) instead of adopting a pool that a live broker writes. The kernel
 * closes the connection when the owner dies, however it dies, so the next broker is never kept
 * out by a dead one; a broker that hands over (--takeover) has exited before its successor asks,
 * and a request from a non-owner waits up to KEEPER_OWNER_GRACE_MS for the owner's end to close
 * (fds are closed one by one at exit: the lock may go before this connection). The other way
 * round, the owner sees the connection hang up when the keeper dies, which is how the broker's
 * watch (watch.c) notices and starts a new keeper.
 *
 * Protocol, on "<socket>.keep" (SOCK_SEQPACKET, mode 0600 in the socket's directory) and on the
 * owner connection: the client sends struct keeper_msg {KEEPER_MAGIC, op}. GET is answered with
 * {KEEPER_MAGIC, GET, n, keeper pid} and the n fds (SCM_RIGHTS), and makes the asker the owner
 * (its connection stays open); FREE with {KEEPER_MAGIC, FREE}, after which the keeper closes
 * everything and exits; either, from a non-owner while an owner lives, with {KEEPER_MAGIC, BUSY,
 * 0, owner pid}. A new keeper says {KEEPER_MAGIC, HELLO, 0, its pid} on the owner connection
 * once it runs. Anything else is answered with op 0 and ignored. A keeper of an earlier version
 * answers GET with 0 in the last word and has no owner: the broker then starts a keeper of its
 * own (main.c), which replaces the old one's socket file, and the old one exits.
 *
 * Security: the fds it holds are read-write (pool.c [keep]), so the keeper must hand them only
 * to a broker: it answers a peer only when SO_PEERCRED says the peer is its own uid or root
 * (the same trust the broker's fds have: a process of the broker's uid could ptrace a dumpable
 * broker), it is not dumpable (no /proc/<pid>/fd reopen, no ptrace, by its own uid either), and
 * the socket file is 0600 in a directory the broker created 0750.
 *
 * Lifetime: it exits on FREE (a clean broker exit, kvbrokerd --free-pool), on SIGTERM, and when
 * it has no owner and its socket file disappears or is replaced (checked every second: a
 * removed directory, an operator's rm; nobody could ask for the pool again). While it has an
 * owner it binds its socket file again where it was removed, so that the next broker finds the
 * pool after a crash; a file of someone else's in its place is left alone. Nothing else ends
 * it, by design: after a crash it waits for the next broker.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "keeper.h"
#include "log.h"
#include "proto.h"

#define KEEPER_MAGIC 0x4b50564bu /* "KVPK" */
#define KEEPER_GET 1u
#define KEEPER_FREE 2u
#define KEEPER_BUSY 3u
#define KEEPER_HELLO 4u
#define KEEPER_ADD 5u  /* [records] owner only: keep a session's record and its fds */
#define KEEPER_DEL 6u  /* ... drop it */
#define KEEPER_LIST 7u /* ... send every record (REC each), then END */
#define KEEPER_REC 8u
#define KEEPER_END 9u
#define KEEPER_SWAP 10u /* [tenant-rebind] owner only: replace pool fd tag with the one sent */
#define KEEPER_TIMEOUT_S 5
#define KEEPER_OWNER_GRACE_MS 1000
#define KEEPER_LISTEN_FD 3
#define KEEPER_OWNER_FD 4
#define KEEPER_POOL_FD 5

struct keeper_msg {
	uint32_t magic;
	uint32_t op;
	uint32_t nfds;
	uint32_t pid; /* GET, HELLO: the keeper's; BUSY: the owner's; 0 in requests */
};

/* [records] ADD, DEL, LIST, REC, END: a session's record, with up to KEEPER_REC_FDS fds. */
struct keeper_rec {
	uint32_t magic;
	uint32_t op;
	uint32_t nfds;
	uint32_t part; /* the session's tenant partition */
	uint64_t tag;  /* the broker's run and the session's id */
};

int keeper_path(const char *sock, char *out)
{
	if (snprintf(out, sizeof(((struct sockaddr_un *)0)->sun_path), "%s.keep", sock) >=
	    (int)sizeof(((struct sockaddr_un *)0)->sun_path))
		return -ENAMETOOLONG;
	return 0;
}

static void set_timeouts(int fd)
{
	struct timeval tv = {.tv_sec = KEEPER_TIMEOUT_S};

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* A connected socket to the keeper of sock, or -ENOENT when none answers. */
static int keeper_connect(const char *sock)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd, err = keeper_path(sock, sa.sun_path);

	if (err)
		return err;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		err = errno == ENOENT || errno == ECONNREFUSED ? -ENOENT : -errno;
		if (errno == ECONNREFUSED) /* a keeper that died: its socket file is stale */
			unlink(sa.sun_path);
		close(fd);
		return err;
	}
	set_timeouts(fd);
	return fd;
}

/* Sends m with n fds (n may be 0). */
static int msg_send(int fd, const struct keeper_msg *m, const int *fds, uint32_t n)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * KEEPER_MAX_FDS)];
		struct cmsghdr align;
	} cm;
	struct keeper_msg copy = *m; /* iovec wants a mutable pointer */
	struct iovec iov = {&copy, sizeof(copy)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

	if (n)
		kvb_msg_attach_fds(&mh, cm.b, fds, n);
	return sendmsg(fd, &mh, MSG_NOSIGNAL) == (ssize_t)sizeof(*m) ? 0 : -errno;
}

/*
 * One message of at most len bytes into buf, its fds (at most max, close-on-exec) into fds and
 * their count into *n. Returns the bytes received (0: the peer hung up) or -errno; fds past max
 * and truncated messages are -EPROTO, with every fd received closed.
 */
static ssize_t recv_fds(int fd, void *buf, size_t len, int *fds, uint32_t max, uint32_t *n)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * KEEPER_MAX_FDS)];
		struct cmsghdr align;
	} cm;
	struct iovec iov = {buf, len};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cm.b,
			    .msg_controllen = sizeof(cm)};
	ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
	int err = 0;

	*n = 0;
	if (r < 0)
		return -errno;
	err = kvb_msg_take_fds(&mh, fds, max, n);
	return err ? err : r;
}

/*
 * Receives a reply of op; its fds (at most max) into fds, the pid it carries into *pid. Returns
 * the fd count, -EBUSY for a BUSY reply (*pid: the owner), or another negative errno.
 */
static int msg_recv(int fd, uint32_t op, int *fds, uint32_t max, pid_t *pid)
{
	struct keeper_msg m = {0};
	uint32_t n;
	ssize_t r = recv_fds(fd, &m, sizeof(m), fds, max, &n);
	int err = 0;

	if (r < 0)
		return (int)r;
	if (r == (ssize_t)sizeof(m) && m.magic == KEEPER_MAGIC && m.op == KEEPER_BUSY && !n) {
		*pid = (pid_t)m.pid;
		return -EBUSY;
	}
	if (r != (ssize_t)sizeof(m) || m.magic != KEEPER_MAGIC || m.op != op || m.nfds != n)
		err = r == 0 ? -ECONNRESET : -EPROTO;
	if (err) {
		while (n)
			close(fds[--n]);
		return err;
	}
	*pid = (pid_t)m.pid;
	return (int)n;
}

int keeper_fetch(const char *sock, int *fds, uint32_t max, struct keeper_link *k)
{
	struct keeper_msg m = {KEEPER_MAGIC, KEEPER_GET, 0, 0};
	int fd = keeper_connect(sock), n;
	pid_t pid = 0;

	k->fd = -1;
	k->pid = 0;
	if (fd < 0)
		return fd;
	n = msg_send(fd, &m, NULL, 0);
	if (!n)
		n = msg_recv(fd, KEEPER_GET, fds, max, &pid);
	k->pid = pid;
	if (n >= 0 && pid > 0) {
		k->fd = fd; /* [owner] ours while it stays open */
		return n;
	}
	close(fd); /* an error, or a keeper of an earlier version: it has no owner */
	return n;
}

/* FREE on fd; 0, -EBUSY (*owner) or another negative errno. */
static int free_on(int fd, pid_t *owner)
{
	struct keeper_msg m = {KEEPER_MAGIC, KEEPER_FREE, 0, 0};
	int err = msg_send(fd, &m, NULL, 0);

	if (!err)
		err = msg_recv(fd, KEEPER_FREE, NULL, 0, owner);
	return err < 0 ? err : 0;
}

int keeper_free(const char *sock, pid_t *owner)
{
	int fd = keeper_connect(sock), err;

	*owner = 0;
	if (fd < 0)
		return fd;
	err = free_on(fd, owner);
	close(fd);
	return err;
}

int keeper_release(struct keeper_link *k, int free_pool)
{
	pid_t none;
	int err = 0;

	if (k->fd < 0)
		return -ENOENT;
	if (free_pool)
		err = free_on(k->fd, &none);
	close(k->fd);
	k->fd = -1;
	k->pid = 0;
	return err;
}

int keeper_rec_add(struct keeper_link *k, uint64_t tag, uint32_t part, const int *fds, uint32_t n)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * KEEPER_REC_FDS)];
		struct cmsghdr align;
	} cm;
	struct keeper_rec r = {KEEPER_MAGIC, KEEPER_ADD, n, part, tag};
	struct iovec iov = {&r, sizeof(r)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

	if (k->fd < 0)
		return -ENOENT;
	if (n > KEEPER_REC_FDS)
		return -EINVAL;
	if (n)
		kvb_msg_attach_fds(&mh, cm.b, fds, n);
	/* Never waits: the loop thread calls it; a keeper that lags costs this record only. */
	return sendmsg(k->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof(r) ? 0 : -errno;
}

int keeper_rec_del(struct keeper_link *k, uint64_t tag)
{
	struct keeper_rec r = {KEEPER_MAGIC, KEEPER_DEL, 0, 0, tag};

	if (k->fd < 0)
		return -ENOENT;
	return send(k->fd, &r, sizeof(r), MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)sizeof(r)
		       ? 0
		       : -errno;
}

int keeper_swap(struct keeper_link *k, uint32_t i, int fd)
{
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} cm;
	struct keeper_rec r = {KEEPER_MAGIC, KEEPER_SWAP, 1, 0, i};
	struct iovec iov = {&r, sizeof(r)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	int got_fds[KEEPER_REC_FDS];
	uint32_t n;
	ssize_t got;

	if (k->fd < 0)
		return -ENOENT;
	kvb_msg_attach_fds(&mh, cm.b, &fd, 1);
	if (sendmsg(k->fd, &mh, MSG_NOSIGNAL) != (ssize_t)sizeof(r))
		return -errno;
	/* The records before it are answered nothing: the next message is its reply, or none
	 * (a keeper of an earlier version ignores the op: the receive times out). */
	got = recv_fds(k->fd, &r, sizeof(r), got_fds, KEEPER_REC_FDS, &n);
	while (got >= 0 && n)
		close(got_fds[--n]);
	if (got < 0)
		return got == -EAGAIN ? -ETIMEDOUT : (int)got;
	if (got != (ssize_t)sizeof(r) || r.magic != KEEPER_MAGIC || r.op != KEEPER_SWAP ||
	    r.tag != i)
		return got == 0 ? -ECONNRESET : -EPROTO;
	return r.part ? -EIO : 0;
}

int keeper_rec_list(struct keeper_link *k, keeper_rec_fn fn, void *arg)
{
	struct keeper_rec r = {KEEPER_MAGIC, KEEPER_LIST, 0, 0, 0};
	int fds[KEEPER_REC_FDS] = {0}, count = 0;

	if (k->fd < 0)
		return -ENOENT;
	if (send(k->fd, &r, sizeof(r), MSG_NOSIGNAL) != (ssize_t)sizeof(r))
		return -errno;
	for (;;) {
		uint32_t n;
		ssize_t got = recv_fds(k->fd, &r, sizeof(r), fds, KEEPER_REC_FDS, &n);

		if (got < 0)
			return (int)got;
		if (got != (ssize_t)sizeof(r) || r.magic != KEEPER_MAGIC ||
		    (r.op != KEEPER_REC && r.op != KEEPER_END) || r.nfds != n) {
			while (n)
				close(fds[--n]);
			return got == 0 ? -ECONNRESET : -EPROTO;
		}
		if (r.op == KEEPER_END)
			return count;
		fn(arg, r.tag, r.part, fds, n); /* the fds are its */
		count++;
	}
}

static int listen_at(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), err;
	mode_t um;

	if (fd < 0)
		return -errno;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	unlink(path); /* the caller found none answering there */
	um = umask(0177);
	err = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(um);
	if (err < 0 || listen(fd, 16) < 0) {
		err = -errno;
		close(fd);
		return err;
	}
	return fd;
}

/*
 * In the grandchild: the listening socket on 3, the owner connection on 4, the pool on 5...,
 * nothing else; exec. Only async-signal-safe calls: the broker may have other threads when it
 * replaces a keeper that died (watch.c), and argv was formatted before the fork.
 */
static void __attribute__((noreturn))
keeper_exec(int lfd, int ofd, const int *fds, uint32_t n, char *const argv[])
{
	int tmp[KEEPER_MAX_FDS + 2], devnull = open("/dev/null", O_RDWR);
	struct stat st;
	sigset_t none;

	setsid();
	signal(SIGPIPE, SIG_DFL);
	/* Above every target first, so that no dup2 below closes a source. */
	tmp[0] = fcntl(lfd, F_DUPFD, 128);
	tmp[1] = fcntl(ofd, F_DUPFD, 128);
	for (uint32_t i = 0; i < n; i++)
		tmp[i + 2] = fcntl(fds[i], F_DUPFD, 128);
	for (uint32_t i = 0; i < n + 2; i++)
		if (tmp[i] < 0 || dup2(tmp[i], KEEPER_LISTEN_FD + (int)i) < 0)
			_exit(127);
	if (devnull >= 0) {
		dup2(devnull, 0);
		dup2(devnull, 1);
		/* A pipe on stderr (a test harness, a supervisor's log reader) would wait for
		 * its EOF until the keeper exits: keep stderr only when it is a file or a tty. */
		if (fstat(2, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)))
			dup2(devnull, 2);
	}
	if (syscall(SYS_close_range, KEEPER_POOL_FD + n, ~0u, 0) < 0)
		for (int f = KEEPER_POOL_FD + (int)n; f < 4096; f++)
			close(f);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	execv("/proc/self/exe", argv);
	_exit(127);
}

int keeper_spawn(const char *sock, const int *fds, uint32_t n, struct keeper_link *k)
{
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)], nbuf[16], a0[] = "kvbrokerd",
									  a1[] = "--keeper";
	char *argv[] = {a0, a1, nbuf, path, NULL};
	int lfd, err = keeper_path(sock, path), sp[2], st;
	pid_t pid, none = 0;

	k->fd = -1;
	k->pid = 0;
	if (err)
		return err;
	if (!n || n > KEEPER_MAX_FDS)
		return -EINVAL;
	/* Never replace a keeper that answers: it holds a pool, ours or another broker's. */
	lfd = keeper_connect(sock);
	if (lfd >= 0) {
		close(lfd);
		return -EADDRINUSE;
	}
	snprintf(nbuf, sizeof(nbuf), "%u", n);
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0)
		return -errno;
	lfd = listen_at(path);
	if (lfd < 0) {
		close(sp[0]);
		close(sp[1]);
		return lfd;
	}
	pid = fork();
	if (pid == 0) {
		if (fork() == 0)
			keeper_exec(lfd, sp[1], fds, n, argv);
		_exit(0);
	}
	err = pid < 0 ? -errno : 0;
	close(lfd);
	close(sp[1]);
	if (pid > 0) {
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
		/* Ready means a keeper runs, not one about to: a crash right after must find it.
		 * Its HELLO says so; an exec that failed closes the pair instead (EOF). */
		set_timeouts(sp[0]);
		err = msg_recv(sp[0], KEEPER_HELLO, NULL, 0, &none);
		if (err >= 0 && none <= 0)
			err = -EPROTO;
	}
	if (err < 0) {
		close(sp[0]);
		unlink(path);
		return err == -EAGAIN ? -ETIMEDOUT : err;
	}
	k->fd = sp[0];
	k->pid = none;
	return 0;
}

/* ---- the keeper process ---- */

/* [records] A session's record: its tag, partition and fds, kept for the next broker. */
struct krec {
	uint64_t tag;
	uint32_t part, n;
	int fds[KEEPER_REC_FDS];
};

struct keeper {
	const int *fds;
	uint32_t n;
	struct krec *recs;
	uint32_t nrecs, cap;
	int owner;	 /* the owner's connection, -1 none */
	pid_t owner_pid; /* for BUSY replies */
	ino_t ino;	 /* the socket file we listen on */
	dev_t dev;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

/* Whether path still names the socket we listen on (same inode). */
static int still_ours(const struct keeper *kp)
{
	struct stat st;

	return stat(kp->path, &st) == 0 && st.st_ino == kp->ino && st.st_dev == kp->dev;
}

static void drop_owner(struct keeper *kp)
{
	close(kp->owner);
	kp->owner = -1;
	kp->owner_pid = 0;
}

/*
 * [owner] Whether the owner is gone, waiting up to ms for its connection to close. Requests
 * the owner sends meanwhile wait for the main loop; only its hang-up counts here.
 */
static int owner_gone(struct keeper *kp, int ms)
{
	double until = clock_now() + ms * 1e-3;

	while (kp->owner >= 0) {
		struct pollfd p = {.fd = kp->owner, .events = POLLRDHUP};
		int left = (int)((until - clock_now()) * 1e3);

		if (poll(&p, 1, left > 0 ? left : 0) > 0 &&
		    (p.revents & (POLLHUP | POLLRDHUP | POLLERR))) {
			drop_owner(kp);
			break;
		}
		if (left <= 0)
			return 0;
	}
	return 1;
}

static void rec_drop(struct keeper *kp, uint32_t i)
{
	for (uint32_t j = 0; j < kp->recs[i].n; j++)
		close(kp->recs[i].fds[j]);
	kp->recs[i] = kp->recs[--kp->nrecs];
}

/* [records] ADD, DEL or LIST from the owner. */
static void rec_serve(struct keeper *kp, const struct keeper_rec *r, int *fds, uint32_t n)
{
	struct keeper_rec out = {KEEPER_MAGIC, KEEPER_REC, 0, 0, 0};

	if (r->op == KEEPER_ADD) {
		if (kp->nrecs == kp->cap) {
			uint32_t cap = kp->cap ? 2 * kp->cap : 64;
			struct krec *nr = realloc(kp->recs, cap * sizeof(*nr));

			if (!nr)
				goto drop; /* that session's leases are not kept: fail safe */
			kp->recs = nr;
			kp->cap = cap;
		}
		kp->recs[kp->nrecs] = (struct krec){.tag = r->tag, .part = r->part, .n = n};
		memcpy(kp->recs[kp->nrecs++].fds, fds, n * sizeof(*fds));
		return;
	}
	if (r->op == KEEPER_SWAP) {
		/* Answered, so that the broker binds the partition again only once we hold the
		 * new file: a crash before that must find the one the side table describes. */
		out.op = KEEPER_SWAP;
		out.tag = r->tag;
		out.part = r->tag < kp->n && n == 1 && dup3(fds[0], kp->fds[r->tag], O_CLOEXEC) >= 0
				   ? 0
				   : 1;
		(void)send(kp->owner, &out, sizeof(out), MSG_NOSIGNAL);
		goto drop; /* ours is the dup3's copy */
	}
	if (r->op == KEEPER_DEL) {
		for (uint32_t i = 0; i < kp->nrecs; i++)
			if (kp->recs[i].tag == r->tag)
				rec_drop(kp, i--);
	} else if (r->op == KEEPER_LIST) {
		for (uint32_t i = 0; i < kp->nrecs; i++) {
			union {
				char b[CMSG_SPACE(sizeof(int) * KEEPER_REC_FDS)];
				struct cmsghdr align;
			} cm;
			struct iovec iov = {&out, sizeof(out)};
			struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

			out.nfds = kp->recs[i].n;
			out.part = kp->recs[i].part;
			out.tag = kp->recs[i].tag;
			if (out.nfds)
				kvb_msg_attach_fds(&mh, cm.b, kp->recs[i].fds, out.nfds);
			(void)sendmsg(kp->owner, &mh, MSG_NOSIGNAL);
		}
		out = (struct keeper_rec){KEEPER_MAGIC, KEEPER_END, 0, 0, 0};
		(void)send(kp->owner, &out, sizeof(out), MSG_NOSIGNAL);
	}
drop:
	while (n)
		close(fds[--n]);
}

/*
 * One request on c (a new connection, or the owner's). Returns 1 when told to exit, 0 when done
 * with c (the caller closes it unless it became the owner), -1 when c is closed or broken.
 */
static int keeper_serve(struct keeper *kp, int c)
{
	union {
		struct keeper_msg m;
		struct keeper_rec r;
	} u = {0};
	struct keeper_msg r = {KEEPER_MAGIC, 0, 0, 0};
	int fds[KEEPER_REC_FDS], is_owner = c == kp->owner;
	uint32_t n;
	ssize_t got = recv_fds(c, &u, sizeof(u), fds, KEEPER_REC_FDS, &n);

	if (got == 0 || (got < 0 && got != -EPROTO))
		return -1;
	if (got == (ssize_t)sizeof(u.r) && u.r.magic == KEEPER_MAGIC && is_owner && u.r.nfds == n) {
		rec_serve(kp, &u.r, fds, n);
		return 0;
	}
	while (n)
		close(fds[--n]); /* fds come only with records, and only from the owner */
	if (got != (ssize_t)sizeof(u.m) || u.m.magic != KEEPER_MAGIC ||
	    (u.m.op != KEEPER_GET && u.m.op != KEEPER_FREE)) {
		msg_send(c, &r, NULL, 0);
		return 0;
	}
	if (!is_owner && !owner_gone(kp, KEEPER_OWNER_GRACE_MS)) {
		r.op = KEEPER_BUSY;
		r.pid = (uint32_t)kp->owner_pid;
		msg_send(c, &r, NULL, 0);
		return 0;
	}
	if (u.m.op == KEEPER_FREE) {
		r.op = KEEPER_FREE;
		msg_send(c, &r, NULL, 0);
		return 1;
	}
	r.op = KEEPER_GET;
	r.nfds = kp->n;
	r.pid = (uint32_t)getpid();
	if (msg_send(c, &r, kp->fds, kp->n) == 0 && !is_owner) {
		struct ucred cr;
		socklen_t cl = sizeof(cr);

		kp->owner = c;
		kp->owner_pid = getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0 ? cr.pid : 0;
	}
	return 0;
}

/* A new connection: only our uid or root is answered. */
static int keeper_accept(struct keeper *kp)
{
	struct ucred cr;
	socklen_t cl = sizeof(cr);
	int c = accept4(KEEPER_LISTEN_FD, NULL, NULL, SOCK_CLOEXEC), r;

	if (c < 0)
		return 0;
	set_timeouts(c);
	if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0 ||
	    (cr.uid != getuid() && cr.uid != 0)) {
		fprintf(stderr, "kvbrokerd keeper: refused a peer of uid %u\n", (unsigned)cr.uid);
		close(c);
		return 0;
	}
	r = keeper_serve(kp, c);
	if (c != kp->owner)
		close(c);
	return r == 1;
}

/* [owner] Our socket file went while a broker owns the pool: bind it again where we can. */
static void relisten(struct keeper *kp)
{
	struct stat st;
	int fd;

	if (stat(kp->path, &st) == 0)
		return; /* someone else's file: not ours to remove */
	fd = listen_at(kp->path);
	if (fd < 0)
		return; /* no directory yet: the broker makes it again, we try next second */
	if (dup3(fd, KEEPER_LISTEN_FD, O_CLOEXEC) >= 0 && stat(kp->path, &st) == 0) {
		kp->ino = st.st_ino;
		kp->dev = st.st_dev;
	}
	close(fd);
}

int keeper_main(int nfds)
{
	static struct keeper kp;
	int fds[KEEPER_MAX_FDS];
	struct sockaddr_un sa;
	socklen_t sl = sizeof(sa);
	struct stat st;
	struct keeper_msg hello = {KEEPER_MAGIC, KEEPER_HELLO, 0, (uint32_t)getpid()};

	struct rlimit rl;

	prctl(PR_SET_DUMPABLE, 0);
	prctl(PR_SET_NAME, "kvb-keeper");
	/* [records] Three fds for each client of the broker: as many as the hard limit allows. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	signal(SIGPIPE, SIG_IGN);
	signal(SIGINT, SIG_IGN);
	signal(SIGHUP, SIG_IGN);
	signal(SIGUSR2, SIG_IGN); /* "systemctl kill -s SIGUSR2" without --kill-who=main */
	if (nfds <= 0 || nfds > (int)KEEPER_MAX_FDS ||
	    getsockname(KEEPER_LISTEN_FD, (struct sockaddr *)&sa, &sl) ||
	    sa.sun_family != AF_UNIX || stat(sa.sun_path, &st) < 0)
		return 2;
	for (int i = 0; i < nfds; i++) {
		fds[i] = KEEPER_POOL_FD + i;
		fcntl(fds[i], F_SETFD, FD_CLOEXEC);
	}
	fcntl(KEEPER_LISTEN_FD, F_SETFD, FD_CLOEXEC);
	fcntl(KEEPER_OWNER_FD, F_SETFD, FD_CLOEXEC);
	kp = (struct keeper){.fds = fds,
			     .n = (uint32_t)nfds,
			     .owner = KEEPER_OWNER_FD,
			     .ino = st.st_ino,
			     .dev = st.st_dev};
	snprintf(kp.path, sizeof(kp.path), "%s", sa.sun_path);
	{
		struct ucred cr;
		socklen_t cl = sizeof(cr);

		if (getsockopt(kp.owner, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0)
			kp.owner_pid = cr.pid;
	}
	set_timeouts(kp.owner);
	if (msg_send(kp.owner, &hello, NULL, 0) < 0)
		drop_owner(&kp); /* the broker that spawned us is gone already */
	for (;;) {
		struct pollfd p[2] = {{.fd = KEEPER_LISTEN_FD, .events = POLLIN},
				      {.fd = kp.owner, .events = POLLIN}};
		int ready = poll(p, kp.owner >= 0 ? 2 : 1, 1000) > 0, r;

		if (ready && kp.owner >= 0 && p[1].revents) {
			r = keeper_serve(&kp, kp.owner);
			if (r == 1)
				break;
			if (r < 0)
				drop_owner(&kp); /* the broker died: the pool waits for the next */
		}
		if (!still_ours(&kp)) {
			if (kp.owner < 0)
				break; /* the socket file is gone: nobody can ask for the pool again */
			relisten(&kp);
		}
		if (ready && (p[0].revents & POLLIN) && keeper_accept(&kp))
			break;
	}
	if (still_ours(&kp))
		unlink(kp.path);
	return 0; /* exit closes the fds: the pool goes with the last broker's mapping */
}
