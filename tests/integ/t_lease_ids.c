// SPDX-License-Identifier: MIT
/*
 * t_lease_ids.c - [lease-alias] a lease id of a broker that went never names a lease of the next
 * one. A broker that adopts the pool gives a page the lease id its predecessor gave it (same
 * slot, same generation), and a cold one counts generations from the same start: a client that
 * still holds the old broker's lease and takes the page again would hold one id twice. Released
 * through kvb_submit(), which carries only the id, the old lease went to the new broker and
 * dropped the new lease's pin while the caller read through it; the caller's RELEASE of the new
 * one then failed -EINVAL. Both restarts here: the adopting broker, then a cold one; each new
 * lease is released one way (kvb_submit, kvb_release) and the broker's lease count checked.
 * Between them, a broker that refuses the client's second namespace: every reconnect attempt
 * maps its pool and fails. Each attempt's pool maps stayed mapped beside the old broker's (whose
 * lease the client holds) until that lease went; now the count of maps stays put, and the lease
 * still reads its page intact. Last, leases of two brokers that went: each one's pool maps go
 * with its own last lease (they went with the last of either: one lease kept from long ago kept
 * every later broker's pool mapped).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define PAGE (64u * 1024)

static struct kvb_lease acquire_async(kvb_client *c, uint32_t ns, kvb_key key)
{
	struct kvb_op op = {.opcode = KVB_OP_ACQUIRE, .ns = ns, .key = key, .user_data = 1};
	struct kvb_completion comp;

	CHECK_RC(kvb_submit(c, &op, 1), 1);
	harness_reap_n(c, &comp, 1);
	CHECK_RC(comp.res, 0);
	return comp.lease;
}

static void release_async(kvb_client *c, uint64_t id)
{
	struct kvb_op op = {.opcode = KVB_OP_RELEASE, .off = id, .user_data = 2};
	struct kvb_completion comp;

	CHECK_RC(kvb_submit(c, &op, 1), 1);
	harness_reap_n(c, &comp, 1);
	CHECK_RC(comp.res, 0);
}

/*
 * A broker on a socket of its own (copied to sock: restarts replace *b) and a client of it that
 * reconnects for up to reconnect_ms, l's namespace open in *ns and key's page stored.
 */
static kvb_client *attach(struct harness_broker **b, char sock[108], uint32_t reconnect_ms,
			  const struct kvb_layout *l, uint32_t *ns, kvb_key key,
			  const uint8_t *page)
{
	struct kvb_opts o = {.socket_path = sock, .reconnect_ms = reconnect_ms};
	kvb_client *c;

	*b = harness_broker_start("--pool", "64M");
	snprintf(sock, 108, "%s", (*b)->sock);
	CHECK_OK(kvb_connect(&o, &c));
	CHECK_OK(kvb_ns_open(c, l, ns, NULL));
	CHECK_OK(kvb_put(c, *ns, key, page, PAGE));
	return c;
}

static void kill9(struct harness_broker *b)
{
	CHECK_OK(kill(b->pid, SIGKILL));
	while (harness_broker_alive(b))
		usleep(1000);
}

static struct harness_broker *restart(struct harness_broker *b, const char *sock, int keep)
{
	kill9(b);
	if (keep)
		return harness_broker_start("--pool", "64M", "--socket", sock);
	return harness_broker_start("--pool", "64M", "--socket", sock, "--no-pool-keep");
}

static void reconnected(kvb_client *c)
{
	int rc, tries;

	for (tries = 0; (rc = kvb_nop(c)) == -ECONNRESET && tries < 100; tries++)
		;
	CHECK_OK(rc);
}

/*
 * Holding old (the dead broker's lease of key), takes key again from the broker behind watch's
 * socket and releases both, the old one first through kvb_submit; the new one's pin must hold
 * until its own release, which by_submit makes through kvb_submit too, else kvb_release().
 */
static void both_held(kvb_client *c, kvb_client *watch, uint32_t ns, kvb_key key,
		      struct kvb_lease *old, int by_submit, const char *what)
{
	struct kvb_lease now = acquire_async(c, ns, key);

	CHECKF(now.id != old->id, "%s: the new broker's lease has the old one's id %#llx", what,
	       (unsigned long long)now.id);
	/* What this test is for: the broker gave the old id, the library an alias. */
	CHECKF((uint32_t)now.id == 0xfffffffeu,
	       "%s: lease id %#llx is no alias: the ids no longer collide, and the test needs "
	       "another "
	       "way to make them",
	       what, (unsigned long long)now.id);
	CHECK_OK(harness_verify(now.data, now.len, &key, 31, what));
	CHECK_EQ(harness_stat(watch, "leases"), 1);
	release_async(c, old->id); /* answered by the library: the new broker never heard of it */
	CHECKF(harness_stat(watch, "leases") == 1,
	       "%s: releasing the old broker's lease released the new one's", what);
	CHECK_OK(harness_verify(now.data, now.len, &key, 31, what));
	if (by_submit) {
		release_async(c, now.id);
	} else {
		CHECK_OK(kvb_release(c, &now));
	}
	CHECK_EQ(harness_stat(watch, "leases"), 0);
}

