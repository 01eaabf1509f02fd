// SPDX-License-Identifier: MIT
/*
 * t_rel_disk_crash.c - promise 8 (docs/reliability.md): the broker SIGKILLed while it demotes
 * as fast as it can, then restarted on the same cache file, 5 times (20 under make soak): zero
 * corrupt pages served after any restart. Every other cycle runs the test broker with injected
 * I/O errors (kvbrokerd-hooks, KVB_DISK_FAULTS: every 5th page write fails, every 4th read
 * fails with -EIO or completes short with garbage behind it), so errors and short completions
 * meet the kill and the restart too.
 *
 * Set-up: a 16 MiB pool in front of a 24 MiB cache file on the real file system, two
 * namespaces whose pages are 60 KiB and 28 KiB (slots of 64 and 32 KiB: after the log wraps,
 * new slots start in the middle of old ones, which is what the scan must see through), and
 * more distinct page bytes than the disk holds, so the log wraps again and again.
 *
 * A writer process PUTs as fast as it can: keys at random; a key already stored is DELETEd
 * and PUT again as its next version, so a key has several versions on disk (DELETE writes no
 * tombstone). A page's bytes are a function of (key, version), stamped with both. The writer
 * records a version before its PUT is sent, so the record is never behind the disk. The test
 * The brokers run with --no-pool-keep, so that the RAM pool dies with them and only the disk
 * comes back. The test
 * SIGKILLs the broker once demotions are in flight (disk.writes_inflight > 0) after a random
 * 100-400 ms, starts a new one on the same file and GETs every key ever PUT.
 *
 * What "correct" means: a GET returns a miss, or exactly the bytes of one version of that key
 * that was PUT (never another key's bytes, never a mix, never a version not yet PUT). Not
 * necessarily the newest: a version still only in RAM at the kill is lost, and then the scan
 * brings back an older complete copy - DELETE is not durable, by design (docs/design.md). The
 * test counts how many served pages are the newest version. No GET may hang (each is timed).
 */
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <isa-l/crc.h>
#include <liburing.h>

#include "../../broker/slot.h"
#include "reliab.h"

#define SEED 5150
#define MAXKEYS 600
#define BIG (60u << 10)
#define SMALL (28u << 10)

static_assert(MAXKEYS % 2 == 0, "keys alternate between the two namespaces");

struct shared {
	int32_t maxv[MAXKEYS]; /* newest version PUT (or about to be); -1: never */
	_Atomic int killed;    /* the broker is being killed: errors are expected now */
	_Atomic uint64_t puts, deletes;
};

static struct shared *sh;
static int nkeys;
static kvb_key keys[MAXKEYS];
static struct kvb_layout lay[2];
static char brokerd[PATH_MAX + 32], hooks[PATH_MAX + 32], cache[PATH_MAX + 64], sock[108],
	logpath[PATH_MAX + 64];

/* The disk tier needs io_uring; some sandboxes forbid it (seccomp, io_uring_disabled). */
static void need_io_uring(void)
{
	struct io_uring r;
	int err = io_uring_queue_init(2, &r, 0);

	if (err)
		harness_skip("io_uring unavailable here: %s", strerror(-err));
	io_uring_queue_exit(&r);
}

static uint32_t page_len(int i)
{
	return i % 2 ? SMALL : BIG;
}

/* Content of version v of key i: stamp (i, v, ~), then a splitmix64 stream of them. */
static void make_page(uint8_t *p, int i, int32_t v)
{
	uint64_t s = (uint64_t)SEED << 48 ^ (uint64_t)i << 24 ^ (uint64_t)v, w[2];
	uint32_t stamp[2] = {(uint32_t)i, (uint32_t)v};

	memcpy(w, stamp, 8);
	w[1] = ~s;
	memcpy(p, w, sizeof(w));
	for (uint32_t o = sizeof(w); o < page_len(i); o += 8) {
		uint64_t z = (s += 0x9e3779b97f4a7c15ull);

		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		z ^= z >> 31;
		memcpy(p + o, &z, 8);
	}
}

