// SPDX-License-Identifier: MIT
/*
 * t_rel_broker_kill.c - promise 7 (docs/reliability.md): broker death.
 *
 * Cycles (50 under make soak, 15 in make test, 4 under the sanitizers) of: start kvbrokerd on
 * one fixed socket, attach 4 client processes that run ring ops, control requests and leases
 * in a loop, SIGKILL the broker under that load, and restart it. Each time:
 *   - every client's next call returns an error (-ECONNRESET) within 100 ms of the kill (or
 *     of the call's start, if it started later): reported as p50/p99/max, p99 <= 100 ms
 *     asserted except under the sanitizers; no client hangs, and none dies of SIGBUS or
 *     SIGPIPE (their default actions are restored in the clients): its lease stays readable
 *     and intact after the broker died;
 *   - the new broker takes the socket over (the dead one's file is stale) and reclaims the
 *     orphaned pool; a second broker started next to a live one refuses to run (first and
 *     last cycle);
 * and afterwards nothing is left: no pool object in /dev/shm, no socket file, the same fds in
 * this process as before the first cycle.
 */
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "reliab.h"

#define NCLI 4
#define PAGE (64u * 1024)
#define MAXCYC 64

struct shared {
	char sock[108];
	_Atomic uint64_t kill_ns;
	_Atomic int ready;
	double lat_ms[MAXCYC * NCLI];
	int err[MAXCYC * NCLI];
};

static struct shared *sh;
static char brokerd[4096];
static char dir[64];

/* Also when a check fails: the socket file of a killed broker, and our directory. */
static void remove_dir(void)
{
	if (sh && sh->sock[0])
		unlink(sh->sock);
	if (dir[0])
		rmdir(dir);
}

static int client(int idx, void *arg)
{
	struct kvb_opts o = {.socket_path = sh->sock, .name = "victim"};
	struct kvb_layout l;
	struct kvb_lease lease;
	kvb_client *c = NULL;
	kvb_key k = harness_key(7, (uint64_t)idx);
	uint8_t *reg;
	uint32_t ns, bid;
	size_t pb;
	int rc = 0, counted = 0;
	uint64_t n = 0;

	(void)arg;
	/* Default actions again: a SIGPIPE or SIGBUS would kill us, and the test would see it. */
	signal(SIGPIPE, SIG_DFL);
	signal(SIGBUS, SIG_DFL);
	CHECK_OK(kvb_connect(&o, &c));
	harness_layout(&l, "broker-kill", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	reg = kvb_buf_alloc_host(c, 2 * PAGE, &bid);
	CHECK(reg != NULL);
	harness_fill(reg, PAGE, &k, 7);
	CHECK(kvb_put(c, ns, k, reg, PAGE) >= 0);
	CHECK_OK(kvb_acquire(c, ns, k, &lease));
	for (;;) {
		switch (n++ % 5) {
		case 0:
			rc = kvb_get(c, ns, k, reg + PAGE, PAGE);
			break;
		case 1:
			rc = kvb_put(c, ns, harness_key(8, n % 64), reg, PAGE);
			break;
		case 2: {
			char *js = NULL;

			rc = kvb_stats_json(c, &js); /* a control request */
			free(js);
			break;
		}
		case 3: {
			struct kvb_lease l2;

			rc = kvb_acquire(c, ns, k, &l2);
			if (rc == 0)
				rc = kvb_release(c, &l2);
			break;
		}
		default:
			rc = kvb_nop(c);
			break;
		}
		if (!counted && n > 20) {
			counted = 1;
			sh->ready++;
		}
		if (rc < 0 && rc != -ENOSPC)
			break;
	}
	{
		uint64_t now = harness_now_ns(), kt = sh->kill_ns;
		int slot = idx;

		CHECKF(kt, "client %d: error %d (%s) before the broker was killed", idx, rc,
		       harness_strerror(rc));
		sh->lat_ms[slot] = (double)(now - kt) / 1e6;
		sh->err[slot] = rc;
	}
	/* The lease is still mapped and intact: no SIGBUS. */
	CHECK_OK(harness_verify(lease.data, lease.len, &k, 7, "lease after the broker died"));
	CHECK_RC(kvb_nop(c), -ECONNRESET); /* and stays failed, at once */
	kvb_close(c);
	return 0;
}

/* The pool's shm name, from the broker's "ready" line. */
static void pool_name(const char *logpath, char *pool, size_t len)
{
	char line[512];
	FILE *f = fopen(logpath, "re");

	CHECK(f != NULL);
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, " pool /kvbroker-");

		if (p) {
			p += 7;
			snprintf(pool, len, "%.*s", (int)strcspn(p, " \n"), p);
			break;
		}
	}
	fclose(f);
	CHECKF(pool[0], "no pool name in %s", logpath);
}

