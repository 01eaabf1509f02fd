// SPDX-License-Identifier: MIT
/*
 * t_put_fill.c - filled PUTs (KVB_SQEF_FILL, ABI 1.4): kvb_put() from plain memory
 * posts its PUT first and copies into staging while the broker copies out of it, asking first.
 *   - Byte-exact under concurrent readers: two writers PUT the same 1 MiB and 64 KiB pages in
 *     opposite orders while two readers GET them (plain and registered memory); every GET that
 *     finds a page finds all of it, and each page was copied into the pool exactly once.
 *   - Ask-first: a PUT of a stored page completes EXISTED with nothing copied by the broker
 *     (copy.fill_existed up, copy.fill_bytes and bytes_in unchanged); eight ranks PUTting one
 *     fresh page at once store it once: one of them returns 0, the rest 1, bytes_in one page.
 *   - A client killed mid-PUT leaves nothing served: one dies of SIGSEGV inside its staging
 *     copy (the second half of its source is PROT_NONE), a raw client publishes half its fill
 *     and hangs up; either way the key misses, and a later PUT stores it (0, not EXISTED).
 *   - A fill that stops moving is given up (-EAGAIN, copy.fill_gaveup) and nothing is served
 *     meanwhile; a fill word past the page or going backwards reads nothing past the page; the
 *     fill-stop word names the filled PUT it stops, counted over every KVB_SQEF_FILL SQE.
 *   - [fill-ring] 200 distinct 64 KiB pages round the library's ring of staging slots, in
 *     both kinds of stores: each filled whole and read back exactly.
 *   - The flag only on PUT, never with KVB_OPF_VIEW (-EINVAL).
 *   - PUT racing DELETE and eviction (a pool of 64 MiB, 96 keys of 1 MiB): GETs find whole pages or
 *     none, PUTs succeed.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define SEED 1919
#define BIG (1u << 20)
#define SMALL (64u << 10)
#define NPAGES 12

struct shared {
	_Atomic int stop;
	_Atomic uint64_t found, exact, missed, bad;
	_Atomic int rc[8];
	struct harness_gate go;
};

static struct harness_broker *br;
static struct shared *sh;

static uint32_t open_ns(kvb_client *c, uint32_t page, size_t *pb)
{
	struct kvb_layout l;
	uint32_t ns;

	/* 64 tokens x 16 layers x 1 KiB = 1 MiB; 16 tokens x 4 layers x 1 KiB = 64 KiB. */
	if (page == BIG)
		harness_layout(&l, "test/fill-big", KVB_LAYOUT_MLA, 64, 1, 0, 16, 1024);
	else
		harness_layout(&l, "test/fill-small", KVB_LAYOUT_MLA, 16, 1, 0, 4, 1024);
	CHECK_OK(kvb_ns_open(c, &l, &ns, pb));
	CHECK_EQ(*pb, page);
	return ns;
}

static kvb_client *connect_as(const char *name)
{
	return harness_connect(br, name, 0);
}

/* ---- byte-exact under concurrent readers ---- */

static int writer(int idx, void *arg)
{
	kvb_client *c = connect_as(idx ? "writer1" : "writer0");
	size_t pb[2];
	uint32_t ns[2] = {open_ns(c, BIG, &pb[0]), open_ns(c, SMALL, &pb[1])};
	uint8_t *src = malloc(BIG);

	(void)arg;
	CHECK(src != NULL);
	harness_gate_wait(&sh->go, 10000);
	for (int i = 0; i < 2 * NPAGES; i++) {
		int j = idx ? 2 * NPAGES - 1 - i : i, s = j % 2;
		kvb_key k = harness_key(SEED + (uint64_t)s, (uint64_t)j);
		int rc;

		harness_fill(src, pb[s], &k, SEED);
		rc = kvb_put(c, ns[s], k, src, pb[s]);
		CHECKF(rc == 0 || rc == 1, "writer %d: put %d: %s", idx, j, harness_strerror(rc));
	}
	free(src);
	kvb_close(c);
	return 0;
}

