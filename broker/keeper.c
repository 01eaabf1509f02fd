// SPDX-License-Identifier: MIT
/*
 * keeper.c - the pool keeper, which lets a RAM pool outlive a broker that dies.
 *
 * A pool's arenas are memfds: they have no name, and the memory goes with the last fd or
 * mapping. The keeper is a process that holds one more fd of each (and of the side table,
 * pagehdr.c), does nothing else, and gives them to the next broker on the same socket, which
 * adopts the pool (adopt.c). It is kvbrokerd itself, exec'd as "kvbrokerd --keeper N" from a
 * double fork (its own session, not the broker's child, so a SIGKILL of the broker or of its
 * process group leaves it alone), with its listening socket on fd 3 and the pool on fds 4...
 * It maps nothing: its cost is a few fds and a page of memory.
 *
 * Protocol, on "<socket>.keep" (SOCK_SEQPACKET, mode 0600 in the socket's directory): the
 * client sends struct keeper_msg {KEEPER_MAGIC, op}; GET is answered with {KEEPER_MAGIC, GET,
 * n} and the n fds (SCM_RIGHTS), FREE with {KEEPER_MAGIC, FREE, 0}, after which the keeper
 * closes everything and exits. Anything else is answered with op 0 and ignored.
 *
 * Security: the fds it holds are read-write (pool.c [keep]), so the keeper must hand them only
 * to a broker: it answers a peer only when SO_PEERCRED says the peer is its own uid or root
 * (the same trust the broker's fds have: a process of the broker's uid could ptrace a dumpable
 * broker), it is not dumpable (no /proc/<pid>/fd reopen, no ptrace, by its own uid either), and
 * the socket file is 0600 in a directory the broker created 0750.
 *
 * Lifetime: it exits on FREE (a clean broker exit, kvbrokerd --free-pool), when its socket file
 * disappears or is replaced (checked every second: a removed directory, an operator's rm), and
 * on SIGTERM. Nothing else ends it, by design: after a crash it waits for the next broker.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "keeper.h"
#include "log.h"
#include "proto.h"

#define KEEPER_MAGIC 0x4b50564bu /* "KVPK" */
#define KEEPER_GET 1u
#define KEEPER_FREE 2u
#define KEEPER_TIMEOUT_S 5

struct keeper_msg {
	uint32_t magic;
	uint32_t op;
	uint32_t nfds;
	uint32_t resv;
};

int keeper_path(const char *sock, char *out)
{
	if (snprintf(out, sizeof(((struct sockaddr_un *)0)->sun_path), "%s.keep", sock) >=
	    (int)sizeof(((struct sockaddr_un *)0)->sun_path))
		return -ENAMETOOLONG;
	return 0;
}

/* A connected socket to the keeper of sock, or -ENOENT when none answers. */
static int keeper_connect(const char *sock)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = KEEPER_TIMEOUT_S};
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
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
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

/* Receives a reply of op; its fds (at most max) into fds. Returns the fd count or -errno. */
static int msg_recv(int fd, uint32_t op, int *fds, uint32_t max)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * KEEPER_MAX_FDS)];
		struct cmsghdr align;
	} cm;
	struct keeper_msg m;
	struct iovec iov = {&m, sizeof(m)};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cm.b,
			    .msg_controllen = sizeof(cm)};
	ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
	uint32_t n = 0;
	int err = 0;

	if (r < 0)
		return -errno;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
			int f;

			memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(f));
			if (n < max)
				fds[n++] = f;
			else
				close(f), err = -EPROTO;
		}
	}
	if (!err && (r != (ssize_t)sizeof(m) || m.magic != KEEPER_MAGIC || m.op != op ||
		     m.nfds != n || (mh.msg_flags & MSG_CTRUNC)))
		err = r == 0 ? -ECONNRESET : -EPROTO;
	if (err) {
		while (n)
			close(fds[--n]);
		return err;
	}
	return (int)n;
}

