// SPDX-License-Identifier: MIT
/*
 * pool.c - the pool's arenas: sealed memfds, bound to their NUMA node, huge pages where
 * available, prefaulted in parallel.
 *
 * Lifecycle of an arena (pool_create), in this order because each step needs the one before:
 *   1. memfd_create("<name>.<i>", MFD_ALLOW_SEALING [| MFD_HUGETLB | MFD_HUGE_2MB/1GB]) and
 *      ftruncate to its size. A memfd has no name in any namespace: nothing outlives the
 *      broker except what clients still map (they keep reading their leases after a crash;
 *      the kernel frees the memory with the last mapping), so there is no orphan to find or
 *      reclaim, and nothing limits it but memory (not the size of /dev/shm). Hugetlb is tried
 *      only with enough free pages on the node (hugepage.c); its mmap reserves them, and a
 *      failed reservation falls back to the next backing;
 *   2. mmap MAP_SHARED read-write: the broker's only writable mapping;
 *   3. mbind to the arena's node (or interleave) before the first touch. On a tmpfs memfd the
 *      policy belongs to the file, so fallocate and every fault follow it; on hugetlb it is the
 *      broker's mapping's, which is where every page is first touched (prefault or a PUT);
 *   4. MADV_HUGEPAGE where THP for shared memory is allowed and hugetlb was not available;
 *   5. without prefault, fallocate reserves the memory so that a pool the machine cannot hold
 *      is a start-up error rather than a SIGBUS at some later PUT (hugetlb: the mmap reserved);
 *   6. seal F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, and F_SEAL_FUTURE_WRITE unless the pool
 *      is kept [keep] or sparse [tenant-lend] (tenant partitions: memory taken and given back
 *      slab by slab with fallocate and hole punching, which FUTURE_WRITE forbids; no step 5,
 *      no hugetlb or THP, no prefault; read-only to clients as a kept pool is, below). Mappings made before FUTURE_WRITE keep their write access (the
 *      broker's, step 2); from then on no one can write() the file, mmap it writable,
 *      mprotect a mapping to PROT_WRITE, resize it or punch a hole in it, whatever fd they
 *      hold, and no further seal can be added.
 * Clients get a separate O_RDONLY open of the memfd (pool_ro_fd, through /proc/self/fd).
 *
 * [keep] A pool that is to outlive its broker (the default; --no-pool-keep turns it off) cannot
 * carry F_SEAL_FUTURE_WRITE: the broker that adopts it must map it writable again, and that
 * seal forbids every new writable mapping, the adopter's too. What keeps clients read-only
 * then: their fd is an O_RDONLY open (no writable mmap, no write(), no mprotect to PROT_WRITE,
 * no fallocate; SHRINK and GROW stay sealed whatever the fd), and the inode is made mode 0400,
 * owned by the broker's uid, so that a writable reopen through /proc/self/fd/N fails for every
 * other uid (a memfd's inode is otherwise 0777), and no other uid can chmod it back. The writable
 * fds exist only in the broker, in its keeper (keeper.c) or in systemd's fd store, none of
 * which a client can reach (the broker is not dumpable; the keeper neither, and it answers only
 * its own uid). Processes of the broker's own uid (and root) can chmod the inode and so write
 * the pool: that is the difference from a FUTURE_WRITE pool, and why docs/operations.md runs
 * the broker as its own user with engines admitted by --group. The side table (pagehdr.c) is a
 * memfd of its own, mode 0600, sent to no client.
 * Then pool_prefault populates the arenas with threads bound to their node; a CUDA copy engine
 * registers them with the driver afterwards (copy_cuda.c). The single-instance guarantee that the flock on
 * a named pool used to give is the lock file next to the socket (main.c).
 *
 * Called on the start-up thread (the loop thread later only reads the arena table).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/memfd.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "dir.h"
#include "log.h"
#include "pagehdr.h"
#include "pool.h"

static_assert(PMETA_MAX_ARENAS == POOL_MAX_ARENAS, "the side table records every arena");

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

#define POOL_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)
#define POOL_SEALS_KEEP (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) /* [keep] */
#ifndef HUGETLBFS_MAGIC
#define HUGETLBFS_MAGIC 0x958458f6
#endif
#define PREFAULT_MIN_CHUNK (256ull << 20)
#define PREFAULT_MAX_THREADS 16u

