// SPDX-License-Identifier: MIT
/*
 * peer.c - the process behind a connection: a pidfd for the peer of an accepted socket.
 *
 * [pidfd] A session holds a pidfd of the process that connected, so that its exit ends the
 * session even when a child it forked still holds the socket, and so that a pid recycled after
 * that process died can never be taken for it. Where the kernel has SO_PEERPIDFD (6.5+) the
 * pidfd is the kernel's, atomic with the connect. Older kernels give only the SO_PEERCRED pid,
 * which may name a stranger by the time we accept (the peer died, its pid was reused, and a
 * child of the peer holds the socket). There the pid's pidfd is kept only when that process
 * demonstrably holds the other end of this very socket: sock_diag names the peer socket's inode
 * (UNIX_DIAG_PEER) and /proc/<pid>/fd must contain it. When that cannot be checked (no
 * sock_diag, another uid's /proc), a socket already hung up gets no pidfd and anything else gets
 * the pid's; t_rel_peer checks both paths (the fallback through KVB_TEST_NO_PEERPIDFD in the
 * sanitizer builds, which define KVB_TEST_HOOKS).
 *
 * Loop thread only; called once per accepted connection.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "broker.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

/* The inode of the peer of unix socket fd, through sock_diag; 0 when it cannot be had. */
static uint32_t unix_peer_ino(int fd)
{
	struct {
		struct nlmsghdr nlh;
		struct unix_diag_req req;
	} msg;
	union {
		char b[4096];
		struct nlmsghdr align;
	} rep;
	struct stat st;
	uint32_t peer = 0;
	ssize_t n;
	int nl;

	if (fstat(fd, &st) < 0)
		return 0;
	nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (nl < 0)
		return 0;
	memset(&msg, 0, sizeof(msg));
	msg.nlh.nlmsg_len = sizeof(msg);
	msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	msg.nlh.nlmsg_flags = NLM_F_REQUEST;
	msg.req.sdiag_family = AF_UNIX;
	msg.req.udiag_states = ~0u;
	msg.req.udiag_ino = (uint32_t)st.st_ino;
	msg.req.udiag_show = UDIAG_SHOW_PEER;
	msg.req.udiag_cookie[0] = msg.req.udiag_cookie[1] = INET_DIAG_NOCOOKIE;
	if (send(nl, &msg, sizeof(msg), 0) != (ssize_t)sizeof(msg))
		goto out;
	n = recv(nl, &rep, sizeof(rep), 0);
	for (struct nlmsghdr *h = &rep.align; n > 0 && NLMSG_OK(h, (size_t)n);
	     h = NLMSG_NEXT(h, n)) {
		struct unix_diag_msg *m = NLMSG_DATA(h);
		struct rtattr *a = (struct rtattr *)(m + 1);
		int len = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*m)));

		if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || m->udiag_ino != (uint32_t)st.st_ino)
			break;
		for (; RTA_OK(a, len); a = RTA_NEXT(a, len))
			if (a->rta_type == UNIX_DIAG_PEER &&
			    RTA_PAYLOAD(a) >= (int)sizeof(uint32_t))
				memcpy(&peer, RTA_DATA(a), sizeof(peer));
		break;
	}
out:
	close(nl);
	return peer;
}

/* Does process pid hold socket inode ino? 1 yes, 0 no, -1 cannot tell. */
static int pid_holds(pid_t pid, uint32_t ino)
{
	char dir[64], p[384], t[64], want[40];
	struct dirent *e;
	DIR *d;
	int found = 0;

	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	snprintf(want, sizeof(want), "socket:[%u]", ino);
	d = opendir(dir);
	if (!d)
		return errno == ENOENT ? 0 : -1;
	while (!found && (e = readdir(d))) {
		ssize_t k;

		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		k = readlink(p, t, sizeof(t) - 1);
		if (k <= 0)
			continue;
		t[k] = 0;
		found = !strcmp(t, want);
	}
	closedir(d);
	return found;
}

static int no_peerpidfd(void)
{
#ifdef KVB_TEST_HOOKS
	const char *e = getenv("KVB_TEST_NO_PEERPIDFD");

	return e && *e == '1';
#else
	return 0;
#endif
}

int peer_pidfd(int fd, pid_t pid, const char **how)
{
	struct pollfd p = {.fd = fd, .events = POLLRDHUP};
	socklen_t len = sizeof(int);
	uint32_t peer;
	int pfd = -1, holds = -1;

	*how = "SO_PEERPIDFD";
	if (!no_peerpidfd()) {
		if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pfd, &len) == 0 && pfd >= 0) {
			if (fcntl(pfd, F_SETFD, FD_CLOEXEC) == 0)
				return pfd;
			close(pfd);
			return -1;
		}
		/* The kernel knows the option but not the peer (ESRCH: it is gone). */
		if (errno != ENOPROTOOPT && errno != EINVAL && errno != EOPNOTSUPP)
			return -1;
	}
	*how = "pidfd_open";
	if (pid <= 0)
		return -1;
	pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pfd < 0)
		return -1;
	fcntl(pfd, F_SETFD, FD_CLOEXEC);
	/* After pidfd_open: a process that holds the socket now is the one we keep. */
	peer = unix_peer_ino(fd);
	if (peer)
		holds = pid_holds(pid, peer);
	if (holds == 0 ||
	    (holds < 0 && poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP)))) {
		close(pfd);
		return -1;
	}
	*how = holds > 0 ? "pidfd_open, holds the socket" : "pidfd_open, unverified";
	return pfd;
}