int keeper_fetch(const char *sock, int *fds, uint32_t max)
{
	struct keeper_msg m = {KEEPER_MAGIC, KEEPER_GET, 0, 0};
	int fd = keeper_connect(sock), n;

	if (fd < 0)
		return fd;
	n = msg_send(fd, &m, NULL, 0);
	if (!n)
		n = msg_recv(fd, KEEPER_GET, fds, max);
	close(fd);
	return n;
}

int keeper_free(const char *sock)
{
	struct keeper_msg m = {KEEPER_MAGIC, KEEPER_FREE, 0, 0};
	int fd = keeper_connect(sock), err;

	if (fd < 0)
		return fd;
	err = msg_send(fd, &m, NULL, 0);
	if (!err)
		err = msg_recv(fd, KEEPER_FREE, NULL, 0);
	close(fd);
	return err < 0 ? err : 0;
}

static int listen_at(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), err;
	mode_t um;

	if (fd < 0)
		return -errno;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	unlink(path); /* keeper_fetch found none answering there */
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
 * In the grandchild: the listening socket on 3, the pool on 4..., nothing else; exec. The
 * write end of keeper_spawn's pipe rides along above them, close-on-exec, so that its EOF
 * tells the broker that the keeper runs (or one byte, that it could not be started).
 */
static void __attribute__((noreturn))
keeper_exec(int lfd, const int *fds, uint32_t n, char *path, int wfd)
{
	int tmp[KEEPER_MAX_FDS + 1], devnull = open("/dev/null", O_RDWR), wout = 4 + (int)n;
	char fail = 1;
	char nbuf[16], a0[] = "kvbrokerd", a1[] = "--keeper", *argv[] = {a0, a1, nbuf, path, NULL};
	struct stat st;

	setsid();
	signal(SIGPIPE, SIG_DFL);
	/* Above every target first, so that no dup2 below closes a source. */
	tmp[0] = fcntl(lfd, F_DUPFD, 128);
	for (uint32_t i = 0; i < n; i++)
		tmp[i + 1] = fcntl(fds[i], F_DUPFD, 128);
	wfd = fcntl(wfd, F_DUPFD_CLOEXEC, 128);
	if (wfd < 0)
		_exit(127);
	for (uint32_t i = 0; i <= n; i++)
		if (tmp[i] < 0 || dup2(tmp[i], 3 + (int)i) < 0)
			goto fail;
	if (dup3(wfd, wout, O_CLOEXEC) < 0)
		goto fail;
	wfd = wout;
	if (devnull >= 0) {
		dup2(devnull, 0);
		dup2(devnull, 1);
		/* A pipe on stderr (a test harness, a supervisor's log reader) would wait for
		 * its EOF until the keeper exits: keep stderr only when it is a file or a tty. */
		if (fstat(2, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)))
			dup2(devnull, 2);
	}
	if (syscall(SYS_close_range, 5u + n, ~0u, 0) < 0)
		for (int f = 5 + (int)n; f < 4096; f++)
			close(f);
	snprintf(nbuf, sizeof(nbuf), "%u", n);
	{
		sigset_t none;

		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
	}
	execv("/proc/self/exe", argv);
fail:
	(void)!write(wfd, &fail, 1);
	_exit(127);
}

/* Waits for the EOF (the keeper exec'd) or the byte (it did not) on the pipe's read end. */
static int keeper_started(int rfd)
{
	struct pollfd p = {.fd = rfd, .events = POLLIN};
	char c;
	ssize_t r;

	while ((r = poll(&p, 1, KEEPER_TIMEOUT_S * 1000)) < 0 && errno == EINTR)
		;
	if (r == 0)
		return -ETIMEDOUT;
	while ((r = read(rfd, &c, 1)) < 0 && errno == EINTR)
		;
	return r == 0 ? 0 : -ECHILD;
}