/*
 * A tmpfs memfd mapped at a 2 MiB boundary, so that 2 MiB of the file lie in 2 MiB of ours
 * and a huge page of it can be mapped whole (one TLB entry); the kernel places such mappings
 * so only where shared-memory THP is on, and MADV_COLLAPSE refuses a range that is not
 * (EINVAL). Hugetlb memfds are placed by the kernel at their own page size.
 */
static void *map_aligned(int fd, uint64_t size)
{
	uint8_t *r = mmap(NULL, size + HP_2M, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), *at;

	if (r == MAP_FAILED)
		return r;
	at = (uint8_t *)(((uintptr_t)r + HP_2M - 1) & ~(uintptr_t)(HP_2M - 1));
	if (at > r)
		munmap(r, (size_t)(at - r));
	munmap(at + size, (size_t)(r + HP_2M - at));
	r = mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
	if (r == MAP_FAILED) {
		int e = errno;

		munmap(at, size); /* the reservation */
		errno = e;
	}
	return r;
}

/* Creates, sizes and maps a memfd with these flags; 0 or a negative errno (nothing left). */
static int arena_map(struct pool_arena *a, unsigned flags)
{
	int err;

	a->fd = memfd_create(a->name, MFD_CLOEXEC | MFD_ALLOW_SEALING | flags);
	if (a->fd < 0)
		return -errno;
	if (ftruncate(a->fd, (off_t)a->size) < 0)
		goto err_close;
	a->base = flags ? mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0)
			: map_aligned(a->fd, a->size);
	if (a->base != MAP_FAILED)
		return 0;
err_close:
	err = -errno;
	close(a->fd);
	a->fd = -1;
	a->base = NULL;
	return err;
}

/* Steps 1-4 of the file comment: a mapped, bound arena on the best backing available. */
static int arena_back(struct pool *p, struct pool_arena *a, enum hp_mode mode, int strict)
{
	uint64_t sizes[2], want;
	/* [tenant-lend] Hugetlb pages cannot be lent a slab at a time: sparse arenas never. */
	int n = p->sparse ? 0
			  : hugepage_candidates(mode, a->size, p->interleave ? -1 : a->node, sizes),
	    err;

	for (int i = 0; i < n; i++) {
		unsigned f = MFD_HUGETLB | (sizes[i] == HP_1G ? MFD_HUGE_1GB : MFD_HUGE_2MB);

		err = arena_map(a, f);
		if (!err) {
			a->page_size = sizes[i];
			a->backing = HP_BACK_HUGETLB;
			break;
		}
		log_warn("pool: %s: hugetlb %s pages: %s; trying the next backing", a->name,
			 hugepage_name(sizes[i]), strerror(-err));
	}
	if (!a->base) {
		err = arena_map(a, 0);
		if (err)
			return err;
		a->page_size = 4096;
		a->backing = HP_BACK_PAGES;
	}
	err = numa_bind_memory(a->base, a->size, a->node, p->interleave, &p->topo);
	if (err && strict)
		return err;
	if (err) {
		/* --numa auto where mbind is not allowed (a container's seccomp filter): run
		 * unbound rather than not at all. */
		log_warn("pool: %s: cannot bind to node %d (%s): memory left unbound", a->name,
			 a->node, strerror(-err));
		a->node = -1;
	}
	/* [tenant-lend] Not for sparse arenas: a slab's memory is exactly its 4 KiB pages, given
	 * back whole (a hole punched in a huge page splits it). */
	if (a->backing == HP_BACK_PAGES && mode != HP_MODE_OFF && !p->sparse &&
	    hugepage_thp_shmem() && madvise(a->base, a->size, MADV_HUGEPAGE) == 0) {
		a->page_size = HP_2M;
		a->backing = HP_BACK_THP;
	}
	a->collapse = a->backing == HP_BACK_PAGES && mode == HP_MODE_COLLAPSE;
	/*
	 * Readers copy out of their map of the pool (directory GETs, leases): with 4 KiB pages
	 * one TLB miss per 4 KiB made those copies 10% slower than memcpy between private
	 * buffers, with THP 14% faster (64 KiB pages; docs/benchmarks.md, "Huge pages for
	 * the pool"). Said once.
	 */
	if (mode == HP_MODE_AUTO && a->backing == HP_BACK_PAGES && !p->told_pages && !p->sparse) {
		p->told_pages = 1;
		log_info(
			"pool: %s: 4 KiB pages (no free hugetlb pages, THP for shared memory off): "
			"reads out of the pool map run slower; reserve hugetlb pages or start with "
			"--hugepages collapse (docs/operations.md, \"Huge pages\")",
			a->name);
	}
	want = mode == HP_MODE_1G ? HP_1G : mode == HP_MODE_2M ? HP_2M : 0;
	if (want && !p->sparse && (a->backing != HP_BACK_HUGETLB || a->page_size != want))
		log_warn("pool: %s: not enough free hugetlb pages for --hugepages %s on node %d "
			 "(see /sys/kernel/mm/hugepages; 1G needs an arena of whole GiB): using %s",
			 a->name, hugepage_name(want), a->node,
			 a->backing == HP_BACK_HUGETLB ? "2 MiB hugetlb pages"
			 : a->backing == HP_BACK_THP   ? "transparent huge pages"
						       : "4 KiB pages");
	return 0;
}

