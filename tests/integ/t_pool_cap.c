// SPDX-License-Identifier: MIT
/*
 * t_pool_cap.c - a pool larger than the machine can give the broker is refused at start-up, at
 * once and leaving nothing behind; one that fits starts (broker/memcap.c, main.c pool_fits):
 *   1. --pool of 4 x (MemTotal + SwapTotal): exit 1 within 2 s with one error line naming
 *      MemAvailable and --pool-overcommit, and no socket, lock file, keeper (process or socket),
 *      /dev/shm object, nor the socket directory the start made;
 *   2. --pool 64M starts, and its log says what the machine can give;
 *   3. on a fabricated machine (kvbrokerd-hooks with KVB_TEST_MEMCAP_ROOT): a cgroup v2 parent
 *      with memory.max 320M refuses --pool 128M naming that cgroup and the pool that would fit;
 *      with --pool-overcommit the broker warns with the same figures and starts; killed, its
 *      kept pool is adopted by the next broker without the flag (an adopted pool is not
 *      checked: its memory is taken already);
 *   4. in a real memory cgroup of 256 MiB made for the test (cgroup v2 where its memory
 *      controller can be enabled, else v1; root only): --pool 512M is refused naming it. Where
 *      no such cgroup can be made, that part is skipped with a line saying why.
 */
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static char cg_made[PATH_MAX]; /* the cgroup part 4 made, removed at exit */

static void cg_remove(void)
{
	if (cg_made[0])
		rmdir(cg_made);
}

/* A /proc/meminfo value in bytes, 0 when absent. */
static uint64_t meminfo(const char *key)
{
	char line[256];
	unsigned long long kb = 0;
	size_t n = strlen(key);
	FILE *f = fopen("/proc/meminfo", "re");

	CHECK(f != NULL);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, n) && line[n] == ':' && sscanf(line + n + 1, "%llu", &kb))
			break;
	fclose(f);
	return (uint64_t)kb << 10;
}

/* /dev/shm entries whose name has text. */
static int shm_count(const char *text)
{
	DIR *d = opendir("/dev/shm");
	struct dirent *e;
	int n = 0;

	while (d && (e = readdir(d)))
		n += strstr(e->d_name, text) != NULL;
	if (d)
		closedir(d);
	return n;
}

static int count(const char *s, const char *text)
{
	int n = 0;

	for (; (s = strstr(s, text)); s++)
		n++;
	return n;
}

static void put(const char *root, const char *rel, const char *text)
{
	char path[PATH_MAX], *p;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	for (p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
		*p = '\0';
		mkdir(path, 0700);
		*p = '/';
	}
	f = fopen(path, "w");
	CHECKF(f != NULL, "%s: %s", path, strerror(errno));
	fputs(text, f);
	fclose(f);
}

static int write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	int ok;

	if (!f)
		return -1;
	ok = fputs(text, f) >= 0;
	return fclose(f) == 0 && ok ? 0 : -1;
}

/* 1. Far too big: refused at once, nothing left. */
static void too_big(const char *brokerd, const char *dir)
{
	char sock[108], sub[96], path[128], args[PATH_MAX + 128], name[64], *out;
	uint64_t pool = 4 * (meminfo("MemTotal") + meminfo("SwapTotal")), t0, ms;
	int rc;

	CHECK(pool > 0);
	snprintf(sub, sizeof(sub), "%s/sub", dir); /* the broker makes it */
	snprintf(sock, sizeof(sock), "%s/sock", sub);
	snprintf(name, sizeof(name), "/kvbt-poolcap-%d", (int)getpid());
	snprintf(args, sizeof(args), "--socket %s --pool-name %s --pool %lluG --no-gpu", sock, name,
		 (unsigned long long)((pool >> 30) + 1));
	harness_log("1. %s %s", brokerd, args);
	t0 = harness_now_ms();
	rc = harness_run_tool(brokerd, args, &out);
	ms = harness_now_ms() - t0;
	printf("%s", out);
	CHECKF(rc == 1, "exit %d, want 1", rc);
	CHECKF(ms < 2000, "refused after %llu ms", (unsigned long long)ms);
	CHECKF(strstr(out, "MemAvailable") && strstr(out, "--pool-overcommit") &&
		       strstr(out, "this machine can give the broker"),
	       "the refusal names neither MemAvailable nor the flag");
	CHECKF(count(out, "\n") == 1 && count(out, " error ") == 1, "want one error line");
	CHECKF(access(sock, F_OK) < 0, "%s left", sock);
	snprintf(path, sizeof(path), "%s.lock", sock);
	CHECKF(access(path, F_OK) < 0, "%s left", path);
	snprintf(path, sizeof(path), "%s.keep", sock);
	CHECKF(access(path, F_OK) < 0, "%s left", path);
	CHECKF(access(sub, F_OK) < 0, "the socket directory %s left", sub);
	CHECK_EQ(harness_keepers(sock), 0);
	CHECK_EQ(shm_count(name + 1), 0);
	free(out);
}

