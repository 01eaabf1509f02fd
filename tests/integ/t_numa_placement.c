// SPDX-License-Identifier: MIT
/*
 * t_numa_placement.c - page placement on the real machine. With --numa auto every arena is
 * bound to its node (MPOL_BIND, read back from a client's own read-only mapping with
 * get_mempolicy) and every page of a client that declared its node lies on that node's arena
 * and on that node (move_pages). A client declaring a GPU by PCI bus id gets the GPU's node, or
 * its CPU node when the device has none; a malformed bus id is refused. --numa off leaves the
 * memory unbound; --numa with a node that has no memory refuses to start. The stats carry each
 * arena's node and page size, each client's node, and the start-up phase timings.
 * (The multi-node logic - sizing, nearest node, fallback - runs in test_numa on a simulated
 * topology; this machine may have one node.)
 */
#include <dirent.h>
#include <libgen.h>
#include <numa.h>
#include <numaif.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

#define PAGE (64u * 1024)
#define NPAGES 32

/* A PCI device of this machine and its node from sysfs (-1: none), or 0 when there is none. */
static int some_pci_device(char *busid, size_t len, int *node)
{
	DIR *d = opendir("/sys/bus/pci/devices");
	struct dirent *e;
	int found = 0;

	if (!d)
		return 0;
	while (!found && (e = readdir(d))) {
		char path[512];
		FILE *f;

		if (strlen(e->d_name) != 12)
			continue;
		snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fscanf(f, "%d", node) == 1) {
			/* 12 characters, checked above (snprintf here trips -Wformat-truncation). */
			memcpy(busid, e->d_name, len > 12 ? 12 : len - 1);
			busid[len > 12 ? 12 : len - 1] = '\0';
			found = 1;
		}
		fclose(f);
	}
	closedir(d);
	return found;
}

static kvb_client *connect_placed(struct harness_broker *b, const char *busid, int node)
{
	struct kvb_opts o = {.socket_path = b->sock, .name = "placed", .gpu_busid = busid};
	kvb_client *c;

	if (node >= 0) {
		o.flags = KVB_CONNECT_NUMA_NODE;
		o.numa_node = node;
	}
	CHECK_OK(kvb_connect(&o, &c));
	return c;
}

/*
 * The pool is on hugetlb pages (free ones on this machine): hugetlbfs keeps no policy of the
 * file's, so the binding is the broker's mapping's alone (where every page was faulted in at
 * prefault) and cannot be read back through ours; move_pages still says where the page is.
 */
static int on_hugetlb;

