// SPDX-License-Identifier: MIT
/*
 * t_messages.c - the errors users meet first name their cause and their fix:
 *   - a misspelt or abbreviated option is refused, not taken for another by its prefix
 *     ("kvbrokerd --pol 1G" was --poll-us), with the nearest valid names, in every program; a
 *     usage error is two lines (the cause, where help is), never the whole --help;
 *   - no broker: the socket tried and the command that starts one (-ENOENT, and -ECONNREFUSED
 *     for a socket file nobody listens on), from kvbctl and from kvb_connect_error();
 *   - permission refused at the socket (a uid outside the broker's --group, run through
 *     setpriv as t_rel_peer does): a broker is running there, the directory that refuses, its
 *     owner, group and mode, and how to join the group; a broker started without --group says
 *     to restart it with one;
 *   - the socket rule: --socket, else $KVB_SOCKET, else /run/kvbroker/kvbroker.sock, whatever
 *     $XDG_RUNTIME_DIR says (a broker listening at $XDG_RUNTIME_DIR/kvbroker.sock is not found
 *     without being named).
 */
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"

#define FOREIGN_UID 4242

/* Runs prog args; checks the exit status and that it printed exactly want. */
static void expect(const char *prog, const char *args, int status, const char *want)
{
	char *out;
	int rc = harness_run_tool(prog, args, &out);

	CHECKF(rc == status && !strcmp(out, want),
	       "%s %s: exit %d, printed:\n%s\nwant exit %d:\n%s", prog, args, rc, out, status,
	       want);
	free(out);
}

/* Runs prog args; checks the exit status and that the output is one line holding each of the
 * NULL-terminated strings. Returns the output (free it). */
static char *expect_line(const char *prog, const char *args, int status, const char *const *has)
{
	char *out;
	int rc = harness_run_tool(prog, args, &out);
	char *nl = strchr(out, '\n');

	CHECKF(rc == status, "%s %s: exit %d, want %d:\n%s", prog, args, rc, status, out);
	CHECKF(nl && !nl[1], "%s %s: want one line:\n%s", prog, args, out);
	for (; *has; has++)
		CHECKF(strstr(out, *has), "%s %s: no '%s' in:\n%s", prog, args, *has, out);
	return out;
}

#define HAS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Whether kvbgpucheck has its GPU checks (a build without CUDA headers only says so). */
static int gpucheck_built(void)
{
	char *out;
	int rc = harness_run_tool("kvbgpucheck", "--help", &out), built;

	built = rc == 0 && !strstr(out, "built without the CUDA headers");
	free(out);
	return built;
}

static void usage_errors(void)
{
	static const char *const typos[][3] = {
		{"kvbbench", "--thread 2 get", "unknown option --thread; did you mean --threads?"},
		{"kvbdemo", "--sock /x", "unknown option --sock; did you mean --socket?"},
		{"kvbdisk", "--pag 4096 fill", "unknown option --pag; did you mean --page?"},
		{"kvbchain", "--prompt 3", "unknown option --prompt; did you mean --prompts?"},
		{"kvbgpucheck", "probe --page 3", "unknown option --page; did you mean --pages?"},
	};
	char want[256];

	harness_log("usage errors: two lines, the nearest option named");
	expect("kvbrokerd", "--pol 1G", 2,
	       "kvbrokerd: unknown option --pol; did you mean --pool?\n"
	       "Try 'kvbrokerd --help' for more information.\n");
	expect("kvbrokerd", "--max-c 4", 2,
	       "kvbrokerd: ambiguous option --max-c; did you mean --max-clients or "
	       "--max-control?\n"
	       "Try 'kvbrokerd --help' for more information.\n");
	expect("kvbrokerd", "--pool 1X", 2,
	       "kvbrokerd: bad value '1X' for --pool: a size such as 64G (G = GiB; GB = 10^9 "
	       "bytes)\n"
	       "Try 'kvbrokerd --help' for more information.\n");
	expect("kvbrokerd", "--no-gpu=yes", 2,
	       "kvbrokerd: option --no-gpu takes no value\n"
	       "Try 'kvbrokerd --help' for more information.\n");
	expect("kvbctl", "--sock /x status", 2,
	       "kvbctl: unknown option --sock; did you mean --socket?\n"
	       "Try 'kvbctl --help' for more information.\n");
	expect("kvbctl", "status --jsn", 2,
	       "kvbctl: unknown option --jsn; did you mean --json?\n"
	       "Try 'kvbctl --help' for more information.\n");
	expect("kvbctl", "stauts", 2,
	       "kvbctl: unknown command 'stauts'; did you mean status?\n"
	       "Try 'kvbctl --help' for more information.\n");
	expect("kvbctl", "plan --model kimi-k2.5 --host-r 300G --gpu-tokens 1", 2,
	       "kvbctl plan: unknown option --host-r; did you mean --host-ram?\n"
	       "Try 'kvbctl plan --help' for more information.\n");
	expect("kvbctl", "--socket", 2,
	       "kvbctl: option --socket needs a value\n"
	       "Try 'kvbctl --help' for more information.\n");
	for (size_t i = 0; i < sizeof(typos) / sizeof(typos[0]); i++) {
		if (!strcmp(typos[i][0], "kvbgpucheck") && !gpucheck_built()) {
			harness_log("kvbgpucheck was built without the CUDA headers: it takes no "
				    "options, so its usage error is not checked here");
			continue;
		}
		snprintf(want, sizeof(want), "%s: %s\nTry '%s --help' for more information.\n",
			 typos[i][0], typos[i][2], typos[i][0]);
		expect(typos[i][0], typos[i][1], 2, want);
	}
}