static int reader(int idx, void *arg)
{
	kvb_client *c = connect_as(idx ? "reader1" : "reader0");
	size_t pb[2];
	uint32_t ns[2] = {open_ns(c, BIG, &pb[0]), open_ns(c, SMALL, &pb[1])}, hid;
	uint8_t *plain = malloc(BIG), *reg = kvb_buf_alloc_host(c, BIG, &hid);

	(void)arg;
	CHECK(plain && reg);
	harness_gate_wait(&sh->go, 10000);
	for (uint64_t n = 0; !sh->stop || n % (2 * NPAGES); n++) {
		int j = (int)(n % (2 * NPAGES)), s = j % 2;
		kvb_key k = harness_key(SEED + (uint64_t)s, (uint64_t)j);
		uint8_t *dst = (n / (2 * NPAGES)) % 2 ? reg : plain;
		int rc = kvb_get(c, ns[s], k, dst, pb[s]);

		if (rc == -ENOENT) {
			sh->missed++;
			continue;
		}
		CHECKF(rc == (int)pb[s], "reader %d: get %d: %s", idx, j, harness_strerror(rc));
		sh->found++;
		if (harness_verify(dst, pb[s], &k, SEED, "GET during filled PUTs"))
			sh->bad++;
		else
			sh->exact++;
	}
	free(plain);
	kvb_close(c);
	return 0;
}

static void test_concurrent(kvb_client *c)
{
	uint64_t in0 = harness_stat(c, "counters.bytes_in"),
		 fills0 = harness_stat(c, "copy.fill_puts");
	uint8_t *dst = malloc(BIG);
	pid_t pids[4];
	size_t pb[2];
	uint32_t ns[2] = {open_ns(c, BIG, &pb[0]), open_ns(c, SMALL, &pb[1])};

	CHECK(dst != NULL);
	harness_gate_init(&sh->go);
	pids[0] = harness_fork(writer, 0, NULL);
	pids[1] = harness_fork(writer, 1, NULL);
	pids[2] = harness_fork(reader, 0, NULL);
	pids[3] = harness_fork(reader, 1, NULL);
	harness_gate_open(&sh->go, 4);
	CHECK_EQ(harness_wait(pids, 2, 60000, NULL), 0);
	sh->stop = 1;
	CHECK_EQ(harness_wait(pids + 2, 2, 60000, NULL), 0);
	CHECK_EQ(sh->bad, 0);
	harness_log("readers: %llu pages exact, %llu misses", (unsigned long long)sh->exact,
		    (unsigned long long)sh->missed);
	for (int j = 0; j < 2 * NPAGES; j++) {
		int s = j % 2;
		kvb_key k = harness_key(SEED + (uint64_t)s, (uint64_t)j);

		CHECK_RC(kvb_get(c, ns[s], k, dst, pb[s]), pb[s]);
		CHECK(harness_verify(dst, pb[s], &k, SEED, "GET after filled PUTs") == 0);
	}
	/* Two writers, each page into the pool once: the other's PUT asked first. */
	CHECK_EQ(harness_stat(c, "counters.bytes_in") - in0, NPAGES * (uint64_t)(BIG + SMALL));
	CHECK_GE(harness_stat(c, "copy.fill_puts") - fills0, 2 * NPAGES);
	free(dst);
}

/* ---- ask-first ---- */

static int rank(int idx, void *arg)
{
	char name[16];
	kvb_client *c;
	size_t pb;
	uint32_t ns;
	uint8_t *src = malloc(BIG);
	kvb_key k = harness_key(SEED + 8, 0);

	(void)arg;
	snprintf(name, sizeof(name), "rank%d", idx);
	c = connect_as(name);
	ns = open_ns(c, BIG, &pb);
	CHECK(src != NULL);
	harness_fill(src, BIG, &k, SEED);
	harness_gate_wait(&sh->go, 10000);
	sh->rc[idx] = kvb_put(c, ns, k, src, BIG);
	free(src);
	kvb_close(c);
	return 0;
}