static pid_t broker_start(int faults)
{
	pid_t parent = getpid(), pid = fork();
	const char *bin = faults ? hooks : brokerd;

	CHECK(pid >= 0);
	if (pid == 0) {
		int fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent || fd < 0)
			_exit(127);
		dup2(fd, 1);
		dup2(fd, 2);
		if (faults)
			setenv("KVB_DISK_FAULTS", "write=5,read=4", 1);
		/* --no-pool-keep: what is judged here is the disk after a crash; a kept RAM pool
		 * would serve versions newer than the disk's (t_pool_keep covers that). */
		execl(bin, bin, "--socket", sock, "--pool", "16M", "--disk", cache, "--disk-size",
		      "24M", "--no-pool-keep", (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 1000; i++) {
		struct kvb_opts o = {.socket_path = sock, .flags = KVB_CONNECT_CONTROL};
		kvb_client *c = NULL;

		if (kvb_connect(&o, &c) == 0) {
			kvb_close(c);
			return pid;
		}
		CHECKF(waitpid(pid, NULL, WNOHANG) == 0,
		       "kvbrokerd exited during start-up (log %s)", logpath);
		rel_sleep_ms(10);
	}
	harness_fail(__FILE__, __LINE__, "kvbrokerd not ready after 10 s (log %s)", logpath);
}

static kvb_client *attach(const char *name, uint32_t ns[2])
{
	struct harness_broker hb;
	kvb_client *c;

	memset(&hb, 0, sizeof(hb));
	snprintf(hb.sock, sizeof(hb.sock), "%s", sock);
	c = harness_connect(&hb, name, 0);
	for (int k = 0; k < 2; k++)
		CHECK_OK(kvb_ns_open(c, &lay[k], &ns[k], NULL));
	return c;
}

/* An error from the broker is fine once it is being killed; before that it fails the test. */
static int dead_or_fail(int rc, const char *what, int i)
{
	if (rc >= 0)
		return 0;
	CHECKF(sh->killed, "writer: %s of key %d: %d (%s) while the broker lives", what, i, rc,
	       harness_strerror(rc));
	return 1;
}

static int writer(int idx, void *arg)
{
	static uint8_t page[BIG];
	uint64_t r = 0x2545f4914f6cdd1dull ^ (uint64_t)idx;
	uint32_t ns[2];
	kvb_client *c;

	(void)arg;
	c = attach("crash-writer", ns);
	for (;;) {
		int i, rc;
		int32_t v;

		r ^= r << 13;
		r ^= r >> 7;
		r ^= r << 17;
		i = (int)(r % (uint64_t)nkeys);
		v = sh->maxv[i] + 1;
		if (v > 0) {
			rc = kvb_delete(c, ns[i % 2], keys[i]);
			if (rc != -ENOENT && dead_or_fail(rc, "DELETE", i))
				break;
			sh->deletes++;
		}
		make_page(page, i, v);
		sh->maxv[i] = v; /* before the PUT: the record is never behind the disk */
		rc = kvb_put(c, ns[i % 2], keys[i], page, page_len(i));
		if (dead_or_fail(rc, "PUT", i))
			break;
		sh->puts++;
	}
	kvb_close(c);
	return 0;
}

/* The offline oracle: per key, the version in its newest complete slot (-1: none). */
static int32_t expect[MAXKEYS];

static uint32_t crc32c(const void *p, size_t len)
{
	return ~crc32_iscsi((unsigned char *)(uintptr_t)p, (int)len, ~0u);
}

/*
 * Reads the cache file with the broker dead and its I/O landed (it takes the broker's lock, see
 * below) and judges every 4 KiB block on its own, without the broker's scan logic (no jumping
 * over slots): a slot counts when its header checks (magic, crc, version, this cache's id, a
 * length of one of our namespaces) and its payload's crc32c matches. Per key the highest
 * generation wins. Returns how many keys have a complete slot.
 */
static int oracle(void)
{
	int fd = open(cache, O_RDONLY), n = 0;
	uint64_t gen[MAXKEYS] = {0};
	static uint8_t buf[SLOT_BLOCK + BIG];
	struct slot_super sup;
	off_t size;

	CHECK(fd >= 0);
	/* The broker's lock: a SIGKILLed broker's ring lets go of the file only once its writes in
	 * flight landed (the kernel tears it down after the process was reaped). Read before that,
	 * and the file changes under the oracle. */
	CHECK(flock(fd, LOCK_EX) == 0);
	size = lseek(fd, 0, SEEK_END);
	CHECK(pread(fd, &sup, sizeof(sup), 0) == (ssize_t)sizeof(sup));
	CHECK(sup.magic == SUPER_MAGIC &&
	      sup.crc == crc32c(&sup, offsetof(struct slot_super, crc)));
	for (int i = 0; i < nkeys; i++)
		expect[i] = -1;
	for (off_t off = SLOT_DATA_OFF; off + SLOT_BLOCK <= size; off += SLOT_BLOCK) {
		struct slot_hdr h;
		ssize_t got;
		int k = -1;

		CHECK(pread(fd, &h, sizeof(h), off) == (ssize_t)sizeof(h));
		if (h.magic != SLOT_MAGIC ||
		    h.hdr_crc != crc32c(&h, offsetof(struct slot_hdr, hdr_crc)) ||
		    h.version != SLOT_VERSION || memcmp(h.cache_id, sup.cache_id, 16) ||
		    (h.len != BIG && h.len != SMALL))
			continue;
		for (int i = 0; i < nkeys && k < 0; i++)
			if (!memcmp(keys[i].b, h.key, 32))
				k = i;
		CHECKF(k >= 0 && h.len == page_len(k), "a slot at %lld of a key never PUT",
		       (long long)off);
		got = pread(fd, buf, SLOT_BLOCK + h.len, off);
		if (got != (ssize_t)(SLOT_BLOCK + h.len) ||
		    crc32c(buf + SLOT_BLOCK, h.len) != h.payload_crc || h.gen <= gen[k])
			continue;
		n += expect[k] < 0;
		gen[k] = h.gen;
		memcpy(&expect[k], buf + SLOT_BLOCK + 4, 4); /* the version stamp */
	}
	close(fd);
	return n;
}

struct verdict {
	int hits, newest, misses;
	double max_ms;
};

/* GETs every key ever PUT: a miss, or exactly one version of that key that was PUT. */
static struct verdict verify(kvb_client *c, const uint32_t ns[2], int cycle, int faults)
{
	static uint8_t got[BIG], want[BIG];
	struct verdict vd = {0};

	for (int i = 0; i < nkeys; i++) {
		uint64_t t0;
		uint32_t stamp[2];
		double ms;
		int rc;

		if (sh->maxv[i] < 0)
			continue;
		t0 = harness_now_ns();
		rc = kvb_get(c, ns[i % 2], keys[i], got, page_len(i));
		ms = (double)(harness_now_ns() - t0) / 1e6;
		if (ms > vd.max_ms)
			vd.max_ms = ms;
		if (rc == -ENOENT) {
			/* A slot the oracle found complete is lost only to an injected read fault. */
			CHECKF(expect[i] < 0 || faults,
			       "restart %d: key %d: a miss, but version %d is complete on disk",
			       cycle, i, expect[i]);
			vd.misses++;
			continue;
		}
		CHECKF(rc == (int)page_len(i), "restart %d: key %d: get returned %d (%s)", cycle, i,
		       rc, harness_strerror(rc));
		memcpy(stamp, got, sizeof(stamp));
		CHECKF(stamp[0] == (uint32_t)i && stamp[1] <= (uint32_t)sh->maxv[i],
		       "restart %d: key %d (newest version %d) served a page stamped key %u "
		       "version %u",
		       cycle, i, sh->maxv[i], stamp[0], stamp[1]);
		make_page(want, i, (int32_t)stamp[1]);
		for (uint32_t o = 0; o < page_len(i); o++)
			CHECKF(got[o] == want[o],
			       "restart %d: key %d version %u: byte %u is 0x%02x, want 0x%02x "
			       "(a corrupt page served)",
			       cycle, i, stamp[1], o, got[o], want[o]);
		CHECKF((int32_t)stamp[1] == expect[i],
		       "restart %d: key %d: served version %u, the newest complete slot holds %d",
		       cycle, i, stamp[1], expect[i]);
		vd.hits++;
		vd.newest += stamp[1] == (uint32_t)sh->maxv[i];
	}
	return vd;
}

static void remove_files(void)
{
	unlink(cache);
}

int main(int argc, char **argv)
{
	int cycles = (int)rel_pick(3, 5, 20), nfault = 0, inflight_min = 1 << 30, inflight_max = 0;
	uint64_t torn = 0, corrupt = 0, errors = 0, werrors = 0, hits = 0, newest = 0, checked = 0,
		 pages = 0;
	int recovered_min = 1 << 30, recovered_max = 0;
	double get_max = 0;
	char tmp[PATH_MAX], *d;
	struct statfs sf;
	uint64_t r = 88172645463325252ull;

	harness_init(argc, argv);
	need_io_uring();
	rel_deadline((unsigned)cycles * 8 + 60);
	nkeys = MAXKEYS; /* 26 MiB of pages for a 24 MiB disk at every scale: the log wraps */
	sh = harness_shared(sizeof(*sh));
	for (int i = 0; i < MAXKEYS; i++)
		sh->maxv[i] = -1;
	snprintf(tmp, sizeof(tmp), "%s", argv[0]);
	d = dirname(tmp);
	snprintf(brokerd, sizeof(brokerd), "%s/../bin/kvbrokerd", d);
	if (getenv("KVB_BROKERD"))
		snprintf(brokerd, sizeof(brokerd), "%s", getenv("KVB_BROKERD"));
	snprintf(hooks, sizeof(hooks), "%s/kvbrokerd-hooks", d);
	CHECKF(access(hooks, X_OK) == 0, "%s not built", hooks);
	snprintf(cache, sizeof(cache), "%s/t_rel_disk_crash.%d.cache", d, (int)getpid());
	snprintf(logpath, sizeof(logpath), "%s/logs", d);
	mkdir(logpath, 0755); /* the runner makes it; a test run by hand may not have it */
	snprintf(logpath, sizeof(logpath), "%s/logs/t_rel_disk_crash.brokers.log", d);
	unlink(logpath);
	snprintf(sock, sizeof(sock), "/tmp/kvbt-rdcrash-%d.sock", (int)getpid());
	atexit(remove_files);
	harness_layout(&lay[0], "test/rel-crash-big", KVB_LAYOUT_MLA, 64, 1, 0, 15, 64);
	harness_layout(&lay[1], "test/rel-crash-small", KVB_LAYOUT_MLA, 64, 1, 0, 7, 64);
	for (int i = 0; i < nkeys; i++)
		keys[i] = harness_key(SEED, (uint64_t)i);

	for (int cyc = 0; cyc <= cycles; cyc++) {
		int faults = cyc % 2 == 1, inflight = 0, st = 0, want = cyc ? oracle() : 0;
		pid_t b = broker_start(faults), w;
		uint64_t t0, delay;
		uint32_t ns[2];
		kvb_client *c;
		struct verdict vd;
		char *json;

		if (cyc == 0) {
			CHECK(statfs(cache, &sf) == 0);
			if (sf.f_type == 0x01021994) /* TMPFS_MAGIC */
				harness_skip("the build directory is on tmpfs");
		}
		nfault += faults;
		c = attach("crash-check", ns);
		json = harness_stats(c);
		if (cyc > 0) {
			uint64_t p = harness_stat_u64(json, "disk.pages");

			CHECKF(p == (uint64_t)want,
			       "restart %d: the scan indexed %llu pages, the file holds %d "
			       "complete newest slots",
			       cyc, (unsigned long long)p, want);
			CHECKF(harness_stat_has(json, "disk.warm") && strstr(json, "\"warm\":true"),
			       "restart %d did not adopt the cache (log %s)", cyc, logpath);
			pages += p;
			recovered_min = (int)p < recovered_min ? (int)p : recovered_min;
			recovered_max = (int)p > recovered_max ? (int)p : recovered_max;
			torn += harness_stat_u64(json, "disk.torn");
			corrupt += harness_stat_u64(json, "disk.corrupt");
		}
		free(json);
		if (cyc > 0) {
			vd = verify(c, ns, cyc, faults);
			hits += (uint64_t)vd.hits;
			newest += (uint64_t)vd.newest;
			checked += (uint64_t)(vd.hits + vd.misses);
			get_max = vd.max_ms > get_max ? vd.max_ms : get_max;
			harness_log(
				"restart %d%s: %llu pages recovered, %d keys served (%d at their "
				"newest version), %d misses, slowest GET %.1f ms",
				cyc, faults ? " (faults)" : "",
				(unsigned long long)harness_stat(c, "disk.pages"), vd.hits,
				vd.newest, vd.misses, vd.max_ms);
			errors += harness_stat(c, "disk.errors");
		}
		if (cyc == cycles) {
			kvb_close(c);
			CHECK_OK(kill(b, SIGTERM));
			CHECK_EQ(waitpid(b, &st, 0), b);
			CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0,
			       "kvbrokerd status 0x%x after SIGTERM (log %s)", st, logpath);
			break;
		}

		/* Heavy demotion: the writer PUTs faster than the disk takes them. */
		sh->killed = 0;
		w = harness_fork(writer, cyc, NULL);
		r ^= r << 13;
		r ^= r >> 7;
		r ^= r << 17;
		delay = 100 + r % 300;
		t0 = harness_now_ms();
		for (;;) {
			inflight = (int)harness_stat(c, "disk.writes_inflight");
			if (inflight > 0 && harness_now_ms() - t0 >= delay)
				break;
			CHECKF(harness_now_ms() - t0 < 20000,
			       "cycle %d: no demotion in flight after 20 s (log %s)", cyc, logpath);
			rel_sleep_ms(1);
		}
		werrors += harness_stat(c, "disk.errors");
		sh->killed = 1;
		rel_kill(b);
		kvb_close(c);
		CHECKF(harness_wait(&w, 1, 10000, &st) == 0 && st == 0,
		       "cycle %d: the writer did not end cleanly after the kill (status %d)", cyc,
		       st);
		inflight_min = inflight < inflight_min ? inflight : inflight_min;
		inflight_max = inflight > inflight_max ? inflight : inflight_max;
		harness_log("cycle %d%s: killed after %llu ms with %d page writes in flight; %llu "
			    "PUTs so far",
			    cyc, faults ? " (faults)" : "", (unsigned long long)delay, inflight,
			    (unsigned long long)sh->puts);
	}
	rel_figure(
		"%d SIGKILLs during demotion (%d-%d page writes in flight at the kill; %d "
		"runs with injected faults: %llu write errors before the kills, %llu read "
		"errors in the checks), %llu PUTs and "
		"%llu DELETEs; after the restarts %llu pages recovered (%d-%d per restart, torn "
		"%llu, corrupt %llu discarded), %llu GETs: %llu served, all byte-exact (%llu the "
		"newest version), 0 corrupt; slowest GET %.1f ms",
		cycles, inflight_min, inflight_max, nfault, (unsigned long long)werrors,
		(unsigned long long)errors, (unsigned long long)sh->puts,
		(unsigned long long)sh->deletes, (unsigned long long)pages, recovered_min,
		recovered_max, (unsigned long long)torn, (unsigned long long)corrupt,
		(unsigned long long)checked, (unsigned long long)hits, (unsigned long long)newest,
		get_max);
	return H_PASS;
}
