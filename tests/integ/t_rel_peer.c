// SPDX-License-Identifier: MIT
/*
 * t_rel_peer.c - promise 1 (docs/reliability.md): who connects.
 *
 * The broker runs as root with --group G and its socket in a directory it creates. Clients are
 * this test binary re-executed under setpriv (or, where setpriv cannot run it, a forked child
 * making the same setgroups/setresgid/setresuid calls) as a foreign uid:
 *   - a foreign uid outside G cannot even reach the socket (the directory is 0750, group G);
 *   - a member of G (supplementary, or primary) attaches and stores and reads pages;
 *   - with the filesystem opened up by mistake (directory 0755, socket 0666), the foreign uid
 *     reaches the socket but the broker refuses it on SO_PEERCRED before sending anything: its
 *     HELLO gets no reply and no fd, the broker logs the refusal and counts it;
 *   - a client name cannot forge broker log lines (control bytes become '?'): the log is what
 *     operators and these tests read to learn who was disconnected and why;
 *   - [pidfd] a client whose process exits while a child it forked still holds the socket is
 *     still seen as dead: its leases are released within 100 ms (the pidfd, not the socket,
 *     tells the broker). Without the pidfd they stayed until the child exited.
 *   - [pidfd] a recycled pid cannot pose as a dead client: with the broker stopped, a process
 *     connects, hands the socket to a child and exits; its pid is given to a stranger (through
 *     ns_last_pid); then the broker accepts. SO_PEERCRED now names the stranger's pid, but the
 *     session must not be tied to the stranger: it either ends at once (its connecting process
 *     is dead) or lives on after the stranger is killed. (Looking the pid up with pidfd_open
 *     would have tied it to the stranger.)
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "reliab.h"

#define FOREIGN_UID 4242

/* ---- client modes (run as the foreign uid) ---- */

static int client_ring(const char *sock)
{
	struct kvb_opts o = {.socket_path = sock, .name = "foreign"};
	struct kvb_layout l;
	kvb_client *c = NULL;
	uint8_t page[4096], back[4096];
	kvb_key k = harness_key(77, getuid());
	uint32_t ns;
	size_t pb;
	int rc = kvb_connect(&o, &c);

	if (rc)
		return -rc > 120 ? 120 : -rc;
	harness_layout(&l, "peer", KVB_LAYOUT_MLA, 16, 1, 0, 1, 256);
	if (kvb_ns_open(c, &l, &ns, &pb) || pb != sizeof(page))
		return 121;
	harness_fill(page, sizeof(page), &k, 77);
	if (kvb_put(c, ns, k, page, sizeof(page)) < 0 ||
	    kvb_get(c, ns, k, back, sizeof(back)) != (int)sizeof(back) ||
	    memcmp(page, back, sizeof(page)))
		return 122;
	kvb_close(c);
	return 0;
}

/* Connects, sends a HELLO, and reports what came back: 0 nothing (refused), 3 fds, 4 a reply. */
static int client_raw(const char *sock)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct kvb_msg_hello hello = {.abi_major = KVB_ABI_MAJOR, .sq_entries = 8};
	uint8_t msg[sizeof(struct kvb_msg_hdr) + sizeof(hello)], buf[4096];
	struct kvb_msg_hdr h = {KVB_MSG_MAGIC, KVB_MSG_HELLO, 0, sizeof(msg), 1};
	union {
		char b[CMSG_SPACE(sizeof(int) * KVB_MAX_FDS)];
		struct cmsghdr align;
	} cm;
	struct iovec iov = {buf, sizeof(buf)};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cm.b,
			    .msg_controllen = sizeof(cm)};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	ssize_t n;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return 5;
	memcpy(msg, &h, sizeof(h));
	memcpy(msg + sizeof(h), &hello, sizeof(hello));
	send(fd, msg, sizeof(msg), MSG_NOSIGNAL);
	n = recvmsg(fd, &mh, 0);
	if (n < 0)
		return 0; /* ECONNRESET: refused */
	if (mh.msg_controllen && CMSG_FIRSTHDR(&mh))
		return 3;
	return n > 0 ? 4 : 0;
}

static int client_main(const char *mode, const char *sock)
{
	alarm(20);
	return !strcmp(mode, "raw") ? client_raw(sock) : client_ring(sock);
}

/* ---- the test ---- */

static char self[4096];
static char dir[128], rundir[160], sockp[200];