static void test_ask_first(kvb_client *c)
{
	kvb_client *o = connect_as("other");
	uint8_t *src = malloc(BIG);
	size_t pb;
	uint32_t ns = open_ns(c, BIG, &pb), ons = open_ns(o, BIG, &pb);
	kvb_key k = harness_key(SEED + 7, 0);
	uint64_t existed, fbytes, in;
	int zeros = 0;

	CHECK(src != NULL);
	harness_fill(src, BIG, &k, SEED);
	CHECK_RC(kvb_put(c, ns, k, src, BIG), 0);
	existed = harness_stat(c, "copy.fill_existed");
	fbytes = harness_stat(c, "copy.fill_bytes");
	in = harness_stat(c, "counters.bytes_in");
	CHECK_RC(kvb_put(o, ons, k, src, BIG), 1);
	CHECK_EQ(harness_stat(c, "copy.fill_existed"), existed + 1);
	CHECK_EQ(harness_stat(c, "copy.fill_bytes"), fbytes);
	CHECK_EQ(harness_stat(c, "counters.bytes_in"), in);
	kvb_close(o);

	/* Eight ranks, one fresh page, all at once. */
	in = harness_stat(c, "counters.bytes_in");
	harness_gate_init(&sh->go);
	{
		pid_t pids[8];

		for (int i = 0; i < 8; i++)
			pids[i] = harness_fork(rank, i, NULL);
		harness_gate_open(&sh->go, 8);
		CHECK_EQ(harness_wait(pids, 8, 60000, NULL), 0);
	}
	for (int i = 0; i < 8; i++) {
		CHECKF(sh->rc[i] == 0 || sh->rc[i] == 1, "rank %d: %s", i,
		       harness_strerror(sh->rc[i]));
		zeros += !sh->rc[i];
	}
	CHECK_EQ(zeros, 1);
	CHECK_EQ(harness_stat(c, "counters.bytes_in") - in, BIG);
	harness_log("8 ranks: one stored, 7 EXISTED; %llu filled PUTs asked first",
		    (unsigned long long)(harness_stat(c, "copy.fill_existed") - existed));
	free(src);
}

/* ---- [fill-ring] ---- */

/*
 * 64 KiB pages go round the library's ring of staging slots (2 x L2: 32 slots with a 1 MiB
 * L2, 64 with 2 MiB), in plain or streaming stores by what each kind was measured to cost; one
 * PUT in 64 takes the other kind. 200 distinct pages from one plain buffer wrap the ring and
 * take both kinds; each was filled (the broker copied all of it) and reads back exactly.
 */
static void test_ring(kvb_client *c)
{
	kvb_client *w = connect_as("ring");
	uint8_t *src = malloc(SMALL), *dst = malloc(SMALL);
	size_t pb;
	uint32_t ns = open_ns(w, SMALL, &pb), rns = open_ns(c, SMALL, &pb);
	uint64_t puts = harness_stat(c, "copy.fill_puts"),
		 fbytes = harness_stat(c, "copy.fill_bytes");

	CHECK(src && dst);
	for (uint64_t i = 0; i < 200; i++) {
		kvb_key k = harness_key(SEED + 9, i);

		harness_fill(src, SMALL, &k, SEED);
		CHECK_RC(kvb_put(w, ns, k, src, SMALL), 0);
	}
	CHECK_EQ(harness_stat(c, "copy.fill_puts") - puts, 200);
	CHECK_EQ(harness_stat(c, "copy.fill_bytes") - fbytes, 200ull * SMALL);
	for (uint64_t i = 0; i < 200; i++) {
		kvb_key k = harness_key(SEED + 9, i);

		memset(dst, 0, SMALL);
		CHECK_RC(kvb_get(c, rns, k, dst, SMALL), (int)SMALL);
		CHECK(!harness_verify(dst, SMALL, &k, SEED, "a PUT through the staging ring"));
	}
	kvb_close(w);
	free(src);
	free(dst);
}

