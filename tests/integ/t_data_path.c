// SPDX-License-Identifier: MIT
/*
 * t_data_path.c - the data path's fast paths keep every byte. Behaviour only: no
 * figure is asserted (make bench measures them).
 *   - Registration prefault: a kvb_buf_alloc_host() buffer is resident as soon as it is
 *     returned (mincore); a sealed memfd registered by fd has its blocks allocated (st_blocks)
 *     and its bytes unchanged.
 *   - Streaming copies: PUT from plain memory (staging) and GET into plain memory (the lease
 *     copy) of a Kimi-K2.5 page and of odd sizes at odd alignments, byte-exact, nothing written
 *     past the page; GET and PUT of the same through registered buffers (the broker's copies).
 *   - Self-copied GET (KVB_CLIENT_GET_SELF_KB=1): a GET into a buffer of ours is the client's
 *     own lease copy, byte-exact, and the lease is given back (no lease left).
 *   - Parallel fan-out: four processes GET the same pages at once, each byte-exact.
 *   - Batches to the workers: a kvb_submit batch of 1 MiB GETs is copied by the workers, a
 *     lone kvb_get of the same page inline (STATS copy.queued_jobs / inline_jobs), for a
 *     client that keeps them the broker's (KVB_CLIENT_GET_SELF_KB=0).
 *   - [dir-few] Under four CPUs a 1 MiB GET into a registered buffer is the library's copy
 *     through the directory (counters.dir_gets, no copy job); the broker's from four up.
 *   - Off-loop release: a client with a 64 MiB buffer exits without closing while we keep
 *     running ops; the broker serves on, its page stays readable, and the background thread
 *     that unmapped the buffer (STATS bg_jobs back to 0) runs at nice 10, below the copy
 *     workers (bg.c [bg-nice]).
 *   - Lease holds: after an ACQUIRE of an 11 MiB page (completed inline) the loop stays awake
 *     for the client's copy out of the lease (0.5 ms here, past the 200 us poll window; the
 *     hold is LOOP_HOLD_MAX, 5 ms), so the next ACQUIRE finds it polling: STATS loop_sleeps
 *     does not grow (it did when only deferred completions held the loop, and each page paid
 *     two sleeps and wake-ups). A timing check: under the sanitizers (KVB_SCALE small, every
 *     STATS some milliseconds) it is reported, not required.
 *   - One CPU: this process and every broker thread pinned to one CPU; NOP, PUT and GET of
 *     64 KiB pages complete and are byte-exact (client and broker yield to each other).
 */
#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define KIMI (64u * 61 * 1152)
#define NPAGES 4

static struct harness_broker *br;

static uint32_t open_ns(kvb_client *c, const char *model, uint32_t layers, uint32_t bytes,
			size_t *pb)
{
	struct kvb_layout l;
	uint32_t ns;

	harness_layout(&l, model, KVB_LAYOUT_MLA, 64, 1, 0, layers, bytes);
	CHECK_OK(kvb_ns_open(c, &l, &ns, pb));
	return ns;
}

static size_t resident(void *p, size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	size_t n = (len + (size_t)pg - 1) / (size_t)pg, r = 0;
	unsigned char *v = malloc(n);

	CHECK(v != NULL);
	CHECK(mincore(p, len, v) == 0);
	for (size_t i = 0; i < n; i++)
		r += v[i] & 1;
	free(v);
	return r;
}

static void test_prefault(kvb_client *c)
{
	const size_t len = 8u << 20;
	long pg = sysconf(_SC_PAGESIZE);
	uint32_t id, id2;
	uint8_t *p = kvb_buf_alloc_host(c, len, &id), *m;
	struct stat st;
	int fd;

	CHECK(p != NULL);
	CHECK_EQ(resident(p, len), len / (size_t)pg);
	CHECK_OK(kvb_buf_unregister(c, id));

	fd = memfd_create("t_data_path", MFD_ALLOW_SEALING);
	CHECK(fd >= 0);
	CHECK(ftruncate(fd, (off_t)len) == 0);
	m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	CHECK(m != MAP_FAILED);
	m[12345] = 7;
	CHECK(fstat(fd, &st) == 0);
	CHECK_LE((uint64_t)st.st_blocks * 512, 2u << 20); /* one page written: sparse */
	CHECK_OK(kvb_buf_register_host_fd(c, fd, 0, len, m, KVB_BUF_SEAL, &id2));
	CHECK(fstat(fd, &st) == 0);
	CHECK_GE((uint64_t)st.st_blocks * 512, len);
	CHECK_EQ((uint64_t)st.st_size, len);
	CHECK_EQ(m[12345], 7);
	CHECK_EQ(m[12346], 0);
	CHECK_OK(kvb_buf_unregister(c, id2));
	munmap(m, len);
	close(fd);
}