/* Appends the arenas of plan to p as a new partition. */
static int arenas_create(struct pool *p, const char *name, const struct numa_plan *plan,
			 enum hp_mode mode, int reserve)
{
	struct pool_part *pt = &p->part[p->nparts];
	/* [tenant-lend] Sparse arenas give memory back by punching holes, which FUTURE_WRITE
	 * forbids: they are kept read-only for clients as a kept pool is [keep]. */
	int seals = p->keep || p->sparse ? POOL_SEALS_KEEP : POOL_SEALS;
	int err = 0;

	if (p->nparts == POOL_MAX_PARTS || p->narenas + plan->n > POOL_MAX_ARENAS)
		return -E2BIG;
	pt->first = p->narenas;
	pt->narenas = 0;
	pt->size = 0;
	pt->vsize = 0;
	p->nparts++;
	p->interleave = plan->interleave;
	for (uint32_t i = 0; i < plan->n && !err; i++) {
		struct pool_arena *a = &p->arena[p->narenas];

		a->fd = -1;
		a->node = plan->node[i];
		a->size = plan->size[i];
		a->part = p->nparts - 1;
		if (snprintf(a->name, sizeof(a->name), "%s.%u", name, p->narenas) >=
		    (int)sizeof(a->name)) {
			err = -ENAMETOOLONG;
			break;
		}
		err = arena_back(p, a, mode, plan->strict);
		if (!err && reserve && !p->sparse && a->backing != HP_BACK_HUGETLB &&
		    fallocate(a->fd, 0, 0, (off_t)a->size) < 0)
			err = -errno;
		if (!err && fcntl(a->fd, F_ADD_SEALS, seals) < 0)
			err = -errno;
		if (!err && (p->keep || p->sparse) && fchmod(a->fd, 0400) < 0) /* [keep] */
			err = -errno;
		if (a->base) { /* pool_close undoes even a half-made arena */
			p->narenas++;
			p->total += a->size;
			pt->narenas++;
			pt->size += a->size;
			pt->vsize += a->size;
		} else if (a->fd >= 0) {
			close(a->fd);
		}
	}
	if (err)
		pool_close(p);
	return err;
}

