// SPDX-License-Identifier: MIT
/*
 * memcap.c - how much memory the broker can have, read before a new pool is made.
 *
 * Nothing else refuses a pool larger than the machine: memfd_create and ftruncate take no
 * memory, the prefault (or fallocate, with --no-prefault) takes it page by page, and when it
 * runs out the kernel's OOM killer ends the broker, or a neighbour, with nothing in our log.
 * So start-up (main.c start_pool) adds up, before any arena exists, what the broker can still
 * take, from the kernel's own figures:
 *   - MemAvailable (/proc/meminfo): the kernel's estimate of what can be allocated without
 *     swapping, free pages plus the page cache and slab it can reclaim. Swap is not counted:
 *     a cache paged out to swap is no cache, and whoever wants that says --pool-overcommit;
 *   - the memory cgroup the broker runs in and each of its ancestors (its path from
 *     /proc/self/cgroup, where the hierarchy is mounted from /proc/self/mountinfo). cgroup v2:
 *     memory.max, and memory.high, which kills nothing but throttles whoever allocates past it
 *     to a crawl, so that a prefault past it never ends; cgroup v1, where the memory
 *     controller is v1's (a hybrid host): memory.limit_in_bytes. A level's room is its limit
 *     less its usage plus the file pages it can reclaim (memory.stat, active and inactive
 *     file: the pool's own shmem pages sit on the anon lists), and the tightest level wins;
 *   - RLIMIT_AS less the address space already in use: the broker maps the whole pool (mmap
 *     would fail cleanly, but this names the limit). Not RLIMIT_DATA: it counts private
 *     writable mappings, and the pool's are shared.
 * Hugetlb pages are neither in MemAvailable nor charged to a memory cgroup: an arena that they
 * will back (enough free ones on its node: hugepage_pick, the rule arena_back follows) needs
 * none of it, only address space. memcap_need predicts which arenas those are.
 *
 * [headroom] The broker needs memory beside the pool, beyond what it uses when it measures:
 * MEMCAP_HEADROOM_MIN (256 MiB) for what does not grow with the pool (the rings and 1 MiB
 * argument areas of a few hundred clients, the index, the copy threads), and 1/32 of the pool
 * for what does: the side table alone is 1/64 (a 64-byte header per 4 KiB, pagehdr.h), the
 * page tables of the broker's map of a 4 KiB-page pool 1/512, and the page records (136 bytes
 * a slot) 1/480 at 64 KiB pages. Both at once, so a sum rather than the larger of the two. A
 * 300 GiB pool then needs 9.6 GiB beside it; MemAvailable itself already leaves out the
 * kernel's reserve (the low watermarks).
 *
 * Every path is read under a root ("" for the real /proc and /sys) so that tests fabricate a
 * machine (memcap_root). A handful of small files: no cost at start-up. Start-up thread only.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "memcap.h"
#include "text.h"

/* cgroup v1 writes "no limit" as the largest page multiple below 2^63. */
#define CG1_UNLIMITED (1ull << 62)