/* PUT and GET of one page through plain memory at odd offsets, and through buffers. */
static void roundtrip(kvb_client *c, uint32_t ns, size_t pb, uint64_t seed, size_t so, size_t dso,
		      int via_buf)
{
	kvb_key key = harness_key(seed, so * 100 + dso * 10 + (uint64_t)via_buf);
	uint8_t *src, *dst, *hb = NULL;
	uint32_t hid = 0;
	char what[80];

	if (via_buf) {
		hb = kvb_buf_alloc_host(c, 2 * pb + 8192, &hid);
		CHECK(hb != NULL);
		src = hb + so;
		dst = hb + pb + 4096 + dso;
	} else {
		src = malloc(pb + so);
		dst = malloc(pb + dso + 4096);
		CHECK(src && dst);
		src += so;
		dst += dso;
	}
	harness_fill(src, pb, &key, seed);
	memset(dst, 0xcc, pb + 1024);
	CHECK_RC(kvb_put(c, ns, key, src, pb), 0);
	CHECK_RC(kvb_get(c, ns, key, dst, pb), (long long)pb);
	snprintf(what, sizeof(what), "page %zu so %zu dso %zu buf %d", pb, so, dso, via_buf);
	CHECK(harness_verify(dst, pb, &key, seed, what) == 0);
	for (size_t i = pb; i < pb + 1024; i++)
		CHECKF(dst[i] == 0xcc, "%s: wrote past the page at +%zu", what, i - pb);
	if (via_buf) {
		CHECK_OK(kvb_buf_unregister(c, hid));
	} else {
		free(src - so);
		free(dst - dso);
	}
}

/*
 * [batch-queue] 1 MiB pages (under --copy-inline's 4 MiB): a kvb_submit batch of GETs has its
 * copies queued for the workers (all but the batch's last, whose SQE has none behind it),
 * byte-exact; the same page alone (kvb_get) is copied inline on the loop.
 */
static void test_lease_hold(kvb_client *c)
{
	size_t pb;
	uint32_t ns = open_ns(c, "test/data-path-hold", 61, 2880, &pb);
	const char *scale = getenv("KVB_SCALE");
	uint8_t *page = malloc(pb);
	kvb_key k = harness_key(77, 1);
	struct kvb_lease l;
	uint64_t before, after;

	CHECK(page != NULL);
	harness_fill(page, pb, &k, 77);
	CHECK_RC(kvb_put(c, ns, k, page, pb), 0);
	for (int i = 0; i < 3; i++) { /* three tries: this process may lose its CPU meanwhile */
		usleep(20000); /* past every hold of the ops before: the loop goes to sleep */
		CHECK_OK(kvb_acquire(c, ns, k, &l));
		before = harness_stat(c, "loop_sleeps");
		usleep(500); /* copying the page out of its lease */
		CHECK_OK(kvb_release(c, &l));
		CHECK_OK(kvb_acquire(c, ns, k, &l));
		after = harness_stat(c, "loop_sleeps");
		CHECK_OK(kvb_release(c, &l));
		harness_log("lease hold: %llu -> %llu", (unsigned long long)before,
			    (unsigned long long)after);
		if (after == before)
			break;
	}
	if (scale && !strcmp(scale, "small") && after != before)
		harness_log("lease hold not checked under the sanitizers (%llu -> %llu sleeps)",
			    (unsigned long long)before, (unsigned long long)after);
	else
		CHECKF(after == before, "the loop slept during a lease copy (%llu -> %llu sleeps)",
		       (unsigned long long)before, (unsigned long long)after);
	free(page);
}