int keeper_spawn(const char *sock, const int *fds, uint32_t n)
{
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int lfd, err = keeper_path(sock, path), st, pfd[2];
	pid_t pid;

	if (err)
		return err;
	if (!n || n > KEEPER_MAX_FDS)
		return -EINVAL;
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return -errno;
	lfd = listen_at(path);
	if (lfd < 0) {
		close(pfd[0]);
		close(pfd[1]);
		return lfd;
	}
	pid = fork();
	if (pid == 0) {
		pid_t g = fork();

		if (g == 0)
			keeper_exec(lfd, fds, n, path, pfd[1]);
		if (g < 0)
			(void)!write(pfd[1], "", 1);
		_exit(0);
	}
	err = pid < 0 ? -errno : 0;
	close(lfd);
	close(pfd[1]);
	if (pid > 0) {
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
		/* Ready means a keeper runs, not one about to: a crash right after must find it. */
		err = keeper_started(pfd[0]);
	}
	close(pfd[0]);
	if (err)
		unlink(path);
	return err;
}

/* Whether path still names the socket we listen on (same inode). */
static int still_ours(const char *path, ino_t ino, dev_t dev)
{
	struct stat st;

	return stat(path, &st) == 0 && st.st_ino == ino && st.st_dev == dev;
}

/* One connection: answers a request of our uid or root. Returns 1 when told to exit. */
static int keeper_serve(int c, const int *fds, uint32_t n)
{
	struct ucred cr;
	socklen_t cl = sizeof(cr);
	struct keeper_msg m, r = {KEEPER_MAGIC, 0, 0, 0};
	struct timeval tv = {.tv_sec = KEEPER_TIMEOUT_S};

	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0 ||
	    (cr.uid != getuid() && cr.uid != 0)) {
		fprintf(stderr, "kvbrokerd keeper: refused a peer of uid %u\n", (unsigned)cr.uid);
		return 0;
	}
	if (recv(c, &m, sizeof(m), 0) != (ssize_t)sizeof(m) || m.magic != KEEPER_MAGIC) {
		msg_send(c, &r, NULL, 0);
		return 0;
	}
	if (m.op == KEEPER_GET) {
		r.op = KEEPER_GET;
		r.nfds = n;
		msg_send(c, &r, fds, n);
		return 0;
	}
	if (m.op == KEEPER_FREE) {
		r.op = KEEPER_FREE;
		msg_send(c, &r, NULL, 0);
		return 1;
	}
	msg_send(c, &r, NULL, 0);
	return 0;
}

int keeper_main(int nfds)
{
	struct sockaddr_un sa;
	socklen_t sl = sizeof(sa);
	int fds[KEEPER_MAX_FDS];
	struct stat st;

	prctl(PR_SET_DUMPABLE, 0);
	prctl(PR_SET_NAME, "kvb-keeper");
	signal(SIGPIPE, SIG_IGN);
	signal(SIGINT, SIG_IGN);
	signal(SIGHUP, SIG_IGN);
	signal(SIGUSR2, SIG_IGN); /* "systemctl kill -s SIGUSR2" without --kill-who=main */
	if (nfds <= 0 || nfds > (int)KEEPER_MAX_FDS ||
	    getsockname(3, (struct sockaddr *)&sa, &sl) || sa.sun_family != AF_UNIX ||
	    stat(sa.sun_path, &st) < 0)
		return 2;
	for (int i = 0; i < nfds; i++) {
		fds[i] = 4 + i;
		fcntl(fds[i], F_SETFD, FD_CLOEXEC);
	}
	fcntl(3, F_SETFD, FD_CLOEXEC);
	for (;;) {
		struct pollfd p = {.fd = 3, .events = POLLIN};
		int r = poll(&p, 1, 1000), c;

		if (!still_ours(sa.sun_path, st.st_ino, st.st_dev))
			break; /* the socket file is gone: nobody can ask for the pool again */
		if (r <= 0)
			continue;
		c = accept4(3, NULL, NULL, SOCK_CLOEXEC);
		if (c < 0)
			continue;
		r = keeper_serve(c, fds, (uint32_t)nfds);
		close(c);
		if (r) {
			unlink(sa.sun_path);
			break;
		}
	}
	return 0; /* exit closes the fds: the pool goes with the last broker's mapping */
}