static void failed_attempts(const struct kvb_layout *l, kvb_key key, const uint8_t *page)
{
	struct harness_broker *b;
	struct kvb_layout l2 = *l;
	struct kvb_lease old;
	char sock[108];
	uint32_t ns, ns2;
	kvb_client *c = attach(&b, sock, 100, l, &ns, key, page);
	int maps0, maps1;

	snprintf(l2.model, sizeof(l2.model), "lease-ids-2");
	CHECK_OK(kvb_ns_open(c, &l2, &ns2, NULL));
	old = acquire_async(c, ns, key);
	maps0 = harness_memfd_maps();
	kill9(b);
	b = harness_broker_start("--pool", "64M", "--socket", sock, "--max-ns", "1");
	CHECK_RC(kvb_nop(c), -ECONNRESET); /* the broker that went */
	CHECK_RC(kvb_nop(c), -ECONNRESET); /* 100 ms of attempts, each refused the second ns */
	maps1 = harness_memfd_maps();
	for (int i = 0; i < 10; i++) /* a second more: attempts every 200 ms at most */
		CHECK_RC(kvb_nop(c), -ECONNRESET);
	CHECKF(harness_memfd_maps() == maps1,
	       "failed attempts kept their pool maps: %d memfd maps, %d after the first ones",
	       harness_memfd_maps(), maps1);
	CHECK_OK(harness_verify(old.data, old.len, &key, 31, "old lease"));
	harness_broker_stop(b);
	b = harness_broker_start("--pool", "64M", "--socket", sock);
	reconnected(c);
	release_async(c, old.id);
	CHECKF(harness_memfd_maps() == maps0, "%d memfd maps after the old lease, %d before",
	       harness_memfd_maps(), maps0);
	kvb_close(c);
	harness_broker_stop(b);
}

static void two_gone(const struct kvb_layout *l, kvb_key key, const uint8_t *page)
{
	struct harness_broker *b;
	struct kvb_lease first, second;
	char sock[108];
	uint32_t ns;
	kvb_client *c = attach(&b, sock, 20000, l, &ns, key, page);
	int maps0 = harness_memfd_maps(), maps2;

	first = acquire_async(c, ns, key);
	b = restart(b, sock, 1);
	reconnected(c);
	second = acquire_async(c, ns, key); /* the adopted page: an alias of first's id */
	b = restart(b, sock, 1);
	reconnected(c);
	maps2 = harness_memfd_maps();
	CHECKF(maps2 >= maps0 + 2, "%d memfd maps with two brokers' leases held, %d before", maps2,
	       maps0);
	release_async(c, second.id);
	CHECKF(harness_memfd_maps() < maps2,
	       "the second broker's pool stayed mapped after its last lease (%d maps)",
	       harness_memfd_maps());
	CHECK_OK(harness_verify(first.data, first.len, &key, 31, "the first broker's lease"));
	CHECK_OK(kvb_release(c, &first));
	CHECKF(harness_memfd_maps() == maps0, "%d memfd maps after both, %d before",
	       harness_memfd_maps(), maps0);
	kvb_close(c);
	harness_broker_stop(b);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	struct kvb_lease old;
	uint8_t *page = malloc(PAGE);
	kvb_key key;
	kvb_client *c, *watch;
	char sock[108];
	uint32_t ns;

	harness_init(argc, argv);
	CHECK(page != NULL);
	harness_layout(&l, "lease-ids", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
	key = harness_key(31, 0);
	harness_fill(page, PAGE, &key, 31);
	c = attach(&b, sock, 20000, &l, &ns, key, page);

	/* The adopting broker: the page keeps its slot and generation, so its lease id too. */
	old = acquire_async(c, ns, key);
	b = restart(b, sock, 1);
	reconnected(c);
	watch = harness_connect(b, "watch", 0);
	both_held(c, watch, ns, key, &old, 1, "adopted pool");
	kvb_close(watch);

	/* Attempts that fail after mapping the pool, while an old lease is held. */
	failed_attempts(&l, key, page);
	two_gone(&l, key, page);

	/* A cold broker: the page stored again takes the first slot and generation there. */
	old = acquire_async(c, ns, key);
	b = restart(b, sock, 0);
	reconnected(c);
	watch = harness_connect(b, "watch", 0);
	CHECK_OK(kvb_put(c, ns, key, page, PAGE));
	both_held(c, watch, ns, key, &old, 0, "cold broker");
	kvb_close(watch);

	kvb_close(c);
	harness_broker_stop(b);
	free(page);
	return H_PASS;
}