static void test_batch_queue(kvb_client *c)
{
	enum { N = 4 };
	size_t pb;
	uint32_t ns = open_ns(c, "t_data_path-batch", 16, 1024, &pb), hid;
	uint8_t *hb = kvb_buf_alloc_host(c, (N + 1) * pb, &hid);
	struct kvb_op ops[N];
	struct kvb_completion comp[N];
	kvb_key keys[N];
	uint64_t q0, i0;
	int got = 0;

	CHECK(pb == 1u << 20 && hb != NULL);
	for (int i = 0; i < N; i++) {
		keys[i] = harness_key(77, (uint64_t)i);
		harness_fill(hb + (size_t)N * pb, pb, &keys[i], 77);
		CHECK_RC(kvb_put(c, ns, keys[i], hb + (size_t)N * pb, pb), 0);
	}
	memset(hb, 0xcc, (size_t)N * pb);
	q0 = harness_stat(c, "copy.queued_jobs");
	memset(ops, 0, sizeof(ops));
	for (int i = 0; i < N; i++) {
		ops[i].opcode = KVB_OP_GET;
		ops[i].ns = ns;
		ops[i].buf = hid;
		ops[i].key = keys[i];
		ops[i].off = (uint64_t)i * pb;
		ops[i].user_data = (uint64_t)i;
	}
	CHECK_EQ(kvb_submit(c, ops, N), N);
	while (got < N) {
		int r = kvb_reap(c, comp + got, N - got, 1, 5000);

		CHECK(r > 0);
		got += r;
	}
	for (int i = 0; i < N; i++) {
		CHECK_EQ(comp[i].res, (int32_t)pb);
		CHECK(harness_verify(hb + comp[i].user_data * pb, pb, &keys[comp[i].user_data], 77,
				     "batched GET") == 0);
	}
	CHECK_GE(harness_stat(c, "copy.queued_jobs"), q0 + N - 1);
	q0 = harness_stat(c, "copy.queued_jobs");
	i0 = harness_stat(c, "copy.inline_jobs");
	CHECK_RC(kvb_get(c, ns, keys[0], hb, pb), (long long)pb);
	CHECK(harness_verify(hb, pb, &keys[0], 77, "lone GET") == 0);
	CHECK_EQ(harness_stat(c, "copy.queued_jobs"), q0);
	CHECK_EQ(harness_stat(c, "copy.inline_jobs"), i0 + 1);
	CHECK_OK(kvb_buf_unregister(c, hid));
}

/*
 * [dir-few] Under four CPUs a 1 MiB GET into a kvb_buf_alloc_host() buffer is the library's own
 * copy of a page the directory lists (counted as a directory GET, no copy job); a page it does
 * not list goes to the broker. Four CPUs or more: the broker's copy either way.
 */
static void test_dir_few(kvb_client *c)
{
	size_t pb;
	uint32_t ns = open_ns(c, "t_data_path-few", 16, 1024, &pb), hid;
	uint8_t *hb = kvb_buf_alloc_host(c, 2 * pb, &hid);
	kvb_key k = harness_key(78, 0);
	int few = sysconf(_SC_NPROCESSORS_ONLN) < 4;
	uint64_t d0, j0;

	CHECK(hb != NULL);
	harness_fill(hb + pb, pb, &k, 78);
	CHECK_RC(kvb_put(c, ns, k, hb + pb, pb), 0);
	d0 = harness_stat(c, "counters.dir_gets");
	j0 = harness_stat(c, "copy.inline_jobs") + harness_stat(c, "copy.queued_jobs");
	memset(hb, 0, pb);
	CHECK_RC(kvb_get(c, ns, k, hb, pb), (long long)pb);
	CHECK(harness_verify(hb, pb, &k, 78, "1 MiB GET into a buffer") == 0);
	CHECK_EQ(harness_stat(c, "counters.dir_gets") - d0, (uint64_t)few);
	CHECK_EQ(harness_stat(c, "copy.inline_jobs") + harness_stat(c, "copy.queued_jobs") - j0,
		 (uint64_t)!few);
	harness_log("1 MiB GET into a buffer, %s CPUs: %s", few ? "under 4" : "4 or more",
		    few ? "the library's copy" : "the broker's");
	CHECK_OK(kvb_buf_unregister(c, hid));
}

static void test_copies(kvb_client *c, uint64_t seed)
{
	size_t pb;
	uint32_t kimi = open_ns(c, "test/dp-kimi", 61, 1152, &pb);
	uint32_t odd;

	CHECK_EQ(pb, KIMI);
	for (size_t so = 0; so < 3; so++)
		for (size_t dso = 0; dso < 3; dso++)
			roundtrip(c, kimi, pb, seed, so * 7, dso * 3 + 1, so == dso);
	/* 64 x 4099 B: above the streaming threshold, not a multiple of any vector. */
	odd = open_ns(c, "test/dp-odd", 1, 4099, &pb);
	CHECK_EQ(pb, 64u * 4099);
	roundtrip(c, odd, pb, seed + 1, 5, 3, 0);
	roundtrip(c, odd, pb, seed + 1, 1, 9, 1);
}

