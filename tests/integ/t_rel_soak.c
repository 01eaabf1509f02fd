// SPDX-License-Identifier: MIT
/*
 * t_rel_soak.c - promise 10 (docs/reliability.md): correct under load, for a long time.
 *
 * For $KVB_SOAK_SECONDS (60 in make test, 5 under the sanitizers, DURATION under make soak) six
 * client processes hammer a small pool (64 MiB for ~150 MiB of distinct pages, so eviction
 * never stops) with every data path: PUT from private memory (staging) and from a registered
 * buffer, GET, view PUT and view GET (the view's parts laid out so that a slot is a page
 * image), async batches of GETs, ACQUIRE (the lease re-verified after a pause, while others
 * delete and evict around it), DELETE, LOOKUP. Keys are (id, version): every page's bytes are
 * a pure function of its key, so every read is verified, whichever writer stored it and
 * however often it was deleted, evicted and stored again. Checked: 0 mismatches, 0 unexpected
 * errors, the broker never dies, its anonymous memory and fd count flat from the first tenth of
 * the run to the end, and leases and pins back to 0 when the clients are gone.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reliab.h"

#define NCLI 6
#define NIDS 600
#define NVER 4
#define SEED 1010
#define TPP 16
#define LAYERS 4
#define BPT 1024 /* page: 16 tokens x 4 layers x 1 KiB = 64 KiB */

struct shared {
	char sock[108];
	_Atomic int stop;
	_Atomic uint64_t ops, reads_verified, mismatches, errors, enoent;
	struct harness_gate ready;
};

static struct shared *sh;

static kvb_key key_of(uint64_t id, uint64_t ver)
{
	return harness_key(SEED + ver, id);
}

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void bad(int rc, const char *what)
{
	if (rc < 0 && rc != -ENOENT && rc != -ENOSPC) {
		printf("%s: %d (%s)\n", what, rc, harness_strerror(rc));
		sh->errors++;
	}
}

static void verify(const void *p, size_t len, const kvb_key *k, const char *what)
{
	if (harness_verify(p, len, k, SEED, what))
		sh->mismatches++;
	else
		sh->reads_verified++;
}