/* Also when a check fails. */
static void remove_dirs(void)
{
	unlink(sockp);
	rmdir(rundir);
	rmdir(dir);
}

/* Runs "self --client MODE SOCK" as uid/gid with the given supplementary group (or none). */
static int run_as(uid_t uid, gid_t gid, int group, const char *mode, const char *sock)
{
	char ru[32], rg[32], gr[48];
	int st;
	pid_t pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		snprintf(ru, sizeof(ru), "--reuid=%u", (unsigned)uid);
		snprintf(rg, sizeof(rg), "--regid=%u", (unsigned)gid);
		snprintf(gr, sizeof(gr), "--groups=%d", group);
		execlp("setpriv", "setpriv", ru, rg, group >= 0 ? gr : "--clear-groups", self,
		       "--client", mode, sock, (char *)NULL);
		/* No setpriv: the same calls it makes. */
		if (group >= 0) {
			gid_t g = (gid_t)group;

			if (setgroups(1, &g) < 0)
				_exit(126);
		} else if (setgroups(0, NULL) < 0) {
			_exit(126);
		}
		if (setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0)
			_exit(126);
		_exit(client_main(mode, sock));
	}
	CHECK_EQ(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* [pidfd] A client that forks a sleeper holding its socket, then exits. */
static int forker(int idx, void *arg)
{
	const char *sock = arg;
	struct kvb_opts o = {.socket_path = sock, .name = "forker"};
	struct kvb_layout l;
	struct kvb_lease lease;
	kvb_client *c = NULL;
	uint8_t page[4096];
	kvb_key k = harness_key(78, 1);
	uint32_t ns;

	(void)idx;
	CHECK_OK(kvb_connect(&o, &c));
	harness_layout(&l, "peer", KVB_LAYOUT_MLA, 16, 1, 0, 1, 256);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	harness_fill(page, sizeof(page), &k, 78);
	CHECK(kvb_put(c, ns, k, page, sizeof(page)) >= 0);
	CHECK_OK(kvb_acquire(c, ns, k, &lease));
	CHECK_OK(kvb_acquire(c, ns, k, &lease));
	if (fork() == 0) {
		/* The heir: holds the socket (inherited) and never uses it. */
		alarm(15);
		for (;;)
			pause();
	}
	return 0;
}

/* [pidfd] recycled pid: C connects, leaves the socket to its child D, exits. */
struct recycle {
	int go[2];     /* parent -> D: send your HELLO */
	int result[2]; /* D -> parent: 'r' got a reply with fds, 'h' hung up */
	pid_t heir;
};

static struct recycle *rc_sh;

static int connect_and_leave(int idx, void *arg)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	pid_t d;

	(void)idx;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", (const char *)arg);
	CHECK_OK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)));
	d = fork();
	CHECK(d >= 0);
	if (d == 0) {
		struct kvb_msg_hello hello = {
			.abi_major = KVB_ABI_MAJOR, .sq_entries = 8, .name = "heir"};
		struct kvb_msg_hdr h = {KVB_MSG_MAGIC, KVB_MSG_HELLO, 0, sizeof(h) + sizeof(hello),
					1};
		uint8_t msg[sizeof(h) + sizeof(hello)], buf[4096];
		union {
			char b[CMSG_SPACE(sizeof(int) * KVB_MAX_FDS)];
			struct cmsghdr align;
		} cm;
		struct iovec iov = {buf, sizeof(buf)};
		struct msghdr mh = {.msg_iov = &iov,
				    .msg_iovlen = 1,
				    .msg_control = cm.b,
				    .msg_controllen = sizeof(cm)};
		char x, r;
		ssize_t n;

		alarm(30);
		if (read(rc_sh->go[0], &x, 1) != 1)
			_exit(1);
		memcpy(msg, &h, sizeof(h));
		memcpy(msg + sizeof(h), &hello, sizeof(hello));
		send(fd, msg, sizeof(msg), MSG_NOSIGNAL);
		n = recvmsg(fd, &mh, 0);
		r = n > 0 && mh.msg_controllen ? 'r' : 'h';
		if (write(rc_sh->result[1], &r, 1) != 1)
			_exit(1);
		for (;;)
			pause();
	}
	rc_sh->heir = d;
	_exit(0);
}