struct fan {
	kvb_key keys[NPAGES];
	struct harness_gate go;
};

static int fan_child(int idx, void *arg)
{
	struct fan *f = arg;
	kvb_client *c = harness_connect(br, "t_data_path-rank", 0);
	uint32_t id;
	size_t pb;
	uint32_t ns = open_ns(c, "test/dp-fan", 61, 1152, &pb);
	uint8_t *hb = kvb_buf_alloc_host(c, NPAGES * pb, &id);

	CHECK(hb != NULL);
	harness_gate_wait(&f->go, 10000);
	for (int k = 0; k < NPAGES; k++) {
		CHECK_RC(kvb_get(c, ns, f->keys[k], hb + k * pb, pb), (long long)pb);
		CHECK(harness_verify(hb + k * pb, pb, &f->keys[k], 77, "fan-out") == 0);
	}
	(void)idx;
	kvb_close(c);
	return 0;
}

static void test_fan_out(kvb_client *c)
{
	struct fan *f = harness_shared(sizeof(*f));
	uint8_t *src;
	size_t pb;
	uint32_t ns = open_ns(c, "test/dp-fan", 61, 1152, &pb);
	pid_t pids[4];

	harness_gate_init(&f->go);
	harness_key_chain(f->keys, NPAGES, 64, 77);
	src = malloc(pb);
	CHECK(src != NULL);
	for (int k = 0; k < NPAGES; k++) {
		harness_fill(src, pb, &f->keys[k], 77);
		CHECK_RC(kvb_put(c, ns, f->keys[k], src, pb), 0);
	}
	free(src);
	for (int i = 0; i < 4; i++)
		pids[i] = harness_fork(fan_child, i, f);
	harness_gate_open(&f->go, 4);
	CHECK_EQ(harness_wait(pids, 4, 60000, NULL), 0);
}

static int exiter(int idx, void *arg)
{
	kvb_client *c = harness_connect(br, "t_data_path-exiter", 0);
	uint32_t id;
	size_t pb;
	uint32_t ns = open_ns(c, "test/dp-kimi", 61, 1152, &pb);
	uint8_t *hb = kvb_buf_alloc_host(c, 64u << 20, &id);
	kvb_key key = harness_key(55, 1);

	(void)idx;
	(void)arg;
	CHECK(hb != NULL);
	harness_fill(hb, pb, &key, 55);
	CHECK_RC(kvb_put(c, ns, key, hb, pb), 0);
	_exit(0); /* no kvb_close(): the broker releases what we leave */
}

/* How many threads of pid run at this nice value (/proc/PID/task/TID/stat, field 19). */
static int threads_at_nice(pid_t pid, int nice)
{
	char path[320], line[1024];
	struct dirent *e;
	int n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	CHECK(d != NULL);
	while ((e = readdir(d))) {
		const char *p;
		FILE *f;
		int field, v;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/stat", (int)pid, e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue; /* the thread left */
		p = fgets(line, sizeof(line), f) ? strrchr(line, ')') : NULL;
		fclose(f);
		/* Fields after the comm: state is field 3, nice field 19. */
		for (field = 2; p && field < 19; field++)
			p = strchr(p + 1, ' ');
		if (p && sscanf(p, " %d", &v) == 1 && v == nice)
			n++;
	}
	closedir(d);
	return n;
}

static void test_exit_release(kvb_client *c)
{
	kvb_key key = harness_key(55, 1);
	pid_t pid = harness_fork(exiter, 0, NULL);
	size_t pb;
	uint32_t ns = open_ns(c, "test/dp-kimi", 61, 1152, &pb);
	uint8_t *dst = malloc(pb);
	kvb_client *c2;

	CHECK(dst != NULL);
	for (int i = 0; i < 200; i++)
		CHECK_OK(kvb_nop(c));
	CHECK_EQ(harness_wait(&pid, 1, 30000, NULL), 0);
	for (int i = 0; i < 200; i++)
		CHECK_OK(kvb_nop(c));
	CHECK_EQ(harness_stat_wait(c, "bg_jobs", 0, 20000), 0);
	/* Only from nice 0 ("nice make test" leaves every thread at 10 or more). */
	if (!getenv("KVB_BG_NICE") && getpriority(PRIO_PROCESS, 0) == 0)
		CHECK_EQ(threads_at_nice(br->pid, 10), 1);
	else
		harness_log("not at nice 0, or KVB_BG_NICE set: bg nice check skipped");
	CHECK_RC(kvb_get(c, ns, key, dst, pb), (long long)pb);
	CHECK(harness_verify(dst, pb, &key, 55, "exiter's page") == 0);
	free(dst);
	c2 = harness_connect(br, "t_data_path-after", 0);
	CHECK_OK(kvb_nop(c2));
	kvb_close(c2);
	CHECK(harness_broker_alive(br));
}

