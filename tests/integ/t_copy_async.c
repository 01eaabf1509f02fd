// SPDX-License-Identifier: MIT
/*
 * t_copy_async.c - the asynchronous copy engine end to end: a broker whose host engine runs
 * every copy on a worker thread (--copy-inline 0), each copy made slow (--copy-delay-us), so
 * that ops really are in flight while other things happen. Host registered buffers stand in for
 * GPU memory: the view and page paths are the ones GPU buffers take, up to the engine.
 *
 *   - view PUT and GET across processes: one process stores pages from its per-layer KV
 *     buffers, another loads them into a differently laid out cache, byte-exact;
 *   - layer groups loaded in order ([0,2) then [2,4)), and a range past the deepest layer
 *     refused;
 *   - a PUT of a key whose PUT is still copying waits for it and completes EXISTED (parked),
 *     from the same client (one batch) and from four processes at once: one copy per page;
 *   - a buffer unregistered while a PUT copies from it: the PUT still completes and stores the
 *     right bytes (the broker unmaps it after the copy);
 *   - a client that dies with copies in flight: they finish (its PUTs are stored and readable),
 *     then its session goes, and no page stays pinned;
 *   - failed copies (a second broker with --copy-fail-every 2): a PUT whose copy failed
 *     completes -EIO and stores nothing, the PUT that waited for it runs again and stores the
 *     page itself; a GET whose copy failed completes -EIO and leaves nothing pinned.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define TPP 16
#define LAYERS 4
#define BPT 256
#define NSLOTS 512
#define NPAGES 24
#define SEED 4242
#define DELAY_US "10000"

static struct harness_broker *br;
static size_t pb;

struct cache {
	uint32_t view;
	uint8_t *buf[LAYERS];
	uint32_t stride;
};

static void open_ns(kvb_client *c, uint32_t *ns)
{
	struct kvb_layout l;

	harness_layout(&l, "test/copy-async", KVB_LAYOUT_MLA, TPP, 1, 0, LAYERS, BPT);
	CHECK_OK(kvb_ns_open(c, &l, ns, &pb));
	CHECK_EQ(pb, TPP * LAYERS * BPT);
}

/* One buffer per layer (as engines keep them), token slots stride bytes apart. */
static void make_cache(kvb_client *c, uint32_t ns, uint32_t stride, struct cache *k)
{
	struct kvb_view_part parts[LAYERS];

	k->stride = stride;
	for (int l = 0; l < LAYERS; l++) {
		parts[l].buf = 0;
		k->buf[l] = kvb_buf_alloc_host(c, (size_t)NSLOTS * stride, &parts[l].buf);
		CHECK(k->buf[l] != NULL);
		memset(k->buf[l], 0xee, (size_t)NSLOTS * stride);
		parts[l].stride = stride;
		parts[l].base = 0;
	}
	CHECK_OK(kvb_view_create(c, ns, parts, LAYERS, &k->view));
}

/* Writes page (key, seed) into slots [slot, slot + TPP) of a cache. */
static void write_page(struct cache *k, const kvb_key *key, uint64_t slot)
{
	for (int l = 0; l < LAYERS; l++)
		for (int t = 0; t < TPP; t++)
			for (int i = 0; i < BPT; i++)
				k->buf[l][(slot + t) * k->stride + i] = harness_byte(
					key, SEED, ((size_t)l * TPP + t) * BPT + i);
}

/* Checks layers [lf, lf + lc) of page (key, seed) in slots [slot, slot + TPP). */
static void check_page(const struct cache *k, const kvb_key *key, uint64_t slot, int lf, int lc,
		       const char *what)
{
	for (int l = lf; l < lf + lc; l++)
		for (int t = 0; t < TPP; t++)
			for (int i = 0; i < BPT; i++) {
				uint8_t got = k->buf[l][(slot + t) * k->stride + i];
				uint8_t want = harness_byte(key, SEED,
							    ((size_t)l * TPP + t) * BPT + i);

				CHECKF(got == want,
				       "%s: key %s layer %d token %d byte %d: got 0x%02x want "
				       "0x%02x",
				       what, harness_key_str(key), l, t, i, got, want);
			}
}