/* 3. A fabricated cgroup v2 machine: the cgroup is named; the flag overrides. */
static void fabricated(const char *hooks, const char *dir)
{
	char root[PATH_MAX], sock[108], args[PATH_MAX + 128], *out;
	struct harness_broker *b;
	int rc;

	snprintf(root, sizeof(root), "%s/machine", dir);
	CHECK_OK(mkdir(root, 0700));
	put(root, "proc/meminfo", "MemTotal: 67108864 kB\nMemAvailable: 62914560 kB\n");
	put(root, "proc/self/cgroup", "0::/kvbt.slice/kvbt.service\n");
	put(root, "proc/self/mountinfo",
	    "35 22 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n");
	put(root, "sys/fs/cgroup/cgroup.controllers", "cpu io memory pids\n");
	put(root, "sys/fs/cgroup/kvbt.slice/memory.max", "335544320\n");
	put(root, "sys/fs/cgroup/kvbt.slice/memory.current", "0\n");
	put(root, "sys/fs/cgroup/kvbt.slice/kvbt.service/memory.max", "max\n");
	CHECK_OK(setenv("KVB_TEST_MEMCAP_ROOT", root, 1));

	snprintf(sock, sizeof(sock), "%s/fab.sock", dir);
	snprintf(args, sizeof(args), "--socket %s --pool 128M --no-gpu", sock);
	harness_log("3. KVB_TEST_MEMCAP_ROOT=%s %s %s", root, hooks, args);
	rc = harness_run_tool(hooks, args, &out);
	printf("%s", out);
	CHECKF(rc == 1, "exit %d, want 1", rc);
	CHECKF(strstr(out, "--pool 128.0 MiB: this machine can give the broker 62.1 MiB "
			   "(MemAvailable 60.0 GiB; cgroup /kvbt.slice memory.max 320.0 MiB, "
			   "320.0 MiB of it free; headroom 257.9 MiB): use --pool 62M or less, or "
			   "--pool-overcommit if you know better"),
	       "not the refusal wanted");
	free(out);

	CHECK_OK(setenv("KVB_BROKERD", hooks, 1));
	b = harness_broker_start("--pool", "128M", "--pool-overcommit", "--no-gpu");
	CHECK(harness_broker_log_has(b, "--pool 128.0 MiB: this machine can give the broker 62.1 "
					"MiB (MemAvailable 60.0 GiB; cgroup /kvbt.slice "
					"memory.max 320.0 MiB"));
	CHECK(harness_broker_log_has(b, "starting anyway (--pool-overcommit)"));
	CHECK(harness_broker_log_has(b, "ready in"));

	/* Killed, its pool kept: the next broker adopts it without --pool-overcommit, unchecked
	 * (that memory is taken already, so no longer in MemAvailable). */
	snprintf(sock, sizeof(sock), "%s", b->sock);
	CHECK_OK(kill(b->pid, SIGKILL));
	while (harness_broker_alive(b))
		usleep(1000);
	b = harness_broker_start("--pool", "128M", "--no-gpu", "--socket", sock);
	CHECK(harness_broker_log_has(b, "adopt: "));
	CHECK(!harness_broker_log_has(b, "this machine can give"));
	harness_broker_stop(b);
	unsetenv("KVB_BROKERD");
	unsetenv("KVB_TEST_MEMCAP_ROOT");
}

/*
 * A cgroup of 256 MiB for part 4 into cg (its directory) and its path as /proc/self/cgroup
 * writes it into path; 0, or -1 after saying why none can be made here.
 */
