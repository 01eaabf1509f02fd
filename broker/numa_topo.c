// SPDX-License-Identifier: MIT
/*
 * numa_topo.c - NUMA topology, arena plan, nearest-arena order and node binding, over libnuma.
 *
 * The pool has one arena per NUMA node with memory (--numa auto), each bound to its node with
 * mbind before its first touch, so a page's node is known from its arena. A client declares the
 * node it runs on, or its GPU's PCI bus id (the broker reads the device's node from sysfs), and
 * its new pages go to the nearest arena by the firmware's distance table (numa_distance), then
 * to the next nearest when that one is full (store_alloc_pref).
 *
 * Every libnuma call of the broker goes through this file, so the unit tests simulate a
 * multi-node machine by wrapping exactly these (ld --wrap): numa_available, numa_max_node,
 * numa_node_size64, numa_distance, numa_node_to_cpus, numa_run_on_node, numa_set_localalloc
 * and mbind.
 *
 * Pure functions over the topology, except numa_bind_thread (the calling thread) and
 * numa_bind_memory (a mapping); any thread.
 */
#include <ctype.h>
#include <errno.h>
#include <numa.h>
#include <numaif.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "numa_topo.h"
#include "size.h"

void numa_topo_probe(struct numa_topo *t)
{
	int max;

	memset(t, 0, sizeof(*t));
	if (numa_available() < 0)
		return;
	max = numa_max_node();
	for (int node = 0; node <= max; node++) {
		long long sz = numa_node_size64(node, NULL);

		if (sz <= 0)
			continue; /* memoryless (CPU-only or offline) node */
		if (t->n == NUMA_NODES_MAX) {
			t->skipped++;
			continue;
		}
		t->node[t->n] = node;
		t->mem[t->n] = (uint64_t)sz;
		t->n++;
	}
}