static kvb_key key_of(int i)
{
	return harness_key(SEED, (uint64_t)i);
}

static struct harness_gate stored;
static int *puts_new; /* shared: PUTs that returned 0, per key */

/* Child 0 stores NPAGES pages from its cache; child 1 loads them into another layout. */
static int cross_process(int idx, void *arg)
{
	kvb_client *c = harness_connect(br, idx ? "loader" : "storer", 0);
	struct cache k;
	uint32_t ns;

	(void)arg;
	open_ns(c, &ns);
	if (idx == 0) {
		make_cache(c, ns, BPT, &k);
		for (int i = 0; i < NPAGES; i++) {
			kvb_key key = key_of(i);

			write_page(&k, &key, (uint64_t)i * TPP);
		}
		for (int i = 0; i < NPAGES; i++)
			CHECK_RC(kvb_view_put(c, k.view, key_of(i), (uint64_t)i * TPP), 0);
		harness_gate_open(&stored, 1);
	} else {
		kvb_key k2;

		make_cache(c, ns, BPT + 64, &k);
		harness_gate_wait(&stored, 60000);
		for (int i = 0; i < NPAGES; i++) {
			uint64_t slot = (uint64_t)(NPAGES - 1 - i) * TPP;

			k2 = key_of(i);
			CHECK_RC(kvb_view_get(c, k.view, k2, slot, 0, 2), (long long)pb);
			check_page(&k, &k2, slot, 0, 2, "layers [0,2)");
			CHECK_RC(kvb_view_get(c, k.view, k2, slot, 2, 2), (long long)pb);
			check_page(&k, &k2, slot, 0, LAYERS, "layers [0,2) + [2,4)");
		}
		CHECK_RC(kvb_view_get(c, k.view, key_of(0), 0, 3, 2), -EINVAL);
	}
	kvb_close(c);
	return 0;
}

/* Four processes PUT the same pages at once: one copy each, the others EXISTED. */
static int same_keys(int idx, void *arg)
{
	kvb_client *c = harness_connect(br, "rank", 0);
	struct cache k;
	uint32_t ns;

	(void)arg;
	open_ns(c, &ns);
	make_cache(c, ns, BPT, &k);
	for (int i = 0; i < 8; i++) {
		kvb_key key = key_of(1000 + i);

		write_page(&k, &key, (uint64_t)i * TPP);
	}
	harness_gate_wait(&stored, 60000);
	for (int i = 0; i < 8; i++) {
		int rc = kvb_view_put(c, k.view, key_of(1000 + i), (uint64_t)i * TPP);

		CHECKF(rc == 0 || rc == 1, "rank %d put %d: %d (%s)", idx, i, rc,
		       harness_strerror(rc));
		if (rc == 0)
			__atomic_fetch_add(&puts_new[i], 1, __ATOMIC_RELAXED);
	}
	kvb_close(c);
	return 0;
}

/* Submits PUTs of new keys and GETs, then dies without reaping. */
static int dies_mid_copy(int idx, void *arg)
{
	kvb_client *c = harness_connect(br, "doomed", 0);
	struct kvb_op ops[16];
	uint32_t ns, buf;
	uint64_t q0;
	uint8_t *mem;

	(void)idx, (void)arg;
	open_ns(c, &ns);
	mem = kvb_buf_alloc_host(c, 16 * pb, &buf);
	CHECK(mem != NULL);
	memset(ops, 0, sizeof(ops));
	for (int i = 0; i < 16; i++) {
		kvb_key key = key_of(2000 + i);

		ops[i].opcode = i < 8 ? KVB_OP_PUT : KVB_OP_GET;
		ops[i].ns = ns;
		ops[i].buf = buf;
		ops[i].off = (uint64_t)i * pb;
		ops[i].key = i < 8 ? key : key_of(i);
		if (i < 8)
			harness_fill(mem + i * pb, pb, &key, SEED);
	}
	q0 = harness_stat(c, "copy.queued_jobs");
	CHECK_RC(kvb_submit(c, ops, 16), 16);
	/* Dies once the broker took them all: the first copying, the rest queued behind it. */
	CHECK_EQ(harness_stat_wait(c, "copy.queued_jobs", q0 + 16, 10000), q0 + 16);
	CHECK_GE(harness_stat(c, "copy.inflight"), 1);
	_exit(0);
}

