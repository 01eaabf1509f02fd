// SPDX-License-Identifier: MIT
/*
 * t_lease_reconnect.c - leases across a broker restart, taken and released every way the library
 * has: a synchronous kvb_acquire() (the client's own lease through the pool directory), ACQUIREs
 * through kvb_submit() (the broker's leases), one of them released through kvb_submit() before the
 * broker dies (SIGKILL). The client reconnects to the broker that adopts the pool; the leases it
 * still holds stay readable and intact; releasing them, by kvb_release() and through kvb_submit()
 * (again, after one that was in flight when the broker died failed -ECONNRESET), succeeds with
 * nothing to tell the new broker, and once the last is released the old broker's pool mappings are
 * unmapped: the client maps exactly as much as before the restart. An async RELEASE that the
 * library did not count as one kept the old mappings for the life of the client. Then a cold broker
 * gives our namespace another id than the caller's: a read through the pool directory is told to it
 * by its own id (the note ring carried the caller's, which named another client's namespace there).
 * Last, a broker that died while nothing was in flight: with none on the socket a batch is refused
 * whole, and with a new one there the client's first batch goes to it.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define PAGE (64u * 1024)
#define NPAGES 3

int main(int argc, char **argv)
{
	struct harness_broker *b1, *b2;
	struct kvb_opts o = {0};
	struct kvb_layout l, lo;
	struct kvb_lease sync_lease, async_lease[2];
	struct kvb_completion comp[2];
	struct kvb_op ops[2];
	uint8_t *page = malloc(PAGE);
	kvb_key k[NPAGES];
	kvb_client *c, *other;
	char sock[108];
	int maps0, maps_other, rc;
	uint32_t ns, ns_other;

	harness_init(argc, argv);
	CHECK(page != NULL);
	b1 = harness_broker_start("--pool", "64M");
	snprintf(sock, sizeof(sock), "%s", b1->sock);
	o.socket_path = sock;
	o.reconnect_ms = 20000;
	CHECK_OK(kvb_connect(&o, &c));
	harness_layout(&l, "lease-reconnect", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	for (int i = 0; i < NPAGES; i++) {
		k[i] = harness_key(23, (uint64_t)i);
		harness_fill(page, PAGE, &k[i], 23);
		CHECK_OK(kvb_put(c, ns, k[i], page, PAGE));
	}

	/* Page 0 leased synchronously, pages 1 and 2 through kvb_submit. */
	CHECK_OK(kvb_acquire(c, ns, k[0], &sync_lease));
	for (int i = 0; i < 2; i++)
		ops[i] = (struct kvb_op){.opcode = KVB_OP_ACQUIRE,
					 .ns = ns,
					 .key = k[i + 1],
					 .user_data = (uint64_t)i + 1};
	CHECK_RC(kvb_submit(c, ops, 2), 2);
	harness_reap_n(c, comp, 2);
	for (int i = 0; i < 2; i++) {
		CHECKF(comp[i].res >= 0, "async ACQUIRE %llu: %d",
		       (unsigned long long)comp[i].user_data, comp[i].res);
		async_lease[comp[i].user_data - 1] = comp[i].lease;
	}
	/* The lease of page 1 goes back through kvb_submit too. */
	ops[0] = (struct kvb_op){
		.opcode = KVB_OP_RELEASE, .off = async_lease[0].id, .user_data = 9};
	CHECK_RC(kvb_submit(c, ops, 1), 1);
	harness_reap_n(c, comp, 1);
	CHECK_RC(comp[0].res, 0);
	maps0 = harness_memfd_maps();
	CHECK(maps0 > 0);

	/*
	 * The RELEASE of page 2's lease is in flight when the broker dies (stopped, then killed):
	 * it fails -ECONNRESET and the lease stays the caller's, to be released again below.
	 */
	CHECK_OK(kill(b1->pid, SIGSTOP));
	ops[0] = (struct kvb_op){
		.opcode = KVB_OP_RELEASE, .off = async_lease[1].id, .user_data = 7};
	CHECK_RC(kvb_submit(c, ops, 1), 1);
	CHECK_OK(kill(b1->pid, SIGKILL));
	while (harness_broker_alive(b1))
		usleep(1000);
	/* The call that finds the broker gone says so; the failed op comes with the next. */
	for (int tries = 0; (rc = kvb_reap(c, comp, 1, 1, 5000)) == -ECONNRESET && tries < 10;
	     tries++)
		;
	CHECK_RC(rc, 1);
	CHECK_EQ(comp[0].user_data, 7);
	CHECK_RC(comp[0].res, -ECONNRESET);
	b2 = harness_broker_start("--pool", "64M", "--socket", sock);
	/* Another client's namespace first: ours gets another id from this broker. */
	maps_other = harness_memfd_maps();
	other = harness_connect(b2, "other", 0);
	maps_other = harness_memfd_maps() - maps_other;
	harness_layout(&lo, "lease-reconnect-other", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
	CHECK_OK(kvb_ns_open(other, &lo, &ns_other, NULL));
	/* The call in flight when the broker went fails once; the next reconnects. */
	for (int tries = 0; (rc = kvb_nop(c)) == -ECONNRESET && tries < 100; tries++)
		;
	CHECK_OK(rc);
	CHECK_RC(kvb_get(c, ns, k[2], page, PAGE),
		 PAGE); /* the adopted pool, through the new one */
	CHECK_OK(harness_verify(page, PAGE, &k[2], 23, "page through the new broker"));
	CHECKF(harness_memfd_maps() > maps0,
	       "the new broker's pool is mapped next to the old one's (%d, %d)",
	       harness_memfd_maps(), maps0);
	/* That read went through the directory; its note named our namespace by this broker's id. */
	CHECK_EQ(harness_stat(other, "counters.dir_gets"), 1);
	CHECK_EQ(harness_stat(other, "counters.protocol_errors"), 0);
	CHECK_EQ(harness_stat(other, "counters.gets"), 1);

	/* The leases still held read their pages from the old mappings, intact. */
	CHECK_OK(harness_verify(sync_lease.data, sync_lease.len, &k[0], 23, "own lease"));
	CHECK_OK(harness_verify(async_lease[1].data, async_lease[1].len, &k[2], 23, "async lease"));
	CHECK_OK(kvb_release(c, &sync_lease));
	/* The other through kvb_submit: answered by the library, the new broker knows nothing of it. */
	ops[0] = (struct kvb_op){
		.opcode = KVB_OP_RELEASE, .off = async_lease[1].id, .user_data = 8};
	CHECK_RC(kvb_submit(c, ops, 1), 1);
	harness_reap_n(c, comp, 1);
	CHECK_RC(comp[0].res, 0);
	CHECKF(harness_memfd_maps() == maps0 + maps_other,
	       "after the last old lease: %d memfd mappings, %d before the restart (the old pool "
	       "is still mapped)",
	       harness_memfd_maps() - maps_other, maps0);
	/* And the new broker's leases work as before. */
	CHECK_OK(kvb_acquire(c, ns, k[1], &sync_lease));
	CHECK_OK(harness_verify(sync_lease.data, sync_lease.len, &k[1], 23, "new lease"));
	CHECK_OK(kvb_release(c, &sync_lease));

	/*
	 * A cold broker where another client opened a namespace first: ours has another id there
	 * than the one the caller holds, and a read through the directory is told by the broker's.
	 */
	kvb_close(other);
	CHECK_OK(kill(b2->pid, SIGKILL));
	while (harness_broker_alive(b2))
		usleep(1000);
	b2 = harness_broker_start("--pool", "64M", "--socket", sock, "--no-pool-keep");
	other = harness_connect(b2, "other", 0);
	CHECK_OK(kvb_ns_open(other, &lo, &ns_other, NULL));
	CHECK_EQ(ns_other, ns); /* what our namespace was to the brokers before */
	for (int tries = 0; (rc = kvb_nop(c)) == -ECONNRESET && tries < 100; tries++)
		;
	CHECK_OK(rc);
	harness_fill(page, PAGE, &k[2], 23);
	CHECK_OK(kvb_put(c, ns, k[2], page, PAGE));
	CHECK_RC(kvb_get(c, ns, k[2], page, PAGE), PAGE);
	CHECK_EQ(harness_stat(other, "counters.dir_gets"), 1);
	CHECK_EQ(harness_stat(other, "namespaces[model=lease-reconnect].gets"), 1);
	CHECK_EQ(harness_stat(other, "namespaces[model=lease-reconnect-other].gets"), 0);
	CHECK_EQ(harness_stat(other, "counters.protocol_errors"), 0);

	/*
	 * The broker dies while we have nothing in flight and a new one is on the socket before
	 * our next call: the first batch goes to the new broker, which answers -ENOENT (the dead
	 * one ran --no-pool-keep: its pool went with it). Queued on the dead broker's ring, the
	 * batch failed whole (-ECONNRESET), though nothing was in flight. Before the new one
	 * starts, a client that does not wait (reconnect_ms 0) has its batch refused whole, with
	 * nothing queued: it was queued, and failed only when reaped.
	 */
	kvb_close(other);
	other = harness_connect(b2, "no-wait", 0);
	CHECK_OK(kill(b2->pid, SIGKILL));
	while (harness_broker_alive(b2))
		usleep(1000);
	ops[0] = (struct kvb_op){.opcode = KVB_OP_NOP, .user_data = 4};
	CHECK_RC(kvb_submit(other, ops, 1), -ECONNRESET);
	kvb_close(other);
	b2 = harness_broker_start("--pool", "64M", "--socket", sock);
	ops[0] = (struct kvb_op){.opcode = KVB_OP_ACQUIRE, .ns = ns, .key = k[2], .user_data = 5};
	CHECK_RC(kvb_submit(c, ops, 1), 1);
	harness_reap_n(c, comp, 1);
	CHECK_EQ(comp[0].user_data, 5);
	CHECK_RC(comp[0].res, -ENOENT);
	kvb_close(c);
	harness_broker_stop(b2);
	free(page);
	return H_PASS;
}