static uint64_t add_sat(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

/* Is word one of the comma-separated words of list? */
static int has_word(const char *list, const char *word)
{
	size_t n = strlen(word);

	for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (!strncmp(p, word, n) && (p[n] == ',' || p[n] == '\0'))
			return 1;
	return 0;
}

/*
 * Sums the values of keys[0..n) in a file of "key value" or "key: value kB" lines (meminfo,
 * memory.stat, status), kB values in bytes. Returns how many keys were found.
 */
static int read_keys(const char *path, const char *const *keys, int n, uint64_t *sum)
{
	char line[256];
	int found = 0;
	FILE *f = fopen(path, "re");

	*sum = 0;
	if (!f)
		return 0;
	while (found < n && fgets(line, sizeof(line), f)) {
		for (int i = 0; i < n; i++) {
			size_t k = strlen(keys[i]);
			unsigned long long v;
			char unit[4] = "";

			if (strncmp(line, keys[i], k) || (line[k] != ':' && line[k] != ' '))
				continue;
			if (sscanf(line + k + 1, "%llu %3s", &v, unit) < 1)
				continue;
			*sum = add_sat(*sum, !strcmp(unit, "kB") ? v << 10 : v);
			found++;
		}
	}
	fclose(f);
	return found;
}

/* A cgroup value file: a number, or "max" (MEMCAP_NONE). 0 when missing or unreadable. */
static int read_value(const char *dir, const char *file, uint64_t *v)
{
	char path[PATH_MAX], buf[64];
	unsigned long long x;
	int ok = 0;
	FILE *f;

	if (snprintf(path, sizeof(path), "%s/%s", dir, file) >= (int)sizeof(path))
		return 0;
	f = fopen(path, "re");
	if (!f)
		return 0;
	if (fgets(buf, sizeof(buf), f)) {
		if (!strncmp(buf, "max", 3)) {
			*v = MEMCAP_NONE;
			ok = 1;
		} else if (sscanf(buf, "%llu", &x) == 1) {
			*v = x;
			ok = 1;
		}
	}
	fclose(f);
	return ok;
}

/*
 * The broker's cgroup in the hierarchy of version v, from /proc/self/cgroup: v2 is the line
 * "0::PATH", v1 the line whose controllers include memory. 0 or -ENOENT.
 */
static int self_cgroup(const char *root, int v, char *out, size_t len)
{
	char path[PATH_MAX], *line = NULL;
	size_t cap = 0;
	int err = -ENOENT;
	FILE *f;

	snprintf(path, sizeof(path), "%s/proc/self/cgroup", root);
	f = fopen(path, "re");
	if (!f)
		return -ENOENT;
	while (err && getline(&line, &cap, f) > 0) {
		char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;

		if (!c2)
			continue;
		*c1 = *c2 = '\0';
		c2[1 + strcspn(c2 + 1, "\n")] = '\0';
		if (v == 2 ? !strcmp(line, "0") && !c1[1] : has_word(c1 + 1, "memory"))
			err = snprintf(out, len, "%s", c2 + 1) < (int)len ? 0 : -ENAMETOOLONG;
	}
	free(line);
	fclose(f);
	return err;
}

/* mountinfo escapes space, tab, newline and backslash as \ooo: undone in place. */
static void unescape(char *s)
{
	char *w = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*w++ = (char)((s[1] - '0') << 6 | (s[2] - '0') << 3 | (s[3] - '0'));
			s += 3;
		} else {
			*w++ = *s;
		}
	}
	*w = '\0';
}

/*
 * Where the hierarchy of version v holding cgroup cg is mounted, from /proc/self/mountinfo:
 * its mount point into mnt and the length of the cgroup path it shows at that point (its
 * root: "/" on a host, "/docker/ID" in a container without a cgroup namespace) into *base,
 * so that mnt + (cg + *base) is cg's directory. 0 or -ENOENT.
 */
static int cgroup_mount(const char *root, int v, const char *cg, char *mnt, size_t len,
			size_t *base)
{
	char path[PATH_MAX], *line = NULL;
	size_t cap = 0;
	int err = -ENOENT;
	FILE *f;

	snprintf(path, sizeof(path), "%s/proc/self/mountinfo", root);
	f = fopen(path, "re");
	if (!f)
		return -ENOENT;
	while (err && getline(&line, &cap, f) > 0) {
		char *tok[16], *save = NULL, *t;
		int n = 0, dash = -1;

		for (t = strtok_r(line, " \n", &save); t && n < 16;
		     t = strtok_r(NULL, " \n", &save))
			tok[n++] = t;
		for (int i = 6; i < n && dash < 0; i++)
			if (!strcmp(tok[i], "-"))
				dash = i;
		if (dash < 0 || dash + 3 >= n)
			continue;
		if (v == 2 ? strcmp(tok[dash + 1], "cgroup2")
			   : strcmp(tok[dash + 1], "cgroup") || !has_word(tok[dash + 3], "memory"))
			continue;
		unescape(tok[3]);
		unescape(tok[4]);
		*base = strcmp(tok[3], "/") ? strlen(tok[3]) : 0;
		if (strncmp(cg, tok[3], *base) || (cg[*base] != '/' && cg[*base] != '\0'))
			continue; /* a bind mount of another part of the hierarchy */
		err = snprintf(mnt, len, "%s%s", root, tok[4]) < (int)len ? 0 : -ENAMETOOLONG;
	}
	free(line);
	fclose(f);
	return err;
}

/*
 * [cgroup] Walks from cg up to the mount's root in hierarchy v, keeping in m the level with
 * the least room. 0, or a negative errno (-ENOENT: the memory controller is not there).
 */