/* Every thread of pid onto cpu. */
static void pin_all(pid_t pid, int cpu)
{
	char path[64];
	cpu_set_t set;
	struct dirent *e;
	DIR *d;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	CHECK(d != NULL);
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			(void)sched_setaffinity((pid_t)atoi(e->d_name), sizeof(set), &set);
	closedir(d);
}

static void test_one_cpu(kvb_client *c)
{
	cpu_set_t set;
	int cpu;
	uint32_t id;
	size_t pb;
	uint32_t ns = open_ns(c, "test/dp-64k", 4, 256, &pb);
	uint8_t *hb = kvb_buf_alloc_host(c, 2 * pb, &id);
	uint64_t t0;

	CHECK(hb != NULL);
	CHECK_EQ(pb, 64u << 10);
	CHECK(sched_getaffinity(0, sizeof(set), &set) == 0);
	for (cpu = 0; cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &set); cpu++)
		;
	CHECK(cpu < CPU_SETSIZE);
	pin_all(getpid(), cpu);
	pin_all(br->pid, cpu);
	t0 = harness_now_ms();
	for (int i = 0; i < 300; i++) {
		kvb_key key = harness_key(99, (uint64_t)i);

		CHECK_OK(kvb_nop(c));
		harness_fill(hb, pb, &key, 99);
		CHECK_RC(kvb_put(c, ns, key, hb, pb), 0);
		CHECK_RC(kvb_get(c, ns, key, hb + pb, pb), (long long)pb);
		CHECK(harness_verify(hb + pb, pb, &key, 99, "one cpu") == 0);
	}
	harness_log("one CPU: 300 x (NOP, 64 KiB PUT, 64 KiB GET) in %llu ms",
		    (unsigned long long)(harness_now_ms() - t0));
	CHECK_OK(kvb_buf_unregister(c, id));
}

/* A client that read var=val when it connected (the library reads its knobs then). */
static kvb_client *connect_env(const char *name, const char *var, const char *val)
{
	kvb_client *c;

	setenv(var, val, 1);
	c = harness_connect(br, name, 0);
	unsetenv(var);
	return c;
}

int main(int argc, char **argv)
{
	kvb_client *c, *self, *hold, *workers;
	char *json;

	harness_init(argc, argv);
	br = harness_broker_start("--pool", "256M");
	c = harness_connect(br, "t_data_path", 0);

	test_prefault(c);
	test_copies(c, 1000);

	/* The client's own copy for GETs into its buffers, from 1 KiB pages up. */
	self = connect_env("t_data_path-self", "KVB_CLIENT_GET_SELF_KB", "1");
	test_copies(self, 2000);
	/* The RELEASEs are posted without waiting: the last one may still be on its way. */
	CHECK_EQ(harness_stat_wait(self, "leases", 0, 2000), 0);
	json = harness_stats(self);
	CHECK_GE(harness_stat_u64(json, "counters.gets"), 20);
	free(json);
	kvb_close(self);

	test_fan_out(c);
	/* The broker's copies: KVB_CLIENT_GET_SELF_KB=0 keeps 1 MiB GETs its own ([dir-few] off). */
	workers = connect_env("t_data_path-workers", "KVB_CLIENT_GET_SELF_KB", "0");
	test_batch_queue(workers);
	kvb_close(workers);
	test_dir_few(c);
	/* The broker's lease: a client without the directory asks it for every one ([hazard]). */
	hold = connect_env("t_data_path-hold", "KVB_CLIENT_DIR", "0");
	test_lease_hold(hold);
	kvb_close(hold);
	test_exit_release(c);
	test_one_cpu(c);
	kvb_close(c);
	harness_broker_stop(br);
	return 0;
}