/* A socket file nobody listens on (a broker that died without removing it). */
static void stale_socket(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);

	CHECK(fd >= 0 && strlen(path) < sizeof(sa.sun_path));
	memcpy(sa.sun_path, path, strlen(path) + 1);
	CHECK_OK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)));
	close(fd);
}

static void no_broker(const char *dir)
{
	char path[200], args[300], msg[512], *out;

	harness_log("no broker: the socket tried, the command that starts one");
	snprintf(path, sizeof(path), "%s/none.sock", dir);
	snprintf(args, sizeof(args), "--socket %s status", path);
	out = expect_line("kvbctl", args, 1,
			  HAS("kvbctl: no broker at ", path, "no socket there",
			      "start one with: kvbrokerd --socket "));
	harness_log("kvbctl said: %.*s", (int)strlen(out) - 1, out);
	free(out);
	CHECKF(strstr(kvb_connect_error(-ENOENT, path, msg, sizeof(msg)), path) &&
		       strstr(msg, "kvbrokerd --socket"),
	       "kvb_connect_error(-ENOENT): %s", msg);
	snprintf(path, sizeof(path), "%s/stale.sock", dir);
	stale_socket(path);
	snprintf(args, sizeof(args), "--socket %s status", path);
	out = expect_line("kvbctl", args, 1,
			  HAS("kvbctl: no broker at ", path, "nobody listens",
			      "start one with: kvbrokerd --socket "));
	harness_log("kvbctl said: %.*s", (int)strlen(out) - 1, out);
	free(out);
	unlink(path);
}

/* [socket-rule] XDG_RUNTIME_DIR moves nothing; --socket, then $KVB_SOCKET, then the default. */
static void socket_rule(const char *xdg, const char *sock)
{
	char kvbctl[PATH_MAX], args[PATH_MAX + 512], *out;
	int rc;

	harness_log("the socket rule, with $XDG_RUNTIME_DIR set");
	harness_bin_path("kvbctl", kvbctl, sizeof(kvbctl));
	/* A broker at $XDG_RUNTIME_DIR/kvbroker.sock is not where kvbctl looks by default. */
	snprintf(args, sizeof(args), "-u KVB_SOCKET XDG_RUNTIME_DIR=%s %s status", xdg, kvbctl);
	rc = harness_run_tool("/usr/bin/env", args, &out);
	/* 1 and no broker at the default; 0 where this machine runs one there ("socket PATH"). */
	CHECKF(strstr(out,
		      rc ? "no broker at " KVB_SOCKET_DEFAULT " " : "socket " KVB_SOCKET_DEFAULT) &&
		       !strstr(out, xdg),
	       "with $XDG_RUNTIME_DIR=%s and no $KVB_SOCKET, kvbctl should try %s only:\n%s", xdg,
	       KVB_SOCKET_DEFAULT, out);
	free(out);
	/* $KVB_SOCKET names it. */
	snprintf(args, sizeof(args), "KVB_SOCKET=%s XDG_RUNTIME_DIR=/nonexistent %s status", sock,
		 kvbctl);
	CHECK_EQ(harness_run_tool("/usr/bin/env", args, &out), 0);
	free(out);
	/* --socket wins over $KVB_SOCKET. */
	snprintf(args, sizeof(args),
		 "KVB_SOCKET=/nonexistent.sock XDG_RUNTIME_DIR=/nonexistent "
		 "%s --socket %s status",
		 kvbctl, sock);
	CHECK_EQ(harness_run_tool("/usr/bin/env", args, &out), 0);
	free(out);
	/* The library: the same rule. */
	{
		char buf[128];

		setenv("XDG_RUNTIME_DIR", xdg, 1);
		unsetenv("KVB_SOCKET");
		CHECK_OK(kvb_socket_path(NULL, buf, sizeof(buf)));
		CHECKF(!strcmp(buf, KVB_SOCKET_DEFAULT), "kvb_socket_path: %s", buf);
		setenv("KVB_SOCKET", sock, 1);
		CHECK_OK(kvb_socket_path(NULL, buf, sizeof(buf)));
		CHECKF(!strcmp(buf, sock), "kvb_socket_path with $KVB_SOCKET: %s", buf);
		unsetenv("KVB_SOCKET");
		unsetenv("XDG_RUNTIME_DIR");
	}
}

