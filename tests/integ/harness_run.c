// SPDX-License-Identifier: MIT
/*
 * harness_run.c - running the programs built beside the tests (kvbctl, kvbrokerd) and reading
 * what they print, for the tool tests. See harness.h.
 */
#include <dirent.h>
#include <grp.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

void harness_bin_path(const char *name, char *out, size_t len)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	CHECKF(n > 0, "readlink /proc/self/exe");
	self[n] = '\0';
	/* BUILD/tests/t_x -> BUILD/bin/name */
	snprintf(out, len, "%s/../bin/%s", dirname(self), name);
}

int harness_run_tool(const char *prog, const char *args, char **out)
{
	char path[PATH_MAX], *cmd;
	size_t cap = 1 << 16, len = 0, n;
	char *buf = malloc(cap);
	FILE *p;
	int st;

	if (prog[0] == '/')
		snprintf(path, sizeof(path), "%s", prog);
	else
		harness_bin_path(prog, path, sizeof(path));
	CHECK(buf != NULL && asprintf(&cmd, "%s %s 2>&1", path, args) > 0);
	p = popen(cmd, "r");
	CHECKF(p != NULL, "popen %s", cmd);
	while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
		len += n;
		if (len == cap - 1) {
			char *nb = realloc(buf, cap * 2);

			CHECK(nb != NULL);
			buf = nb;
			cap *= 2;
		}
	}
	buf[len] = '\0';
	st = pclose(p);
	free(cmd);
	*out = buf;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

pid_t harness_start_as(uid_t uid, gid_t gid, const char *mode, const char *arg,
		       int (*client_main)(const char *mode, const char *arg))
{
	char self[PATH_MAX], ru[32], rg[32];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	pid_t pid;

	CHECKF(n > 0, "readlink /proc/self/exe");
	self[n] = '\0';
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		snprintf(ru, sizeof(ru), "--reuid=%u", (unsigned)uid);
		snprintf(rg, sizeof(rg), "--regid=%u", (unsigned)gid);
		execlp("setpriv", "setpriv", ru, rg, "--clear-groups", self, "--client", mode, arg,
		       (char *)NULL);
		/* No setpriv, or it cannot reach our binary: the same calls it makes. */
		if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 ||
		    setresuid(uid, uid, uid) < 0)
			_exit(126);
		_exit(client_main(mode, arg));
	}
	return pid;
}

int harness_wait_exit(pid_t pid)
{
	int st;

	CHECK_EQ(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int harness_keepers(const char *sock)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	int n = 0;

	while (d && (e = readdir(d))) {
		char p[300], buf[512];
		FILE *f;
		size_t len;

		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		snprintf(p, sizeof(p), "/proc/%s/cmdline", e->d_name);
		f = fopen(p, "r");
		if (!f)
			continue;
		len = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[len] = 0;
		for (size_t i = 0; i + 1 < len; i++)
			if (!buf[i])
				buf[i] = ' ';
		n += strstr(buf, "--keeper") && strstr(buf, sock);
	}
	if (d)
		closedir(d);
	return n;
}