static int make_cgroup(char *cg, size_t len, char *path, size_t plen)
{
	char self[PATH_MAX], line[PATH_MAX], file[PATH_MAX + 32];
	const char *v2[] = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"};
	FILE *f;

	if (geteuid() != 0) {
		harness_log("not root: the real cgroup part is skipped");
		return -1;
	}
	/* cgroup v2: a child of the root, where the memory controller can be enabled. */
	for (int i = 0; i < 2; i++) {
		snprintf(file, sizeof(file), "%s/cgroup.subtree_control", v2[i]);
		if (access(file, W_OK) < 0 || write_file(file, "+memory") < 0)
			continue;
		snprintf(cg, len, "%s/kvbt-poolcap-%d", v2[i], (int)getpid());
		snprintf(path, plen, "/kvbt-poolcap-%d", (int)getpid());
		if (mkdir(cg, 0755) < 0)
			continue;
		snprintf(cg_made, sizeof(cg_made), "%s", cg);
		snprintf(file, sizeof(file), "%s/memory.max", cg);
		if (write_file(file, "268435456") == 0)
			return 0;
		rmdir(cg);
		cg_made[0] = '\0';
	}
	/* cgroup v1: a child of our own memory cgroup. */
	self[0] = '\0';
	f = fopen("/proc/self/cgroup", "re");
	while (f && fgets(line, sizeof(line), f)) {
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;

		if (c2 && (!strncmp(c1 + 1, "memory:", 7) || strstr(c1, ",memory,") ||
			   strstr(c1, ":memory,") || strstr(c1, ",memory:"))) {
			c2[1 + strcspn(c2 + 1, "\n")] = '\0';
			snprintf(self, sizeof(self), "%s", strcmp(c2 + 1, "/") ? c2 + 1 : "");
			break;
		}
	}
	if (f)
		fclose(f);
	if (!f || access("/sys/fs/cgroup/memory/memory.limit_in_bytes", F_OK) < 0) {
		harness_log("no writable memory cgroup (v2 memory controller or v1 "
			    "/sys/fs/cgroup/memory): the real cgroup part is skipped");
		return -1;
	}
	if (snprintf(cg, len, "/sys/fs/cgroup/memory%s/kvbt-poolcap-%d", self, (int)getpid()) >=
		    (int)len ||
	    snprintf(path, plen, "%s/kvbt-poolcap-%d", self, (int)getpid()) >= (int)plen) {
		harness_log("cgroup path too long: the real cgroup part is skipped");
		return -1;
	}
	if (mkdir(cg, 0755) < 0) {
		harness_log("mkdir %s: %s: the real cgroup part is skipped", cg, strerror(errno));
		return -1;
	}
	snprintf(cg_made, sizeof(cg_made), "%s", cg);
	snprintf(file, sizeof(file), "%s/memory.limit_in_bytes", cg);
	if (write_file(file, "268435456") < 0) {
		harness_log("%s: %s: the real cgroup part is skipped", file, strerror(errno));
		return -1;
	}
	return 0;
}

/* 4. A real cgroup of 256 MiB: --pool 512M is refused, naming it. */
static void real_cgroup(const char *brokerd, const char *dir)
{
	char cg[PATH_MAX], path[PATH_MAX], sock[108], args[3 * PATH_MAX], want[PATH_MAX + 16];
	char *out;
	int rc;

	if (make_cgroup(cg, sizeof(cg), path, sizeof(path)))
		return;
	snprintf(sock, sizeof(sock), "%s/cg.sock", dir);
	snprintf(args, sizeof(args),
		 "-c 'echo $$ > %s/cgroup.procs && exec %s --socket %s --pool 512M --no-gpu'", cg,
		 brokerd, sock);
	harness_log("4. in %s (%s): sh %s", cg, path, args);
	rc = harness_run_tool("/bin/sh", args, &out);
	printf("%s", out);
	CHECKF(rc == 1, "exit %d, want 1 (137: the OOM killer)", rc);
	snprintf(want, sizeof(want), "cgroup %s memory.", path);
	CHECKF(strstr(out, want) && strstr(out, "--pool-overcommit"),
	       "the refusal does not name %s", path);
	CHECKF(access(sock, F_OK) < 0, "%s left", sock);
	free(out);
	cg_remove();
	cg_made[0] = '\0';
}

int main(int argc, char **argv)
{
	char dir[] = "/tmp/kvbt-poolcap-XXXXXX", brokerd[PATH_MAX], hooks[PATH_MAX + 32];
	char self[PATH_MAX];
	struct harness_broker *b;

	harness_init(argc, argv);
	atexit(cg_remove);
	CHECK(mkdtemp(dir) != NULL);
	harness_bin_path("kvbrokerd", brokerd, sizeof(brokerd));
	/* BUILD/tests/kvbrokerd-hooks, beside this test (an absolute path for the shell). */
	CHECK(realpath("/proc/self/exe", self) != NULL);
	snprintf(hooks, sizeof(hooks), "%s/kvbrokerd-hooks", dirname(self));
	CHECKF(access(hooks, X_OK) == 0, "%s not built", hooks);

	too_big(brokerd, dir);

	harness_log("2. --pool 64M fits");
	b = harness_broker_start("--pool", "64M", "--no-gpu");
	CHECK(harness_broker_log_has(b, "pool: 64.0 MiB fits: this machine can give the broker"));
	harness_broker_stop(b);

	fabricated(hooks, dir);
	real_cgroup(brokerd, dir);

	snprintf(self, sizeof(self), "rm -rf '%s'", dir);
	CHECK_EQ(system(self), 0);
	return H_PASS;
}