/* ---- killed mid-PUT ---- */

static int dies_mid_put(int idx, void *arg)
{
	struct rlimit no_core = {0, 0};
	kvb_client *c = connect_as("dies");
	size_t pb;
	uint32_t ns = open_ns(c, BIG, &pb);
	kvb_key k = harness_key(SEED + 9, 0);
	uint8_t *src = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	(void)idx;
	(void)arg;
	setrlimit(RLIMIT_CORE, &no_core);
	CHECK(src != MAP_FAILED);
	harness_fill(src, BIG, &k, SEED);
	CHECK_OK(mprotect(src + BIG / 2, BIG / 2, PROT_NONE));
	signal(SIGSEGV, SIG_DFL);
	kvb_put(c, ns, k, src, BIG); /* faults halfway through its staging copy */
	return 3;
}

/* After a writer died mid-PUT: the key misses, and a PUT now stores it. */
static void check_not_served(kvb_client *c, uint32_t ns, kvb_key k)
{
	uint8_t *buf = malloc(BIG);
	size_t hits = 9;

	CHECK(buf != NULL);
	CHECK_RC(kvb_get(c, ns, k, buf, BIG), -ENOENT);
	CHECK_OK(kvb_lookup(c, ns, &k, 1, &hits));
	CHECK_EQ(hits, 0);
	harness_fill(buf, BIG, &k, SEED);
	CHECK_RC(kvb_put(c, ns, k, buf, BIG), 0);
	memset(buf, 0, BIG);
	CHECK_RC(kvb_get(c, ns, k, buf, BIG), BIG);
	CHECK(harness_verify(buf, BIG, &k, SEED, "PUT after a writer died") == 0);
	free(buf);
}

static void test_killed(kvb_client *c)
{
	size_t pb;
	uint32_t ns = open_ns(c, BIG, &pb);
	uint64_t disc = harness_stat(c, "counters.disconnects");
	int st;
	pid_t pid = harness_fork(dies_mid_put, 0, NULL);

	harness_wait(&pid, 1, 30000, &st);
	CHECKF(st && st != 3, "the child did not die mid-PUT: %d", st); /* ASan exits 1 */
	CHECK_EQ(harness_stat_wait(c, "counters.disconnects", disc + 1, 5000), disc + 1);
	check_not_served(c, ns, harness_key(SEED + 9, 0));
}

/* ---- the raw protocol: half a fill then a hang-up, stalls, hostile words, the stop word ---- */

struct raw {
	struct harness_raw r;
	uint32_t ns, buf;
	uint8_t *map;
	kvb_atomic_u32 *fill, *stop;
};

static void raw_open(struct raw *w)
{
	struct kvb_layout l;
	uint64_t pb;

	memset(w, 0, sizeof(*w));
	harness_layout(&l, "test/fill-big", KVB_LAYOUT_MLA, 64, 1, 0, 16, 1024);
	CHECK_OK(harness_raw_hello(&w->r, br->sock, KVB_ABI_MAJOR, 8));
	CHECK_OK(harness_raw_ns_open(&w->r, &l, &w->ns, &pb));
	CHECK_EQ(pb, BIG);
	CHECK_OK(harness_raw_buf_reg(&w->r, BIG, &w->buf, (void **)&w->map));
	w->fill = harness_raw_word(&w->r, KVB_REGION_FILL);
	w->stop = harness_raw_word(&w->r, KVB_REGION_FILL_STOP);
}