int main(int argc, char **argv)
{
	struct kvb_completion comp[4];
	struct kvb_op ops[2];
	kvb_client *c;
	uint32_t ns, buf;
	uint8_t *mem, *out;
	pid_t pid;
	int st;

	harness_init(argc, argv);
	br = harness_broker_start("--pool", "64M", "--no-directory", "--copy-inline", "0",
				  "--copy-threads", "1", "--copy-delay-us", DELAY_US);
	c = harness_connect(br, "t_copy_async", 0);
	open_ns(c, &ns);
	CHECK(harness_broker_log_has(br, "GPU copies off"));

	harness_log("view PUT/GET across processes, layer groups in order");
	harness_gate_init(&stored);
	CHECK_EQ(harness_run_children(2, cross_process, NULL, 60000), 0);
	CHECK_GE(harness_stat(c, "copy.queued_jobs"), 3 * NPAGES);
	CHECK_EQ(harness_stat(c, "copy.inline_jobs"), 0);

	harness_log("a PUT of a key being written waits for it (one batch)");
	out = malloc(pb);
	mem = kvb_buf_alloc_host(c, 2 * pb, &buf);
	CHECK(mem && out);
	{
		kvb_key key = key_of(500);
		size_t hits = 0;

		harness_fill(mem, pb, &key, SEED);
		memset(ops, 0, sizeof(ops));
		for (int i = 0; i < 2; i++) {
			ops[i] = (struct kvb_op){.opcode = KVB_OP_PUT,
						 .ns = ns,
						 .buf = buf,
						 .key = key,
						 .user_data = (uint64_t)i + 1};
		}
		CHECK_RC(kvb_submit(c, ops, 2), 2);
		CHECK_RC(kvb_reap(c, comp, 2, 2, 10000), 2);
		for (int i = 0; i < 2; i++) {
			CHECK_EQ(comp[i].res, 0);
			CHECK_EQ(comp[i].flags, comp[i].user_data == 1 ? 0 : KVB_CQEF_EXISTED);
		}
		CHECK_EQ(harness_stat(c, "copy.parked_puts"), 1);
		CHECK_OK(kvb_lookup(c, ns, &key, 1, &hits));
		CHECK_EQ(hits, 1);
	}

	harness_log("four ranks PUT the same pages at once");
	puts_new = harness_shared(8 * sizeof(int));
	harness_gate_init(&stored);
	{
		pid_t pids[4];
		uint64_t pages0 = harness_stat(c, "pool.pages");

		for (int i = 0; i < 4; i++)
			pids[i] = harness_fork(same_keys, i, NULL);
		harness_gate_open(&stored, 4);
		CHECK_EQ(harness_wait(pids, 4, 60000, NULL), 0);
		for (int i = 0; i < 8; i++)
			CHECK_EQ(puts_new[i], 1);
		CHECK_EQ(harness_stat(c, "pool.pages"), pages0 + 8);
	}

	harness_log("a buffer unregistered while PUTs copy from it");
	{
		struct kvb_op four[4];
		struct kvb_completion c4[4];
		uint64_t puts0 = harness_stat(c, "counters.puts");
		uint32_t b2;
		uint8_t *m2 = kvb_buf_alloc_host(c, 4 * pb, &b2);

		CHECK(m2 != NULL);
		for (int i = 0; i < 4; i++) {
			kvb_key key = key_of(600 + i);

			harness_fill(m2 + i * pb, pb, &key, SEED);
			four[i] = (struct kvb_op){.opcode = KVB_OP_PUT,
						  .ns = ns,
						  .buf = b2,
						  .key = key,
						  .off = i * pb,
						  .user_data = 77};
		}
		CHECK_RC(kvb_submit(c, four, 4), 4);
		/* The ring and the socket are not ordered: wait until the broker took them. */
		CHECK_EQ(harness_stat_wait(c, "counters.puts", puts0 + 4, 5000), puts0 + 4);
		CHECK_OK(kvb_buf_unregister(c, b2));
		CHECK_RC(kvb_reap(c, c4, 4, 4, 10000), 4);
		for (int i = 0; i < 4; i++) {
			kvb_key key = key_of(600 + i);

			CHECK_EQ(c4[i].res, 0);
			CHECK_RC(kvb_get(c, ns, key, out, pb), (long long)pb);
			CHECK(harness_verify(out, pb, &key, SEED,
					     "put from an unregistered buffer") == 0);
		}
	}

	harness_log("a client dies with copies in flight");
	pid = harness_fork(dies_mid_copy, 0, NULL);
	CHECK_EQ(harness_wait(&pid, 1, 30000, &st), 0);
	CHECK_EQ(harness_stat_wait(c, "copy.inflight", 0, 20000), 0);
	CHECK_EQ(harness_stat_wait(c, "clients", 1, 20000), 1);
	CHECK_EQ(harness_stat_wait(c, "copy.sessions_draining", 0, 20000), 0);
	CHECK_EQ(harness_stat(c, "pool.pinned_pages"), 0);
	for (int i = 0; i < 8; i++) {
		kvb_key key = key_of(2000 + i);

		CHECK_RC(kvb_get(c, ns, key, out, pb), (long long)pb);
		CHECK(harness_verify(out, pb, &key, SEED, "page put by a client that died") == 0);
	}
	CHECK(harness_broker_alive(br));
	CHECK_EQ(harness_stat(c, "copy.errors"), 0);

	kvb_close(c);
	harness_broker_stop(br);

	harness_log("failed copies: every second worker copy fails");
	br = harness_broker_start("--pool", "16M", "--no-directory", "--copy-inline", "0",
				  "--copy-threads", "1", "--copy-delay-us", DELAY_US,
				  "--copy-fail-every", "2");
	c = harness_connect(br, "t_copy_async-fail", 0);
	open_ns(c, &ns);
	mem = kvb_buf_alloc_host(c, pb, &buf);
	CHECK(mem != NULL);
	{
		kvb_key key = key_of(700);

		/* Copy 1 works. */
		CHECK_RC(kvb_put(c, ns, key_of(701), mem, pb), 0);
		harness_fill(mem, pb, &key, SEED);
		/* Copy 2 (the writer) fails; the parked PUT runs again: copy 3, which works. */
		for (int i = 0; i < 2; i++)
			ops[i] = (struct kvb_op){.opcode = KVB_OP_PUT,
						 .ns = ns,
						 .buf = buf,
						 .key = key,
						 .user_data = (uint64_t)i + 1};
		CHECK_RC(kvb_submit(c, ops, 2), 2);
		CHECK_RC(kvb_reap(c, comp, 2, 2, 10000), 2);
		for (int i = 0; i < 2; i++) {
			CHECK_EQ(comp[i].res, comp[i].user_data == 1 ? -EIO : 0);
			CHECK_EQ(comp[i].flags, 0);
		}
		CHECK_EQ(harness_stat(c, "copy.parked_puts"), 1);
		CHECK_EQ(harness_stat(c, "pool.pages"), 2);
		/* Copy 4 fails, copy 5 works. */
		memset(mem, 0, pb);
		CHECK_RC(kvb_get(c, ns, key, mem, pb), -EIO);
		CHECK_EQ(harness_stat(c, "pool.pinned_pages"), 0);
		CHECK_RC(kvb_get(c, ns, key, mem, pb), (long long)pb);
		CHECK(harness_verify(mem, pb, &key, SEED, "page stored by the re-run PUT") == 0);
		CHECK_EQ(harness_stat(c, "copy.errors"), 2);
		CHECK_EQ(harness_stat(c, "counters.errors"), 2);
	}
	free(out);
	kvb_close(c);
	harness_broker_stop(br);
	return H_PASS;
}