int pool_plan(const struct pool_cfg *cfg, const struct numa_topo *topo, struct numa_plan *plan)
{
	uint32_t n = cfg->nparts > 1 ? cfg->nparts : 1;

	/* 2 MiB multiples; 1 GiB pages only back arenas that happen to be 1 GiB multiples. Each
	 * tenant partition is planned over the nodes like a pool of its own [tenant-part]. */
	for (uint32_t i = 0; i < n; i++) {
		int err = numa_plan_make(topo, cfg->numa,
					 cfg->nparts > 1 ? cfg->part_size[i] : cfg->size, HP_2M,
					 &plan[i]);

		if (err)
			return err;
	}
	return (int)n;
}

int pool_create(struct pool *p, const struct pool_cfg *cfg)
{
	struct numa_plan plan[POOL_MAX_PARTS];
	int n, err;

	memset(p, 0, sizeof(*p));
	p->meta_fd = -1;
	p->keep = cfg->keep;
	p->sparse = cfg->sparse;
	if (p->sparse && (cfg->hugepage == HP_MODE_2M || cfg->hugepage == HP_MODE_1G)) {
		/* Said by main.c before it gets here; a safety net for other callers. */
		return -EOPNOTSUPP;
	}
	numa_topo_probe(&p->topo);
	if (p->topo.skipped)
		log_warn("pool: %u NUMA nodes with memory beyond the first %u are not used",
			 p->topo.skipped, NUMA_NODES_MAX);
	n = pool_plan(cfg, &p->topo, plan);
	if (n < 0)
		return n;
	for (int i = 0; i < n; i++) {
		err = arenas_create(p, cfg->name, &plan[i], cfg->hugepage, !cfg->prefault);
		if (err)
			return err;
		/* [dir] At byte 0 of the partition's first arena, where an adopter looks. */
		if (cfg->dir)
			p->arena[p->part[i].first].dir_bytes = dir_bytes_for(p->part[i].vsize);
	}
	if (p->sparse) {
		for (int i = 0; i < n; i++)
			p->part[i].size = cfg->part_share[i];
		pool_sparse_budget(p);
	}
	if (p->keep) {
		err = pool_meta_create(p, cfg->slab_bytes);
		if (err)
			return err;
	}
	for (uint32_t i = 0; i < p->narenas; i++) {
		const struct pool_arena *a = &p->arena[i];

		log_info("pool: arena %u: %llu MiB on node %d%s, partition %u, %s pages (%s)", i,
			 (unsigned long long)(a->size >> 20), a->node,
			 p->interleave ? " (interleaved over all nodes)" : "", a->part,
			 hugepage_name(a->page_size), hugepage_backing_name(a->backing));
	}
	return 0;
}

int pool_open(struct pool *p, const char *name, uint64_t size, uint32_t narenas)
{
	struct numa_plan plan = {.n = narenas};

	memset(p, 0, sizeof(*p));
	p->meta_fd = -1;
	if (!narenas || narenas > KVB_MAX_ARENAS || !size)
		return -EINVAL;
	for (uint32_t i = 0; i < narenas; i++) {
		plan.node[i] = -1;
		plan.size[i] = (size / narenas + HP_2M - 1) & ~(HP_2M - 1);
	}
	return arenas_create(p, name[0] == '/' ? name + 1 : name, &plan, HP_MODE_OFF, 1);
}

/*
 * [tenant-rebind] A released partition is bound to a new tenant in fresh memfds, never in the
 * old ones: a process of the old tenant may still map them (and hold their fds), and nothing
 * the broker does can take that map away. pool_arena_fresh makes the new file of arena i,
 * sealed and 0400 as arenas_create makes a sparse one, not mapped yet: it can be handed to the
 * keeper and the fd store first, so that a crash at any step leaves them an empty file or the
 * old (emptied) one, never a page the side table does not vouch for. pool_arena_switch then
 * empties the old file whole (its memory goes back even while old maps remain: they read
 * zeros), maps the new one over the broker's mapping of the old (MAP_FIXED, the same base:
 * every pointer into the arena stays valid), binds it to the arena's node and closes the old.
 */