/* ---- permission refused (as FOREIGN_UID, through setpriv) ---- */

/* As the foreign uid: kvb_connect() fails -EACCES, and kvb_connect_error() names the group. */
static int client_main(const char *mode, const char *sock)
{
	struct kvb_opts o = {.socket_path = sock, .name = "foreign"};
	kvb_client *c = NULL;
	char msg[1024];
	int rc = kvb_connect(&o, &c);

	(void)mode;
	if (rc != -EACCES)
		return 2;
	kvb_connect_error(rc, sock, msg, sizeof(msg));
	printf("# kvb_connect_error: %s\n", msg);
	return strstr(msg, "a broker is running there") && strstr(msg, "group users") &&
			       strstr(msg, "usermod -aG users ")
		       ? 0
		       : 1;
}

static char dir[64], rundir[2][96], sockp[2][128];

static void remove_dirs(void)
{
	char lock[160];

	for (int i = 0; i < 2; i++) {
		if (snprintf(lock, sizeof(lock), "%s.lock", sockp[i]) < (int)sizeof(lock))
			unlink(lock);
		unlink(sockp[i]);
		rmdir(rundir[i]);
	}
	rmdir(dir);
}

/* kvbctl status as the foreign uid, against the broker on sock; returns its one line. */
static char *kvbctl_as_foreign(const char *sock, const char *const *has)
{
	char kvbctl[PATH_MAX], args[PATH_MAX + 256], *out;

	harness_bin_path("kvbctl", kvbctl, sizeof(kvbctl));
	snprintf(args, sizeof(args), "--reuid=%d --regid=%d --clear-groups %s --socket %s status",
		 FOREIGN_UID, FOREIGN_UID, kvbctl, sock);
	out = expect_line("/usr/bin/setpriv", args, 1, has);
	CHECKF(!strstr(out, "start one"), "a refused user is told to start a broker:\n%s", out);
	harness_log("kvbctl said: %.*s", (int)strlen(out) - 1, out);
	return out;
}

static void permission(void)
{
	struct harness_broker *b;
	int rc;

	if (geteuid() != 0 || !getgrnam("users") || access("/usr/bin/setpriv", X_OK)) {
		harness_log("permission: needs root, group 'users' and setpriv: part skipped");
		return;
	}
	harness_log("permission refused: who the broker admits, how to join");
	/* A directory the foreign uid may traverse, holding the brokers' own (0750, group). */
	snprintf(dir, sizeof(dir), "/tmp/kvbt-msg-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	atexit(remove_dirs);
	CHECK_OK(chmod(dir, 0711));
	for (int i = 0; i < 2; i++) {
		CHECK(snprintf(rundir[i], sizeof(rundir[i]), "%s/run%d", dir, i) <
		      (int)sizeof(rundir[i]));
		CHECK(snprintf(sockp[i], sizeof(sockp[i]), "%s/sock", rundir[i]) <
		      (int)sizeof(sockp[i]));
	}
	b = harness_broker_start("--pool", "64M", "--group", "users", "--socket", sockp[0]);
	rc = harness_wait_exit(
		harness_start_as(FOREIGN_UID, FOREIGN_UID, "perm", sockp[0], client_main));
	CHECKF(rc == 0,
	       "the library, as uid %d: exit %d (2: not -EACCES, 1: the message lacks the group "
	       "or the fix)",
	       FOREIGN_UID, rc);
	free(kvbctl_as_foreign(sockp[0], HAS("kvbctl: permission denied at ", sockp[0],
					     "a broker is running there", rundir[0],
					     "(owner root, group users, mode 0750)",
					     "admits only uid 0 (root) and group users",
					     "usermod -aG users ", "then log in again")));
	harness_broker_stop(b);

	/* Without --group the directory's group is the broker's, root: joining it is no fix. */
	b = harness_broker_start("--pool", "64M", "--socket", sockp[1]);
	free(kvbctl_as_foreign(sockp[1], HAS("permission denied at ", sockp[1], "group root",
					     "started without --group", "--group GROUP")));
	harness_broker_stop(b);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	char tmp[] = "/tmp/kvbt-xdg-XXXXXX", sock[128];

	if (argc == 4 && !strcmp(argv[1], "--client"))
		return client_main(argv[2], argv[3]);
	harness_init(argc, argv);
	usage_errors();
	CHECK(mkdtemp(tmp) != NULL);
	no_broker(tmp);
	snprintf(sock, sizeof(sock), "%s/kvbroker.sock", tmp);
	b = harness_broker_start("--pool", "64M", "--socket", sock);
	socket_rule(tmp, sock);
	harness_broker_stop(b);
	rmdir(tmp);
	permission();
	return H_PASS;
}