static int worker(int idx, void *arg)
{
	char name[32];
	struct kvb_opts o = {.socket_path = sh->sock, .name = name, .sq_entries = 64};
	struct kvb_layout l;
	struct kvb_view_part parts[LAYERS];
	kvb_client *c;
	uint32_t ns, bid, view;
	size_t pb;
	uint8_t *reg, *priv;
	uint64_t s = (uint64_t)idx * 7919 + 3;

	(void)arg;
	snprintf(name, sizeof(name), "soak-%d", idx);
	CHECK_OK(kvb_connect(&o, &c));
	harness_layout(&l, "test/soak", KVB_LAYOUT_MLA, TPP, 1, 0, LAYERS, BPT);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	reg = kvb_buf_alloc_host(c, 8 * pb, &bid);
	priv = malloc(pb);
	CHECK(reg && priv);
	/*
	 * The view lays the page out as the pool does ([layer][token][BPT], stride BPT), so
	 * token slot 0 is the page image at reg and slot LAYERS * TPP the one at reg + pb.
	 */
	for (int p = 0; p < LAYERS; p++)
		parts[p] = (struct kvb_view_part){
			.buf = bid, .stride = BPT, .base = (uint64_t)p * TPP * BPT};
	CHECK_OK(kvb_view_create(c, ns, parts, LAYERS, &view));
	harness_gate_open(&sh->ready, 1);
	while (!sh->stop) {
		uint64_t x = rnd(&s), id = x % NIDS, ver = (x >> 20) % NVER;
		kvb_key k = key_of(id, ver);
		int rc;

		switch ((x >> 32) % 10) {
		case 0: /* PUT from private memory (the staging path) */
			harness_fill(priv, pb, &k, SEED);
			bad(kvb_put(c, ns, k, priv, pb), "put");
			break;
		case 1: /* PUT from the registered buffer */
			harness_fill(reg, pb, &k, SEED);
			bad(kvb_put(c, ns, k, reg, pb), "put registered");
			break;
		case 2: /* view PUT: slot 0 of the view is the page image at reg + 0 */
			harness_fill(reg, pb, &k, SEED);
			bad(kvb_view_put(c, view, k, 0), "view put");
			break;
		case 3:
		case 4:
			rc = kvb_get(c, ns, k, priv, pb);
			if (rc == (int)pb)
				verify(priv, pb, &k, "get");
			else
				bad(rc, "get");
			sh->enoent += rc == -ENOENT;
			break;
		case 5: /* view GET, all layers or a range */
			memset(reg + pb, 0xee, pb);
			if (x % 2) {
				rc = kvb_view_get(c, view, k, LAYERS * TPP, 0, 0);
				if (rc == (int)pb)
					verify(reg + pb, pb, &k, "view get");
				else
					bad(rc, "view get");
			} else {
				uint32_t lf = (uint32_t)(x >> 40) % LAYERS, lc = 1;
				uint64_t off = (uint64_t)lf * TPP * BPT;

				rc = kvb_view_get(c, view, k, LAYERS * TPP, lf, lc);
				if (rc >= 0) {
					for (uint64_t i = 0; i < TPP * BPT; i += 997)
						if (reg[pb + off + i] !=
						    harness_byte(&k, SEED, off + i)) {
							sh->mismatches++;
							break;
						}
					sh->reads_verified++;
				} else {
					bad(rc, "view get range");
				}
			}
			break;
		case 6: { /* async batch of GETs into registered slots 2..7 */
			struct kvb_op ops[6];
			struct kvb_completion done[6];
			kvb_key ks[6];
			int n, got = 0;

			memset(ops, 0, sizeof(ops));
			for (int i = 0; i < 6; i++) {
				ks[i] = key_of((id + (uint64_t)i) % NIDS, ver);
				ops[i] = (struct kvb_op){.opcode = KVB_OP_GET,
							 .ns = ns,
							 .buf = bid,
							 .key = ks[i],
							 .off = (uint64_t)(2 + i) * pb,
							 .user_data = (uint64_t)i};
			}
			n = kvb_submit(c, ops, 6);
			bad(n, "submit");
			while (n > 0 && got < n) {
				int k2 = kvb_reap(c, done, 6, 1, 5000);

				if (k2 <= 0) {
					bad(k2 ? k2 : -ETIMEDOUT, "reap");
					break;
				}
				for (int i = 0; i < k2; i++) {
					uint64_t u = done[i].user_data;

					if (done[i].res == (int)pb)
						verify(reg + (2 + u) * pb, pb, &ks[u], "batch get");
					else
						bad(done[i].res, "batch get");
				}
				got += k2;
			}
			break;
		}
		case 7: { /* a lease, verified, held across other clients' deletes, verified again */
			struct kvb_lease ls;

			rc = kvb_acquire(c, ns, k, &ls);
			if (rc == 0) {
				verify(ls.data, ls.len, &k, "lease");
				for (int i = 0; i < 3; i++) {
					kvb_key k3 = key_of(rnd(&s) % NIDS, ver);

					harness_fill(priv, pb, &k3, SEED);
					bad(kvb_put(c, ns, k3, priv, pb), "put while leased");
				}
				bad(kvb_delete(c, ns, k), "delete own leased page");
				verify(ls.data, ls.len, &k, "lease after delete and puts");
				bad(kvb_release(c, &ls), "release");
			} else {
				bad(rc, "acquire");
			}
			break;
		}
		case 8:
			bad(kvb_delete(c, ns, k), "delete");
			break;
		default: {
			kvb_key keys[16];
			size_t hits;

			for (int i = 0; i < 16; i++)
				keys[i] = key_of((id + (uint64_t)i) % NIDS, ver);
			bad(kvb_lookup(c, ns, keys, 16, &hits), "lookup");
			break;
		}
		}
		sh->ops++;
	}
	kvb_close(c);
	free(priv);
	return 0;
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	kvb_client *c;
	pid_t w[NCLI];
	unsigned secs = rel_soak_seconds(60);
	uint64_t t0, el;
	long rss_early = -1, rss_end, fd_early = -1, fd_end;
	char *json;

	harness_init(argc, argv);
	rel_deadline(secs + 90);
	b = harness_broker_start("--pool", "64M", "--slab", "8M");
	sh = harness_shared(sizeof(*sh));
	snprintf(sh->sock, sizeof(sh->sock), "%s", b->sock);
	harness_gate_init(&sh->ready);
	c = harness_connect(b, "monitor", 0);
	for (int i = 0; i < NCLI; i++)
		w[i] = harness_fork(worker, i, NULL);
	for (int i = 0; i < NCLI; i++)
		harness_gate_wait(&sh->ready, 10000);
	harness_log("soak: %d clients for %u s", NCLI, secs);
	t0 = harness_now_ms();
	while ((el = harness_now_ms() - t0) < (uint64_t)secs * 1000) {
		if (rss_early < 0 && el >= (uint64_t)secs * 100) {
			rss_early = rel_status_kb(b->pid, "VmRSS");
			fd_early = rel_fd_count(b->pid, NULL, 0);
		}
		CHECKF(harness_broker_alive(b), "the broker died during the soak");
		CHECKF(sh->mismatches == 0, "a read did not match its key");
		rel_sleep_ms(100);
	}
	rss_end = rel_status_kb(b->pid, "VmRSS");
	fd_end = rel_fd_count(b->pid, NULL, 0);
	sh->stop = 1;
	CHECK_EQ(harness_wait(w, NCLI, 30000, NULL), 0);
	CHECK_EQ(sh->mismatches, 0);
	CHECK_EQ(sh->errors, 0);
	CHECK_GT(sh->reads_verified, 0);
	CHECK_EQ(harness_stat_wait(c, "clients", 1, 5000), 1);
	json = harness_stats(c);
	CHECK_EQ(harness_stat_u64(json, "leases"), 0);
	CHECK_EQ(harness_stat_u64(json, "pool.pinned_pages"), 0);
	rel_figure("%u s, %d clients: %llu ops, %llu reads verified, 0 mismatches, 0 errors, "
		   "%llu evictions; broker RSS %ld -> %ld KiB and fds %ld -> %ld from 10%% of the "
		   "run to its end",
		   secs, NCLI, (unsigned long long)sh->ops, (unsigned long long)sh->reads_verified,
		   (unsigned long long)harness_stat_u64(json, "counters.evictions"), rss_early,
		   rss_end, fd_early, fd_end);
	free(json);
	CHECKF(fd_end == fd_early, "broker fds %ld -> %ld", fd_early, fd_end);
	/*
	 * The pool is prefaulted shared memory; anything beyond it would be growth. (Not under
	 * the sanitizers: their shadow memory grows with every pool page the broker touches.)
	 */
	CHECKF(rss_end - rss_early < 16 * 1024 || rel_scale() == REL_SMALL,
	       "broker RSS grew %ld KiB", rss_end - rss_early);
	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