int pool_arena_fresh(const struct pool *p, uint32_t i, int *fd)
{
	const struct pool_arena *a = &p->arena[i];
	int err;

	*fd = -1;
	if (i >= p->narenas || !p->sparse)
		return -EINVAL;
	*fd = memfd_create(a->name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (*fd < 0) {
		err = -errno;
		*fd = -1;
		return err;
	}
	if (ftruncate(*fd, (off_t)a->size) < 0 || fcntl(*fd, F_ADD_SEALS, POOL_SEALS_KEEP) < 0 ||
	    fchmod(*fd, 0400) < 0) {
		err = -errno;
		close(*fd);
		*fd = -1;
		return err;
	}
	return 0;
}

int pool_arena_switch(struct pool *p, uint32_t i, int fd)
{
	struct pool_arena *a = &p->arena[i];
	int err;

	/* The old file first: whoever still maps it sees holes (zeros) from now on. */
	if (fallocate(a->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)a->size) < 0)
		log_warn("pool: %s: cannot empty the old file (fallocate: %s): its memory goes "
			 "with its last map",
			 a->name, strerror(errno));
	if (mmap(a->base, a->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) !=
	    a->base)
		return -errno; /* the caller cannot go on: the broker's map is undefined now */
	/* On a tmpfs memfd the policy belongs to the file: before anything touches it. */
	err = numa_bind_memory(a->base, a->size, a->node, p->interleave, &p->topo);
	if (err)
		log_warn("pool: %s: cannot bind the new file to node %d (%s): memory left unbound",
			 a->name, a->node, strerror(-err));
	close(a->fd);
	a->fd = fd;
	return 0;
}

struct prefault_job {
	pthread_t tid;
	uint8_t *base;
	uint64_t len;
	uint64_t page_size;
	int node;
	int err;
	uint32_t arena;
	int collapse;	   /* [collapse] */
	uint64_t refused;  /* 2 MiB ranges MADV_COLLAPSE refused */
	int refused_errno; /* the first refusal's */
};

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

/*
 * [collapse] --hugepages collapse: each 2 MiB of the arena made into one transparent huge page,
 * after the prefault. MADV_COLLAPSE (Linux 6.1) is not bound by shmem_enabled ("never" on many
 * distributions), and 2 MiB that are one page are also 2 MiB of contiguous memory, where a
 * 4 KiB pool's pages are a draw (docs/operations.md, "Huge pages"): on this project's VM, 1 MiB
 * reads into a reused destination ran at 21.7 GB/s out of a 4 KiB pool, 23.7 out of a collapsed
 * one and 23.6 out of hugetlb pages, side by side (docs/benchmarks.md). It copies every page it
 * collapses: start-up takes about a second more per GiB and prefault thread (2 GiB: 1.2 -> 3.1 s
 * on two), which is why it is asked for rather than the default. A range the kernel refuses
 * stays on 4 KiB pages.
 */
static void collapse(struct prefault_job *j)
{
	/* A job's share starts and ends on 2 MiB (map_aligned, pool_prefault's unit). */
	for (uint64_t off = 0; off < j->len; off += HP_2M) {
		if (madvise(j->base + off, HP_2M, MADV_COLLAPSE) == 0)
			continue;
		if (!j->refused++)
			j->refused_errno = errno;
	}
}

static void *prefault_thread(void *arg)
{
	struct prefault_job *j = arg;

	/* Faults allocate on the node the policy names anyway; running there keeps the zeroing
	 * local (and on a busy machine, off the other node's CPUs). */
	numa_bind_thread(j->node);
	if (madvise(j->base, j->len, MADV_POPULATE_WRITE) < 0) {
		if (errno != EINVAL) { /* EINVAL: a kernel before 5.14, which lacks it */
			j->err = -errno;
			return NULL;
		}
		for (uint64_t off = 0; off < j->len; off += j->page_size)
			((volatile uint8_t *)j->base)[off] = 0;
	}
	if (j->collapse)
		collapse(j);
	return NULL;
}