/* Forks a sleeper with exactly this pid (ns_last_pid); 0 when the pid could not be had. */
static pid_t take_pid(pid_t want)
{
	for (int tries = 0; tries < 200; tries++) {
		FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "we");
		pid_t s;

		if (!f)
			return 0;
		fprintf(f, "%d", (int)want - 1);
		if (fclose(f) != 0)
			return 0;
		s = fork();
		if (s == 0) {
			alarm(30);
			for (;;)
				pause();
		}
		if (s == want)
			return s;
		if (s > 0) {
			kill(s, SIGKILL);
			waitpid(s, NULL, 0);
		}
	}
	return 0;
}

static int heir_alive(kvb_client *c)
{
	char *js = harness_stats(c);
	int has = harness_stat_has(js, "client_list[name=heir]");

	free(js);
	return has;
}

static void recycled_pid(struct harness_broker *b, kvb_client *c, const char *path)
{
	int before, after;
	struct pollfd p;
	pid_t cpid, stranger;
	char r = 0;

	rc_sh = harness_shared(sizeof(*rc_sh));
	CHECK_OK(pipe(rc_sh->go));
	CHECK_OK(pipe(rc_sh->result));
	CHECK_OK(kill(b->pid, SIGSTOP));
	cpid = harness_fork(connect_and_leave, 0, b->sock);
	CHECK_EQ(harness_wait(&cpid, 1, 10000, NULL), 0);
	stranger = take_pid(cpid);
	CHECK_OK(kill(b->pid, SIGCONT));
	if (!stranger) {
		harness_log("[pidfd] could not recycle pid %d (ns_last_pid): part skipped", cpid);
		kill(rc_sh->heir, SIGKILL);
		return;
	}
	CHECK_EQ(write(rc_sh->go[1], "g", 1), 1);
	p = (struct pollfd){.fd = rc_sh->result[0], .events = POLLIN};
	CHECK_EQ(poll(&p, 1, 10000), 1);
	CHECK_EQ(read(rc_sh->result[0], &r, 1), 1);
	/*
	 * The session may attach and then end as soon as the broker sees its connecting process is
	 * dead (the pidfd SO_PEERPIDFD gives for it is already readable), or attach and live on
	 * the socket alone. What it must never do is live while the stranger does and die with it.
	 */
	rel_sleep_ms(200);
	before = heir_alive(c);
	kill(stranger, SIGKILL);
	waitpid(stranger, NULL, 0);
	rel_sleep_ms(300);
	after = heir_alive(c);
	CHECKF(!before || after,
	       "the session died with the stranger that got its connecting pid %d", cpid);
	rel_figure(
		"%s: pid %d recycled to a stranger before accept: %s; never tied to the stranger",
		path, cpid,
		before	   ? "the session attached and outlived the stranger"
		: r == 'r' ? "the session attached, then ended at once (its connecting process is "
			     "dead)"
			   : "the session ended at once (its connecting process is dead)");
	kill(rc_sh->heir, SIGKILL);
	CHECK_EQ(harness_stat_wait(c, "clients", 1, 2000), 1);
}

static void pidfd_checks(struct harness_broker *b, kvb_client *c, const char *path)
{
	pid_t p;
	uint64_t t0;
	int rc;

	harness_log("[pidfd] %s: the client exits, a child it forked keeps the socket", path);
	p = harness_fork(forker, 0, b->sock);
	CHECK_EQ(harness_wait(&p, 1, 10000, NULL), 0);
	t0 = harness_now_ms();
	CHECKF(harness_stat_wait(c, "leases", 0, 2000) == 0,
	       "the exited client's leases are still held (its heir keeps the socket)");
	rc = (int)(harness_now_ms() - t0);
	rel_figure("%s: client exited while its forked child holds the socket: leases released "
		   "%d ms after its exit was reaped (limit 100)",
		   path, rc);
	CHECKF(rc <= 100 || rel_scale() == REL_SMALL, "leases released after %d ms", rc);
	CHECK(harness_broker_log_has(b, "process exited"));
	CHECK_EQ(harness_stat_wait(c, "clients", 1, 2000), 1);

	harness_log("[pidfd] %s: a recycled pid", path);
	recycled_pid(b, c, path);
}