static int topo_index(const struct numa_topo *t, int node)
{
	for (uint32_t i = 0; i < t->n; i++)
		if (t->node[i] == node)
			return (int)i;
	return -1;
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* Splits pool over p's arenas in proportion to weight[i], each rounded up to align. */
static void split(struct numa_plan *p, const uint64_t *weight, uint64_t pool, uint64_t align)
{
	double sum = 0;

	for (uint32_t i = 0; i < p->n; i++)
		sum += (double)weight[i];
	for (uint32_t i = 0; i < p->n; i++) {
		uint64_t sz = (uint64_t)((double)pool * ((double)weight[i] / sum));

		p->size[i] = align_up(sz ? sz : 1, align);
	}
}

/* "0,1" or "0:64G,1:32G" into p (sizes as given, or 0 when none is). */
static int parse_list(const struct numa_topo *t, const char *spec, struct numa_plan *p)
{
	const char *s = spec;
	int sized = -1;

	while (*s) {
		char *end;
		long node;
		int ti;

		if (!isdigit((unsigned char)*s))
			return -EINVAL;
		errno = 0;
		node = strtol(s, &end, 10);
		if (errno || node > 4095)
			return -EINVAL;
		ti = topo_index(t, (int)node);
		if (ti < 0)
			return -ENODEV;
		for (uint32_t i = 0; i < p->n; i++)
			if (p->node[i] == (int)node)
				return -EINVAL; /* listed twice */
		if (p->n == NUMA_NODES_MAX)
			return -E2BIG;
		p->node[p->n] = (int)node;
		p->size[p->n] = 0;
		s = end;
		if (*s == ':') {
			if (sized == 0 || size_parse_end(s + 1, &p->size[p->n], &s) ||
			    !p->size[p->n])
				return -EINVAL;
			sized = 1;
		} else {
			if (sized == 1)
				return -EINVAL;
			sized = 0;
		}
		p->n++;
		if (*s == ',' && s[1])
			s++;
		else if (*s)
			return -EINVAL;
	}
	return p->n ? 0 : -EINVAL;
}

int numa_plan_make(const struct numa_topo *t, const char *spec, uint64_t pool, uint64_t align,
		   struct numa_plan *p)
{
	uint64_t weight[NUMA_NODES_MAX];
	int err;

	memset(p, 0, sizeof(*p));
	if (!spec || !*spec || !align || !pool)
		return -EINVAL;
	if (!strcmp(spec, "off") || (!t->n && !strcmp(spec, "auto"))) {
		p->n = 1;
		p->node[0] = -1;
		p->size[0] = align_up(pool, align);
		return 0;
	}
	if (!strcmp(spec, "interleave")) {
		if (!t->n)
			return -ENODEV;
		p->strict = 1;
		p->n = 1;
		/* Interleaving over one node is binding to it. */
		p->node[0] = t->n == 1 ? t->node[0] : -1;
		p->interleave = t->n > 1;
		p->size[0] = align_up(pool, align);
		return 0;
	}
	if (!strcmp(spec, "auto")) {
		p->n = t->n;
		memcpy(p->node, t->node, t->n * sizeof(t->node[0]));
		split(p, t->mem, pool, align);
		return 0;
	}
	err = parse_list(t, spec, p);
	if (err) {
		memset(p, 0, sizeof(*p));
		return err;
	}
	p->strict = 1;
	if (p->size[0]) {
		for (uint32_t i = 0; i < p->n; i++)
			p->size[i] = align_up(p->size[i], align);
		return 0;
	}
	for (uint32_t i = 0; i < p->n; i++)
		weight[i] = t->mem[topo_index(t, p->node[i])];
	split(p, weight, pool, align);
	return 0;
}

void numa_order(const int *arena_node, uint32_t n, int from, uint8_t *order)
{
	int dist[NUMA_NODES_MAX];

	for (uint32_t i = 0; i < n; i++) {
		order[i] = (uint8_t)i;
		if (from < 0)
			dist[i] = 0;
		else if (arena_node[i] < 0)
			dist[i] = 1 << 16; /* unbound: anywhere, so after every bound arena */
		else if (arena_node[i] == from)
			dist[i] = 0;
		else {
			/* 0 when libnuma cannot tell: then just after the local node. */
			dist[i] = numa_distance(from, arena_node[i]);
			if (dist[i] <= 0)
				dist[i] = 1 << 8;
		}
	}
	/* Insertion sort: n <= 8, and it is stable, so ties keep index order. */
	for (uint32_t i = 1; i < n; i++) {
		uint8_t a = order[i];
		uint32_t j = i;

		for (; j > 0 && dist[order[j - 1]] > dist[a]; j--)
			order[j] = order[j - 1];
		order[j] = a;
	}
}

int numa_bind_thread(int node)
{
	if (node < 0 || numa_available() < 0)
		return 0;
	if (numa_run_on_node(node) < 0)
		return errno ? -errno : -EINVAL;
	numa_set_localalloc();
	return 0;
}

int numa_bind_memory(void *base, uint64_t len, int node, int interleave, const struct numa_topo *t)
{
	unsigned long mask[1024 / (8 * sizeof(unsigned long))] = {0};
	const unsigned long bits = 8 * sizeof(unsigned long);
	int mode = MPOL_BIND;

	if (interleave) {
		mode = MPOL_INTERLEAVE;
		for (uint32_t i = 0; i < t->n; i++)
			mask[t->node[i] / bits] |= 1ul << (t->node[i] % bits);
	} else if (node >= 0 && node < 1024) {
		mask[node / bits] |= 1ul << (node % bits);
	} else {
		return node < 0 ? 0 : -EINVAL;
	}
	/* maxnode counts bits, and the kernel wants one more than the highest it reads. */
	if (mbind(base, len, mode, mask, sizeof(mask) * 8 - 1, 0) < 0)
		return errno ? -errno : -EINVAL;
	return 0;
}

int numa_pci_node(const char *sysfs, const char *busid)
{
	char id[24], path[256];
	size_t n = strlen(busid), o = 0;
	const char *b = busid;
	FILE *f;
	int node = -1;

	/* "00000000:3B:00.0" (8-digit domain, as nvidia-smi prints it) -> "0000:3b:00.0". */
	if (n == 16 && !strncmp(busid, "0000", 4))
		b += 4, n -= 4;
	if (n != 12 || b[4] != ':' || b[7] != ':' || b[10] != '.')
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (i != 4 && i != 7 && i != 10 && !isxdigit((unsigned char)b[i]))
			return -EINVAL;
		id[o++] = (char)tolower((unsigned char)b[i]);
	}
	id[o] = '\0';
	snprintf(path, sizeof(path), "%s/bus/pci/devices/%s/numa_node", sysfs ? sysfs : "/sys", id);
	f = fopen(path, "re");
	if (!f) {
		/* No such device among those this machine lists: -ENODEV (a typo, another host's
		 * id). No PCI list at all (no sysfs in a sandbox): unknown, not wrong. */
		snprintf(path, sizeof(path), "%s/bus/pci/devices/%s", sysfs ? sysfs : "/sys", id);
		if (access(path, F_OK) == 0)
			return -1;
		snprintf(path, sizeof(path), "%s/bus/pci/devices", sysfs ? sysfs : "/sys");
		return access(path, F_OK) == 0 ? -ENODEV : -1;
	}
	if (fscanf(f, "%d", &node) != 1 || node < 0)
		node = -1;
	fclose(f);
	return node;
}

uint32_t numa_node_cpus(int node)
{
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	uint32_t n = 0;

	if (node >= 0 && numa_available() >= 0) {
		struct bitmask *cpus = numa_allocate_cpumask();

		if (cpus && numa_node_to_cpus(node, cpus) == 0)
			n = numa_bitmask_weight(cpus);
		if (cpus)
			numa_bitmask_free(cpus);
	}
	if (!n)
		n = online > 0 ? (uint32_t)online : 1;
	return n;
}