static void raw_put(struct raw *w, kvb_key k, uint8_t flags, uint8_t opcode)
{
	struct kvb_sqe sqe = {.opcode = opcode, .flags = flags, .ns = w->ns, .buf = w->buf};

	memcpy(sqe.key, k.b, sizeof(sqe.key));
	CHECK_EQ(harness_raw_submit(&w->r, &sqe, 1), 1);
}

static struct kvb_cqe raw_reap(struct raw *w, int timeout_ms)
{
	struct kvb_cqe cqe;

	CHECK_EQ(harness_raw_reap(&w->r, &cqe, 1, 1, timeout_ms), 1);
	return cqe;
}

static void test_raw(kvb_client *c)
{
	size_t pb;
	uint32_t ns = open_ns(c, BIG, &pb);
	uint64_t waits, gaveup;
	uint8_t *buf = malloc(BIG);
	struct kvb_cqe cqe;
	struct raw w;
	kvb_key k;

	CHECK(buf != NULL);
	/* Half a fill, then the client goes. */
	raw_open(&w);
	k = harness_key(SEED + 10, 0);
	harness_fill(w.map, BIG / 2, &k, SEED);
	kvb_store_release(w.fill, BIG / 2);
	waits = harness_stat(c, "copy.fill_waits");
	raw_put(&w, k, KVB_SQEF_FILL, KVB_OP_PUT);
	/* The broker copied the half and waits for the rest (well before FILL_GIVE_UP). */
	for (int i = 0; i < 50 && harness_stat(c, "copy.fill_waits") == waits; i++)
		usleep(1000);
	CHECK_GT(harness_stat(c, "copy.fill_waits"), waits);
	CHECK_RC(kvb_get(c, ns, k, buf, BIG), -ENOENT); /* WRITING: never served */
	harness_raw_close(&w.r);
	CHECK_EQ(harness_stat_wait(c, "clients", 1, 5000), 1);
	check_not_served(c, ns, k);

	/* A fill that stops: given up, nothing served meanwhile. */
	gaveup = harness_stat(c, "copy.fill_gaveup");
	raw_open(&w);
	k = harness_key(SEED + 11, 0);
	kvb_store_release(w.fill, 4096);
	raw_put(&w, k, KVB_SQEF_FILL, KVB_OP_PUT);
	CHECK_RC(kvb_get(c, ns, k, buf, BIG), -ENOENT);
	cqe = raw_reap(&w, 5000);
	CHECK_RC(cqe.res, -EAGAIN);
	CHECK_EQ(harness_stat(c, "copy.fill_gaveup"), gaveup + 1);
	CHECK_RC(kvb_get(c, ns, k, buf, BIG), -ENOENT);
	CHECK_EQ(kvb_load_relaxed(w.stop), 0); /* nothing was stopped */

	/* A fill word past the page (and then backwards): the page, and nothing past it. */
	k = harness_key(SEED + 12, 0);
	harness_fill(w.map, BIG, &k, SEED);
	kvb_store_release(w.fill, 0);
	raw_put(&w, k, KVB_SQEF_FILL, KVB_OP_PUT);
	kvb_store_release(w.fill, BIG / 4);
	usleep(2000);
	kvb_store_release(w.fill, 4096);
	usleep(2000);
	kvb_store_release(w.fill, UINT32_MAX);
	cqe = raw_reap(&w, 5000);
	if (cqe.res == -EAGAIN) {
		/* We were descheduled past FILL_GIVE_UP between two stores (a loaded machine). */
		harness_log("hostile fill word: given up, not checked");
	} else {
		CHECK_RC(cqe.res, 0);
		CHECK_RC(kvb_get(c, ns, k, buf, BIG), BIG);
		CHECK(harness_verify(buf, BIG, &k, SEED, "PUT with a hostile fill word") == 0);
	}

	/* Stored: EXISTED at once, and the stop word names it (the 3rd filled PUT here). */
	harness_fill(buf, BIG, &k, SEED);
	CHECK_GE(kvb_put(c, ns, k, buf, BIG), 0);
	kvb_store_release(w.fill, 0);
	raw_put(&w, k, KVB_SQEF_FILL, KVB_OP_PUT);
	cqe = raw_reap(&w, 5000);
	CHECK_RC(cqe.res, 0);
	CHECK(cqe.flags & KVB_CQEF_EXISTED);
	CHECK_EQ(kvb_load_acquire(w.stop), 3);

	/* Refused shapes count in the numbering too. */
	raw_put(&w, k, KVB_SQEF_FILL, KVB_OP_GET);
	CHECK_RC(raw_reap(&w, 5000).res, -EINVAL);
	raw_put(&w, k, KVB_SQEF_FILL | KVB_OPF_VIEW, KVB_OP_PUT);
	CHECK_RC(raw_reap(&w, 5000).res, -EINVAL);
	raw_put(&w, k, KVB_SQEF_FILL, KVB_OP_PUT);
	cqe = raw_reap(&w, 5000);
	CHECK(cqe.flags & KVB_CQEF_EXISTED);
	CHECK_EQ(kvb_load_acquire(w.stop), 6);
	harness_raw_close(&w.r);
	free(buf);
}