int main(int argc, char **argv)
{
	struct harness_broker *b, *b2;
	struct group *g = getgrnam("users");
	kvb_client *c, *c2;
	gid_t G;
	int rc;
	uint64_t refused;

	if (argc == 4 && !strcmp(argv[1], "--client"))
		return client_main(argv[2], argv[3]);
	harness_init(argc, argv);
	if (geteuid() != 0)
		harness_skip("needs root to run clients as another uid");
	if (!g)
		g = getgrnam("nogroup");
	if (!g)
		harness_skip("no group 'users' or 'nogroup' to admit");
	G = g->gr_gid;
	CHECK(readlink("/proc/self/exe", self, sizeof(self) - 1) > 0);

	/* A directory the foreign uid may traverse, holding the broker's own socket directory. */
	snprintf(dir, sizeof(dir), "/tmp/kvbt-peer-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	atexit(remove_dirs);
	CHECK_OK(chmod(dir, 0711));
	snprintf(rundir, sizeof(rundir), "%s/run", dir);
	snprintf(sockp, sizeof(sockp), "%s/sock", rundir);
	b = harness_broker_start("--pool", "64M", "--group", g->gr_name, "--socket", sockp);
	{
		struct stat st;

		CHECK_OK(stat(rundir, &st));
		CHECKF((st.st_mode & 07777) == 0750 && st.st_gid == G,
		       "socket directory mode %o group %u, want 0750 group %u", st.st_mode & 07777,
		       (unsigned)st.st_gid, (unsigned)G);
		CHECK_OK(stat(sockp, &st));
		CHECKF((st.st_mode & 0777) == 0660 && st.st_gid == G, "socket mode %o group %u",
		       st.st_mode & 0777, (unsigned)st.st_gid);
	}
	c = harness_connect(b, "root", 0);

	harness_log("a foreign uid outside the group");
	rc = run_as(FOREIGN_UID, FOREIGN_UID, -1, "ring", sockp);
	CHECKF(rc == EACCES, "foreign uid: exit %d, want %d (EACCES at connect)", rc, EACCES);
	harness_log("a member of the group (supplementary, then primary)");
	rc = run_as(FOREIGN_UID, FOREIGN_UID, (int)G, "ring", sockp);
	CHECKF(rc == 0, "group member: exit %d, want 0", rc);
	rc = run_as(FOREIGN_UID + 1, G, -1, "ring", sockp);
	CHECKF(rc == 0, "primary group member: exit %d, want 0", rc);

	harness_log("the filesystem opened up by mistake: SO_PEERCRED still refuses");
	refused = harness_stat(c, "counters.refused");
	CHECK_OK(chmod(rundir, 0755));
	CHECK_OK(chmod(sockp, 0666));
	rc = run_as(FOREIGN_UID, FOREIGN_UID, -1, "raw", sockp);
	CHECKF(rc == 0,
	       "foreign uid with an open socket: exit %d (3: got fds, 4: got a reply, "
	       "5: could not connect)",
	       rc);
	rc = run_as(FOREIGN_UID, FOREIGN_UID, -1, "ring", sockp);
	CHECKF(rc == ECONNRESET, "foreign uid, libkvbroker: exit %d, want ECONNRESET", rc);
	CHECK_EQ(harness_stat(c, "counters.refused"), refused + 2);
	CHECKF(harness_broker_log_has(b, "uid 4242: not the broker's uid or group"),
	       "no refusal in the broker's log");
	CHECK_OK(chmod(rundir, 0750));
	CHECK_OK(chmod(sockp, 0660));
	rel_figure("foreign uid: EACCES at connect; with the socket opened up: refused on "
		   "SO_PEERCRED, no reply, 0 fds; group members attach");

	harness_log("a client name with a newline");
	{
		struct kvb_opts o = {.socket_path = sockp, .name = "x\nclient 1 (FORGED"};
		kvb_client *x = NULL;

		CHECK_OK(kvb_connect(&o, &x));
		kvb_close(x);
		CHECK_EQ(harness_stat_wait(c, "clients", 1, 2000), 1);
		CHECKF(harness_broker_log_has(b, "'x?client 1 (FORGED'"),
		       "the client's name was not made printable in the log");
	}

	pidfd_checks(b, c, "SO_PEERPIDFD");
	/*
	 * The same through the fallback of kernels without SO_PEERPIDFD (pidfd_open of the pid,
	 * kept only when that process holds the socket): forced by KVB_TEST_NO_PEERPIDFD in the
	 * builds with test hooks (make asan, make tsan); the release build ignores it.
	 */
	setenv("KVB_TEST_NO_PEERPIDFD", "1", 1);
	b2 = harness_broker_start("--pool", "32M");
	unsetenv("KVB_TEST_NO_PEERPIDFD");
	c2 = harness_connect(b2, "root", 0);
	pidfd_checks(b2, c2, "fallback (when built with test hooks)");
	kvb_close(c2);
	harness_broker_stop(b2);

	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