static int cgroup_walk(struct memcap *m, int v)
{
	static const char *const stat2[] = {"active_file", "inactive_file"};
	static const char *const stat1[] = {"total_active_file", "total_inactive_file"};
	char cg[512], mnt[PATH_MAX], dir[PATH_MAX], ctl[256];
	size_t base;
	uint64_t lim, x, use, rec;

	/* A cgroup outside our cgroup namespace's root shows as "/../..": not ours to walk. */
	if (self_cgroup(m->root, v, cg, sizeof(cg)) || strstr(cg, "/..") ||
	    cgroup_mount(m->root, v, cg, mnt, sizeof(mnt), &base))
		return -ENOENT;
	if (v == 2) { /* cgroup2 is mounted even where the memory controller is v1's */
		FILE *f;

		if (snprintf(dir, sizeof(dir), "%s/cgroup.controllers", mnt) >= (int)sizeof(dir))
			return -ENAMETOOLONG;
		f = fopen(dir, "re");
		if (!f)
			return -ENOENT;
		if (!fgets(ctl, sizeof(ctl), f))
			ctl[0] = '\0';
		fclose(f);
		ctl[strcspn(ctl, "\n")] = '\0';
		for (char *p = ctl; *p; p++)
			*p = *p == ' ' ? ',' : *p;
		if (!has_word(ctl, "memory"))
			return -ENOENT;
	}
	m->cg_version = v;
	snprintf(m->cg_path, sizeof(m->cg_path), "%s", cg[0] ? cg : "/");
	for (;;) {
		const char *file = NULL;
		char *slash;

		if (snprintf(dir, sizeof(dir), "%s%s", mnt, cg + base) >= (int)sizeof(dir))
			break; /* nothing is that deep; a wrong file is worse than none */
		lim = MEMCAP_NONE;
		if (v == 2) {
			if (read_value(dir, "memory.max", &x) && x < lim) {
				lim = x;
				file = "memory.max";
			}
			if (read_value(dir, "memory.high", &x) && x < lim) {
				lim = x;
				file = "memory.high";
			}
		} else if (read_value(dir, "memory.limit_in_bytes", &x) && x < CG1_UNLIMITED) {
			lim = x;
			file = "memory.limit_in_bytes";
		}
		if (file) {
			char sp[PATH_MAX + 16];
			uint64_t used, room;

			if (!read_value(dir, v == 2 ? "memory.current" : "memory.usage_in_bytes",
					&use))
				use = 0;
			snprintf(sp, sizeof(sp), "%s/memory.stat", dir);
			read_keys(sp, v == 2 ? stat2 : stat1, 2, &rec);
			used = use > rec ? use - rec : 0;
			room = lim > used ? lim - used : 0;
			if (room < m->cg_room) {
				m->cg_room = room;
				m->cg_limit = lim;
				m->cg_file = file;
				snprintf(m->cg_path, sizeof(m->cg_path), "%s", cg[0] ? cg : "/");
			}
		}
		if (strlen(cg) <= base)
			break; /* the mount's root: what is above it cannot be seen */
		slash = strrchr(cg, '/');
		*(slash && slash > cg + base ? slash : cg + base) = '\0';
	}
	return 0;
}

void memcap_probe(const char *root, struct memcap *m)
{
	static const char *const avail[] = {"MemAvailable"}, *const vm[] = {"VmSize"};
	char path[PATH_MAX];
	struct rlimit rl;
	uint64_t v;

	memset(m, 0, sizeof(*m));
	snprintf(m->root, sizeof(m->root), "%s", root);
	m->avail = m->cg_room = m->cg_limit = m->as_limit = m->as_room = MEMCAP_NONE;
	snprintf(path, sizeof(path), "%s/proc/meminfo", root);
	if (read_keys(path, avail, 1, &v))
		m->avail = v;
	/* The memory controller is in one hierarchy: v2's where it is enabled there, else v1's. */
	if (cgroup_walk(m, 2))
		cgroup_walk(m, 1);
	if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
		snprintf(path, sizeof(path), "%s/proc/self/status", root);
		if (!read_keys(path, vm, 1, &v))
			v = 0;
		m->as_limit = rl.rlim_cur;
		m->as_room = rl.rlim_cur > v ? rl.rlim_cur - v : 0;
	}
}

const char *memcap_root(void)
{
#ifdef KVB_TEST_HOOKS
	const char *r = getenv("KVB_TEST_MEMCAP_ROOT");

	if (r)
		return r;
#endif
	return "";
}

struct taken {
	int node;
	uint64_t taken[2]; /* 1 GiB pages, 2 MiB pages */
};