/* ---- PUT racing DELETE and eviction ---- */

#define RACE_KEYS 96

static int racer(int idx, void *arg)
{
	kvb_client *c = connect_as("racer");
	size_t pb;
	uint32_t ns = open_ns(c, BIG, &pb);
	uint8_t *buf = malloc(BIG);
	uint64_t end = harness_now_ms() + 1500;

	(void)arg;
	CHECK(buf != NULL);
	harness_gate_wait(&sh->go, 10000);
	for (uint64_t n = (uint64_t)idx * 7; harness_now_ms() < end; n++) {
		kvb_key k = harness_key(SEED + 20, n % RACE_KEYS);
		int rc;

		switch (idx) {
		case 0: /* writer */
		case 1:
			harness_fill(buf, BIG, &k, SEED);
			rc = kvb_put(c, ns, k, buf, BIG);
			CHECKF(rc == 0 || rc == 1, "put: %s", harness_strerror(rc));
			break;
		case 2: /* deleter */
			rc = kvb_delete(c, ns, k);
			CHECKF(rc == 0 || rc == -ENOENT, "delete: %s", harness_strerror(rc));
			break;
		default: /* reader */
			rc = kvb_get(c, ns, k, buf, BIG);
			if (rc == -ENOENT)
				break;
			CHECKF(rc == BIG, "get: %s", harness_strerror(rc));
			if (harness_verify(buf, BIG, &k, SEED, "GET racing PUT and DELETE"))
				sh->bad++;
			else
				sh->exact++;
		}
	}
	free(buf);
	kvb_close(c);
	return 0;
}

static void test_race(void)
{
	sh->bad = sh->exact = 0;
	harness_gate_init(&sh->go);
	{
		pid_t pids[4];

		for (int i = 0; i < 4; i++)
			pids[i] = harness_fork(racer, i, NULL);
		harness_gate_open(&sh->go, 4);
		CHECK_EQ(harness_wait(pids, 4, 60000, NULL), 0);
	}
	CHECK_EQ(sh->bad, 0);
	harness_log("race: %llu pages read exact", (unsigned long long)sh->exact);
}

int main(int argc, char **argv)
{
	kvb_client *c;

	harness_init(argc, argv);
	/* The race's 96 MiB of keys evict; the other parts stay below it. */
	br = harness_broker_start("--pool", "64M");
	sh = harness_shared(sizeof(*sh));
	c = connect_as("t_put_fill");
	test_concurrent(c);
	test_ask_first(c);
	test_ring(c);
	test_killed(c);
	test_raw(c);
	test_race();
	kvb_close(c);
	harness_broker_stop(br);
	return H_PASS;
}
