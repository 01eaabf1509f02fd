// SPDX-License-Identifier: MIT
/*
 * t_revoke_reconnect.c - a session the broker ends while it holds a lease (--lease-lifetime)
 * reconnects cleanly: its pool map was made PROT_NONE (a stale lease pointer faults), so the
 * library must not copy its leases as it does for a broker that died (client/conn.c [retire]):
 * that read the revoked map and the client died of SIGSEGV at its next call.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define PAGE (64u * 1024)

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_opts o = {0};
	struct kvb_layout l;
	struct kvb_lease lease;
	uint8_t *page = malloc(PAGE);
	kvb_key k = harness_key(41, 1);
	kvb_client *c, *obs;
	uint32_t ns;
	long long rc = 0;

	harness_init(argc, argv);
	CHECK(page != NULL);
	b = harness_broker_start("--pool", "64M", "--lease-lifetime", "1");
	o.socket_path = b->sock;
	setenv("KVB_CLIENT_DIR", "0", 1); /* the broker's lease, which it times */
	CHECK_OK(kvb_connect(&o, &c));
	harness_layout(&l, "revoke", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	harness_fill(page, PAGE, &k, 41);
	CHECK_OK(kvb_put(c, ns, k, page, PAGE));
	CHECK_OK(kvb_acquire(c, ns, k, &lease));
	obs = harness_connect(b, "observer", 0);
	CHECK_EQ(harness_stat_wait(obs, "counters.expired", 1, 10000), 1);
	/* The session is gone: calls fail, then one reconnects, and works. */
	for (int i = 0; i < 200; i++) {
		rc = kvb_get(c, ns, k, page, PAGE);
		if (rc >= 0)
			break;
		usleep(10000);
	}
	CHECKF(rc >= 0, "no GET after the session was ended: %s", harness_strerror(rc));
	CHECK_EQ(harness_verify(page, PAGE, &k, 41, "get"), 0);
	kvb_close(c);
	kvb_close(obs);
	harness_broker_stop(b);
	free(page);
	return 0;
}