/* [collapse] What the arenas became: 2 MiB pages where every range collapsed, said either way. */
static void collapsed(struct pool *p, const struct prefault_job *jobs, uint32_t njobs)
{
	for (uint32_t i = 0; i < p->narenas; i++) {
		struct pool_arena *a = &p->arena[i];
		uint64_t refused = 0;
		int why = 0;

		if (!a->collapse)
			continue;
		for (uint32_t k = 0; k < njobs; k++) {
			if (jobs[k].arena != i || !jobs[k].refused)
				continue;
			if (!refused)
				why = jobs[k].refused_errno;
			refused += jobs[k].refused;
		}
		if (refused) {
			log_warn(
				"pool: %s: %llu of %llu MiB left on 4 KiB pages: MADV_COLLAPSE: %s "
				"(Linux 6.1 or later, THP built in, shmem_enabled not deny)",
				a->name, (unsigned long long)(refused * (HP_2M >> 20)),
				(unsigned long long)(a->size >> 20), strerror(why));
			continue;
		}
		a->page_size = HP_2M;
		a->backing = HP_BACK_THP;
		if (p->meta) { /* [pagehdr] the table says what backs it, for the adopter */
			struct pmeta_super *sb = p->meta;

			sb->arena[i].page_size = a->page_size;
			sb->arena[i].backing = (uint32_t)a->backing;
			pmeta_super_init(p->meta, p->meta_size);
		}
		log_info("pool: %s: collapsed into 2 MiB pages", a->name);
	}
}

int pool_prefault(struct pool *p)
{
	static struct prefault_job jobs[POOL_MAX_ARENAS * PREFAULT_MAX_THREADS];
	uint32_t njobs = 0;
	int err = 0;

	if (p->sparse) /* [tenant-lend] memory is taken slab by slab (store.c) */
		return 0;
	for (uint32_t i = 0; i < p->narenas; i++) {
		const struct pool_arena *a = &p->arena[i];
		uint32_t n = numa_node_cpus(a->node);
		uint64_t per, unit, off = 0;

		if (n > PREFAULT_MAX_THREADS)
			n = PREFAULT_MAX_THREADS;
		if (n > a->size / PREFAULT_MIN_CHUNK)
			n = a->size / PREFAULT_MIN_CHUNK ? (uint32_t)(a->size / PREFAULT_MIN_CHUNK)
							 : 1;
		unit = a->collapse ? HP_2M : a->page_size; /* [collapse] whole 2 MiB per thread */
		per = (a->size / n + unit - 1) / unit * unit;
		for (; off < a->size; off += per) {
			struct prefault_job *j = &jobs[njobs];

			*j = (struct prefault_job){.base = (uint8_t *)a->base + off,
						   .len = a->size - off < per ? a->size - off : per,
						   .page_size = a->page_size,
						   .node = a->node,
						   .arena = i,
						   .collapse = a->collapse};
			j->err = -pthread_create(&j->tid, NULL, prefault_thread, j);
			if (j->err) {
				prefault_thread(j); /* no thread: do it here */
				j->tid = 0;
			}
			njobs++;
		}
	}
	for (uint32_t i = 0; i < njobs; i++) {
		if (jobs[i].tid)
			pthread_join(jobs[i].tid, NULL);
		if (jobs[i].err && !err)
			err = jobs[i].err;
	}
	if (!err)
		collapsed(p, jobs, njobs);
	return err;
}

void pool_sparse_budget(struct pool *p)
{
	const struct pool_part *p0 = &p->part[0];

	/* Every partition is planned like the whole pool: its i-th arena on the pool's i-th
	 * node, as large. The directories are memory too. */
	memset(p->budget, 0, sizeof(p->budget));
	p->total = 0;
	for (uint32_t i = 0; i < p0->narenas && i < KVB_MAX_ARENAS; i++) {
		uint64_t dirs = 0;

		for (uint32_t q = 0; q < p->nparts; q++)
			if (i < p->part[q].narenas)
				dirs += p->arena[p->part[q].first + i].dir_bytes;
		p->total += p->arena[p0->first + i].size;
		p->budget[i] = p->arena[p0->first + i].size > dirs
				       ? p->arena[p0->first + i].size - dirs
				       : 0;
	}
}