/* Puts NPAGES pages and checks each lies on node (move_pages), in an arena bound to it. */
static void check_pages_on(kvb_client *c, int node, uint64_t seed)
{
	struct kvb_layout l;
	uint8_t *page = malloc(PAGE);
	uint32_t ns;

	CHECK(page != NULL);
	harness_layout(&l, "numa-placement", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	for (uint32_t i = 0; i < NPAGES; i++) {
		kvb_key k = harness_key(seed, i);
		struct kvb_lease lease;
		void *addr;
		int status = -1, mode = -1;
		unsigned long mask[16] = {0};

		harness_fill(page, PAGE, &k, seed);
		CHECK_OK(kvb_put(c, ns, k, page, PAGE));
		CHECK_OK(kvb_acquire(c, ns, k, &lease));
		CHECK_OK(harness_verify(lease.data, lease.len, &k, seed, "placed page"));
		memcpy(&addr, &lease.data, sizeof(addr));
		/* The page is mapped in our read-only view (just read): where is it? */
		if (move_pages(0, 1, &addr, NULL, &status, 0) < 0 &&
		    (errno == EPERM || errno == ENOSYS))
			harness_skip("move_pages is not permitted here (seccomp?)");
		CHECK_EQ(status, node);
		/* The policy is the memfd's own, visible through any mapping of a tmpfs one. */
		CHECK_EQ(get_mempolicy(&mode, mask, sizeof(mask) * 8, addr, MPOL_F_ADDR), 0);
		CHECKF(on_hugetlb || (mode == MPOL_BIND && mask[0] == 1ul << node),
		       "page %u: policy %d mask 0x%lx, want MPOL_BIND to node %d", i, mode, mask[0],
		       node);
		CHECK_OK(kvb_release(c, &lease));
	}
	free(page);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	kvb_client *c;
	char busid[32], *js, cmd[PATH_MAX + 256], self[PATH_MAX], out[4096];
	int dev_node = -1, node, st;
	FILE *p;
	size_t n;

	harness_init(argc, argv);
	snprintf(self, sizeof(self), "%s", argv[0]);
	if (numa_available() < 0)
		harness_skip("no NUMA support in this kernel");
	node = numa_max_node(); /* the last node; on one-node machines node 0 */
	while (node > 0 && numa_node_size64(node, NULL) <= 0)
		node--;

	b = harness_broker_start("--pool", "64M", "--numa", "auto");
	on_hugetlb = harness_broker_log_has(b, "pages (hugetlb)");
	c = harness_connect(b, "stats", 0);
	js = harness_stats(c);
	kvb_close(c);
	CHECK(harness_stat_has(js, "startup.reserve_s") &&
	      harness_stat_has(js, "startup.prefault_s"));
	CHECK(harness_stat_has(js, "startup.pin_s") && harness_stat_has(js, "startup.ready_s"));
	CHECK(harness_stat_f64(js, "startup.ready_s") >=
	      harness_stat_f64(js, "startup.prefault_s"));
	CHECKF(strstr(js, "\"page_size\":\"") != NULL, "no page_size in %s", js);
	if (harness_stat_f64(js, "pool.arenas[0].node") < 0)
		harness_skip("mbind is not permitted here (seccomp?): the arena is unbound");
	free(js);

	c = connect_placed(b, NULL, node);
	CHECK_EQ(harness_stat(c, "client_list[name=placed].node"), node);
	check_pages_on(c, node, 1);
	kvb_close(c);

	/* A GPU: its node from sysfs wins; a device without one leaves the declared CPU node. */
	if (some_pci_device(busid, sizeof(busid), &dev_node)) {
		harness_log("pci device %s: node %d", busid, dev_node);
		c = connect_placed(b, busid, node);
		js = harness_stats(c);
		CHECK_EQ(harness_stat_f64(js, "client_list[name=placed].node"),
			 dev_node >= 0 ? dev_node : node);
		free(js);
		kvb_close(c);
	}
	{
		struct kvb_opts o = {.socket_path = b->sock, .gpu_busid = "not-a-bus-id"};

		CHECK_RC(kvb_connect(&o, &c), -EINVAL);
		o.gpu_busid = "0000:00:00.0-and-far-too-long-to-fit";
		CHECK_RC(kvb_connect(&o, &c), -EINVAL);
		/* Well formed, but no such device here: refused with words, not ignored. */
		o.gpu_busid = "0000:fe:1f.7";
		if (access("/sys/bus/pci/devices", F_OK) == 0 &&
		    access("/sys/bus/pci/devices/0000:fe:1f.7", F_OK) != 0) {
			kvb_client *pr = harness_connect(b, "probe", 0);
			uint64_t pe = harness_stat(pr, "counters.protocol_errors");

			CHECK_RC(kvb_connect(&o, &c), -ENODEV);
			CHECK(strstr(kvb_strerror(-ENODEV), "gpu_busid") != NULL);
			CHECK(harness_broker_log_has(b, "no PCI device 0000:fe:1f.7"));
			CHECK_EQ(harness_stat(pr, "counters.protocol_errors"), pe);
			kvb_close(pr);
		}
		o.gpu_busid = NULL;
		o.flags = KVB_CONNECT_NUMA_NODE;
		o.numa_node = -2;
		CHECK_RC(kvb_connect(&o, &c), -EINVAL);
	}
	harness_broker_stop(b);

	/* --numa off: one arena, no policy. */
	b = harness_broker_start("--pool", "64M", "--numa", "off");
	c = connect_placed(b, NULL, node);
	js = harness_stats(c);
	CHECK_EQ(harness_stat_f64(js, "pool.arenas[0].node"), -1);
	free(js);
	kvb_close(c);
	harness_broker_stop(b);

	/* A node without memory (or that does not exist) is a start-up error. */
	snprintf(cmd, sizeof(cmd), "%s/../bin/kvbrokerd --socket %s/nonode.sock --numa %d 2>&1",
		 dirname(self), b->dir, numa_max_node() + 1);
	p = popen(cmd, "r");
	CHECK(p != NULL);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	st = pclose(p);
	CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 1 && strstr(out, "has no memory"),
	       "--numa with a node without memory: status 0x%x, said:\n%s", st, out);
	return H_PASS;
}