static pid_t broker_start(const char *logpath)
{
	pid_t parent = getpid(), pid = fork();

	CHECK(pid >= 0);
	if (pid == 0) {
		int fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		dup2(fd, 1);
		dup2(fd, 2);
		execl(brokerd, brokerd, "--socket", sh->sock, "--pool", "32M", "--poll-us", "50",
		      (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 500; i++) {
		struct kvb_opts o = {.socket_path = sh->sock, .flags = KVB_CONNECT_CONTROL};
		kvb_client *c = NULL;

		if (kvb_connect(&o, &c) == 0) {
			kvb_close(c);
			return pid;
		}
		CHECKF(waitpid(pid, NULL, WNOHANG) == 0,
		       "kvbrokerd exited during start-up (log %s)", logpath);
		rel_sleep_ms(10);
	}
	harness_fail(__FILE__, __LINE__, "kvbrokerd not ready after 5 s");
}

/* A second broker on the same socket while one lives: must exit 1 at once. */
static void second_refused(const char *logpath)
{
	char cmd[8192], out[4096];
	FILE *p;
	size_t n;
	int st;

	snprintf(cmd, sizeof(cmd), "%s --socket %s --pool 32M 2>&1", brokerd, sh->sock);
	p = popen(cmd, "r");
	CHECK(p != NULL);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = 0;
	st = pclose(p);
	CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 1 && strstr(out, "another kvbrokerd"),
	       "a second broker next to a live one: status 0x%x, said:\n%s (log %s)", st, out,
	       logpath);
}

int main(int argc, char **argv)
{
	int cycles = (int)rel_pick(4, 15, 50), fd0, fd1, nl = 0, bad = 0;
	char logpath[4200], fdl0[4096], fdl1[4096], tmp[4096], pool[128] = "";
	double lat[MAXCYC * NCLI];
	struct stat st;

	harness_init(argc, argv);
	rel_deadline((unsigned)cycles * 4 + 60);
	sh = harness_shared(sizeof(*sh));
	snprintf(tmp, sizeof(tmp), "%s", argv[0]);
	snprintf(brokerd, sizeof(brokerd), "%s/../bin/kvbrokerd", dirname(tmp));
	if (getenv("KVB_BROKERD"))
		snprintf(brokerd, sizeof(brokerd), "%s", getenv("KVB_BROKERD"));
	snprintf(dir, sizeof(dir), "/tmp/kvbt-bkill-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	atexit(remove_dir);
	snprintf(sh->sock, sizeof(sh->sock), "%s/sock", dir);
	snprintf(tmp, sizeof(tmp), "%s", argv[0]);
	snprintf(logpath, sizeof(logpath), "%s/logs/t_rel_broker_kill.brokers.log", dirname(tmp));
	unlink(logpath);
	fd0 = rel_fd_count(getpid(), fdl0, sizeof(fdl0));

	for (int cyc = 0; cyc < cycles; cyc++) {
		pid_t b = broker_start(logpath), cli[NCLI];
		int status[NCLI];
		uint64_t end;

		if (cyc == 0)
			pool_name(logpath, pool, sizeof(pool));
		if (cyc == 0 || cyc == cycles - 1)
			second_refused(logpath);
		sh->kill_ns = 0;
		sh->ready = 0;
		for (int i = 0; i < NCLI; i++)
			cli[i] = harness_fork(client, cyc * NCLI + i, NULL);
		end = harness_now_ms() + 10000;
		while (sh->ready < NCLI && harness_now_ms() < end)
			rel_sleep_ms(1);
		CHECKF(sh->ready == NCLI, "cycle %d: clients not running after 10 s", cyc);
		rel_sleep_ms((unsigned)(cyc * 7 % 20));
		sh->kill_ns = harness_now_ns();
		kill(b, SIGKILL);
		waitpid(b, NULL, 0);
		CHECK_EQ(harness_wait(cli, NCLI, 5000, status), 0);
		for (int i = 0; i < NCLI; i++) {
			lat[nl] = sh->lat_ms[cyc * NCLI + i];
			CHECKF(sh->err[cyc * NCLI + i] == -ECONNRESET,
			       "cycle %d client %d: error %d (%s), want -ECONNRESET", cyc, i,
			       sh->err[cyc * NCLI + i], harness_strerror(sh->err[cyc * NCLI + i]));
			bad += lat[nl] > 100;
			nl++;
		}
		/* The dead broker's pool: one orphan at most, reclaimed by the next start. */
		CHECKF(rel_shm_count(pool) <= 1, "cycle %d: %d objects %s* in /dev/shm", cyc,
		       rel_shm_count(pool), pool);
	}
	/* A last broker adopts the socket, then stops cleanly: nothing may remain. */
	{
		pid_t b = broker_start(logpath);
		int s;

		CHECK_OK(kill(b, SIGTERM));
		CHECK_EQ(waitpid(b, &s, 0), b);
		CHECKF(WIFEXITED(s) && WEXITSTATUS(s) == 0, "last broker: status 0x%x", s);
	}
	CHECKF(rel_shm_count(pool) == 0, "/%s still in /dev/shm after the last clean stop", pool);
	CHECKF(stat(sh->sock, &st) < 0, "socket %s left behind", sh->sock);
	fd1 = rel_fd_count(getpid(), fdl1, sizeof(fdl1));
	CHECKF(fd1 == fd0, "test process fds: %d before, %d after\nbefore:\n%safter:\n%s", fd0, fd1,
	       fdl0, fdl1);
	{
		double p50 = rel_pct(lat, (size_t)nl, 50), p99 = rel_pct(lat, (size_t)nl, 99),
		       mx = rel_pct(lat, (size_t)nl, 100);

		rel_figure("%d SIGKILL+restart cycles under load, %d client calls cut: all "
			   "-ECONNRESET, 0 hangs, 0 SIGBUS/SIGPIPE; kill-to-error p50 %.2f ms, p99 "
			   "%.2f ms, max %.2f ms (%d over 100 ms); afterwards 0 pool objects in "
			   "/dev/shm, no socket file, fds %d -> %d",
			   cycles, nl, p50, p99, mx, bad, fd0, fd1);
		CHECKF(p99 <= 100 || rel_scale() == REL_SMALL, "kill-to-error p99 %.2f ms", p99);
	}
	return H_PASS;
}