void memcap_need(const struct memcap *m, enum hp_mode mode, const struct numa_plan *plan,
		 uint32_t nplans, struct memcap_need *need)
{
	/* Pages already given to an arena, per node (-1: the system's): the nodes of the
	 * topology and -1 at most. */
	struct taken t[NUMA_NODES_MAX + 1];
	uint32_t nt = 0;
	int huge = mode != HP_MODE_OFF && mode != HP_MODE_COLLAPSE;

	memset(need, 0, sizeof(*need));
	for (uint32_t k = 0; k < nplans; k++) {
		for (uint32_t i = 0; i < plan[k].n; i++) {
			int node = plan[k].interleave ? -1 : plan[k].node[i];
			uint64_t size = plan[k].size[i], nfree[2], sizes[2];
			uint32_t j = 0;

			need->total += size;
			if (!huge)
				continue;
			while (j < nt && t[j].node != node)
				j++;
			if (j == nt && nt < NUMA_NODES_MAX + 1)
				t[nt++] = (struct taken){.node = node};
			if (j == nt)
				continue; /* cannot happen: a plan names no more nodes */
			nfree[0] = hugepage_free(m->root, HP_1G, node);
			nfree[1] = hugepage_free(m->root, HP_2M, node);
			for (int s = 0; s < 2; s++)
				nfree[s] = nfree[s] > t[j].taken[s] ? nfree[s] - t[j].taken[s] : 0;
			if (!hugepage_pick(mode, size, nfree, sizes))
				continue;
			t[j].taken[sizes[0] == HP_1G ? 0 : 1] += size / sizes[0];
			need->hugetlb += size;
		}
	}
	if (huge)
		need->hugetlb_free = hugepage_free(m->root, HP_2M, -1) * HP_2M +
				     (mode == HP_MODE_2M
					      ? 0
					      : hugepage_free(m->root, HP_1G, -1) * HP_1G);
}

uint64_t memcap_headroom(uint64_t pool)
{
	return add_sat(MEMCAP_HEADROOM_MIN, pool / MEMCAP_HEADROOM_DIV);
}

/* The largest pool P with P + memcap_headroom(P) <= b. */
static uint64_t pool_within(uint64_t b)
{
	if (b <= MEMCAP_HEADROOM_MIN)
		return 0;
	return (b - MEMCAP_HEADROOM_MIN) / (MEMCAP_HEADROOM_DIV + 1) * MEMCAP_HEADROOM_DIV;
}

uint64_t memcap_max_pool(const struct memcap *m, const struct memcap_need *need)
{
	uint64_t ram = min_u64(m->avail, m->cg_room), max = MEMCAP_NONE;

	/* RAM holds the pool less what hugetlb pages back, and the headroom... */
	if (ram != MEMCAP_NONE)
		max = pool_within(add_sat(ram, need->hugetlb));
	/* ...the address space all of it. */
	if (m->as_room != MEMCAP_NONE)
		max = min_u64(max, pool_within(m->as_room));
	return max;
}

char *memcap_explain(const struct memcap *m, const struct memcap_need *need, uint64_t max,
		     char *out, size_t len)
{
	char a[32], b[32];
	size_t n = 0;

#define PUT(...)                                                                                   \
	do {                                                                                       \
		if (n < len)                                                                       \
			n += (size_t)snprintf(out + n, len - n, __VA_ARGS__);                      \
	} while (0)
	out[0] = '\0';
	if (m->avail != MEMCAP_NONE)
		PUT("MemAvailable %s", text_bytes((double)m->avail, a, sizeof(a)));
	else
		PUT("MemAvailable unknown");
	if (!m->cg_version)
		PUT("; no memory cgroup");
	else if (!m->cg_file)
		PUT("; cgroup %s %s unlimited", m->cg_path,
		    m->cg_version == 2 ? "memory.max" : "memory.limit_in_bytes");
	else
		PUT("; cgroup %s %s %s, %s of it free", m->cg_path, m->cg_file,
		    text_bytes((double)m->cg_limit, a, sizeof(a)),
		    text_bytes((double)m->cg_room, b, sizeof(b)));
	if (m->as_limit != MEMCAP_NONE)
		PUT("; RLIMIT_AS %s, %s of it free", text_bytes((double)m->as_limit, a, sizeof(a)),
		    text_bytes((double)m->as_room, b, sizeof(b)));
	if (need->hugetlb)
		PUT("; hugetlb pages back %s of the pool",
		    text_bytes((double)need->hugetlb, a, sizeof(a)));
	else if (need->hugetlb_free)
		PUT("; hugetlb pages free %s, too few for an arena",
		    text_bytes((double)need->hugetlb_free, a, sizeof(a)));
	PUT("; headroom %s",
	    text_bytes((double)memcap_headroom(max != MEMCAP_NONE ? max : need->total), a,
		       sizeof(a)));
#undef PUT
	return out;
}