int pool_ro_fd(const struct pool *p, uint32_t i)
{
	char path[64];
	int fd;

	if (i >= p->narenas)
		return -EINVAL;
	/* Reopen through /proc: a new open file description, read-only whatever the memfd's. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", p->arena[i].fd);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

int pool_meta_create(struct pool *p, uint64_t slab_bytes)
{
	struct pmeta_super *sb;
	uint64_t units = 0;
	char name[112];
	int err;

	for (uint32_t i = 0; i < p->narenas; i++) {
		p->arena[i].unit0 = units;
		units += p->arena[i].size / PHDR_UNIT;
	}
	p->meta_size = pmeta_size(units);
	snprintf(name, sizeof(name), "%.90s.meta", p->arena[0].name);
	p->meta_fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (p->meta_fd < 0)
		return -errno;
	/* Sparse: tmpfs allocates the table's pages as headers are first written. */
	if (ftruncate(p->meta_fd, (off_t)p->meta_size) < 0 || fchmod(p->meta_fd, 0600) < 0 ||
	    fcntl(p->meta_fd, F_ADD_SEALS, POOL_SEALS_KEEP) < 0)
		goto err_close;
	p->meta = mmap(NULL, p->meta_size, PROT_READ | PROT_WRITE, MAP_SHARED, p->meta_fd, 0);
	if (p->meta == MAP_FAILED)
		goto err_close;
	sb = p->meta;
	sb->narenas = p->narenas;
	sb->slab_bytes = slab_bytes;
	sb->resv[0] = p->sparse ? PMETA_SPARSE : 0; /* [tenant-lend] for the adopter */
	for (uint32_t i = 0; i < p->narenas; i++)
		sb->arena[i] = (struct pmeta_arena){
			.size = p->arena[i].size,
			.page_size = p->arena[i].page_size,
			.node = p->arena[i].node,
			.backing = (uint32_t)p->arena[i].backing,
			.tenant = p->arena[i].part,
			.dir_units = (uint32_t)(p->arena[i].dir_bytes / PHDR_UNIT)};
	pmeta_super_init(p->meta, p->meta_size);
	return 0;
err_close:
	err = -errno;
	close(p->meta_fd);
	p->meta_fd = -1;
	p->meta = NULL;
	return err;
}

/* The name a memfd was created with, from /proc/self/fd ("/memfd:NAME (deleted)"). */
static void memfd_name(int fd, char *out, size_t len)
{
	char path[64], t[160];
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, t, sizeof(t) - 1);
	t[n > 0 ? n : 0] = '\0';
	if (!strncmp(t, "/memfd:", 7))
		memmove(t, t + 7, strlen(t + 7) + 1);
	if (strstr(t, " (deleted)"))
		*strstr(t, " (deleted)") = '\0';
	snprintf(out, len, "%.*s", (int)len - 1, t);
}

int pool_adopt(struct pool *p, int *fds, uint32_t n, uint64_t slab_bytes)
{
	const struct pmeta_super *sb;
	struct stat st;
	uint64_t units = 0;
	int err = -EINVAL;

	memset(p, 0, sizeof(*p));
	numa_topo_probe(&p->topo);
	p->meta_fd = fds[0];
	p->keep = p->adopted = 1;
	for (uint32_t i = 1; i < n; i++) /* closed by pool_close from here on */
		p->arena[i - 1].fd = fds[i];
	if (fstat(p->meta_fd, &st) < 0 || st.st_size < (off_t)PHDR_UNIT || n < 2 ||
	    n - 1 > POOL_MAX_ARENAS)
		goto err_close;
	p->meta_size = (uint64_t)st.st_size;
	p->meta = mmap(NULL, p->meta_size, PROT_READ | PROT_WRITE, MAP_SHARED, p->meta_fd, 0);
	if (p->meta == MAP_FAILED) {
		p->meta = NULL;
		err = -errno;
		goto err_close;
	}
	sb = p->meta;
	if (pmeta_super_check(p->meta, p->meta_size) || sb->narenas != n - 1)
		goto err_close;
	if (sb->slab_bytes != slab_bytes) {
		err = -EXDEV;
		goto err_close;
	}
	for (uint32_t i = 0; i < sb->narenas; i++) {
		struct pool_arena *a = &p->arena[i];
		struct statfs sf;

		a->size = sb->arena[i].size;
		a->page_size = sb->arena[i].page_size;
		a->node = sb->arena[i].node;
		a->backing = (int)sb->arena[i].backing;
		a->part = sb->arena[i].tenant;
		a->dir_bytes = (uint64_t)sb->arena[i].dir_units * PHDR_UNIT;
		a->unit0 = units;
		units += a->size / PHDR_UNIT;
		/* [tenant-part] A partition's arenas are consecutive, numbered from 0. */
		if (a->part >= POOL_MAX_PARTS || a->part + 1 < p->nparts || a->part > p->nparts)
			goto err_close;
		if (a->part == p->nparts)
			p->part[p->nparts++] = (struct pool_part){.first = i};
		p->part[a->part].narenas++;
		p->part[a->part].size += a->size;
		p->part[a->part].vsize += a->size;
		memfd_name(a->fd, a->name, sizeof(a->name));
		/* The fds must be what the table says: a tmpfs or hugetlbfs file of its size. */
		if (fstat(a->fd, &st) < 0 || (uint64_t)st.st_size != a->size ||
		    fstatfs(a->fd, &sf) < 0 ||
		    (sf.f_type == HUGETLBFS_MAGIC) != (a->backing == HP_BACK_HUGETLB))
			goto err_close;
		/* [collapse] Its 2 MiB pages, if any, whole. */
		if (a->backing == HP_BACK_HUGETLB)
			a->base = mmap(NULL, a->size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
		else
			a->base = map_aligned(a->fd, a->size);
		if (a->base == MAP_FAILED) {
			a->base = NULL;
			err = -errno;
			goto err_close;
		}
		p->narenas++;
		p->total += a->size;
	}
	p->sparse = (sb->resv[0] & PMETA_SPARSE) != 0;
	if (p->sparse) /* the shares come from --tenants (tenant.c) */
		pool_sparse_budget(p);
	return 0;
err_close:
	for (uint32_t i = 0; i + 1 < n; i++) {
		if (p->arena[i].base)
			munmap(p->arena[i].base, p->arena[i].size);
		close(p->arena[i].fd);
		p->arena[i].base = NULL;
	}
	if (p->meta)
		munmap(p->meta, p->meta_size);
	close(p->meta_fd);
	p->meta = NULL;
	p->meta_fd = -1;
	p->narenas = 0;
	p->nparts = 0;
	p->total = 0;
	return err;
}

uint32_t pool_handover_fds(const struct pool *p, int *fds)
{
	uint32_t n = 0;

	if (p->meta_fd < 0)
		return 0;
	fds[n++] = p->meta_fd;
	for (uint32_t i = 0; i < p->narenas; i++)
		fds[n++] = p->arena[i].fd;
	return n;
}

void pool_close(struct pool *p)
{
	for (uint32_t i = 0; i < p->narenas; i++) {
		struct pool_arena *a = &p->arena[i];

		munmap(a->base, a->size);
		close(a->fd);
	}
	if (p->meta)
		munmap(p->meta, p->meta_size);
	if (p->meta_fd >= 0)
		close(p->meta_fd);
	p->meta = NULL;
	p->meta_fd = -1;
	p->narenas = 0;
	p->nparts = 0;
	p->total = 0;
}
