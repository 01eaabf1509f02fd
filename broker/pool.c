// SPDX-License-Identifier: MIT
/*
 * pool.c - arenas as named POSIX shared-memory objects.
 *
 * Lifecycle of an arena "/<name>.<i>":
 *   - create O_RDWR|O_CREAT|O_EXCL, then chmod 0400: the broker keeps its read-write fd, while
 *     nobody (of our uid, unless root) can open the name for writing any more;
 *   - flock(LOCK_EX|LOCK_NB): the lock lives as long as the broker process (the kernel drops it
 *     when the process dies, however it dies). An existing object whose lock is held belongs to
 *     a live broker: we refuse to run twice. One whose lock is free is the orphan of a broker
 *     that died: it is unlinked (its memory goes with the last client mapping it) and a fresh
 *     object is created O_EXCL, instead of leaking it. Re-adopting its pages is left to the
 *     warm-restart work;
 *   - ftruncate to its size and map shared read-write;
 *   - on clean exit: unmap, shm_unlink, close.
 * Clients get a separate O_RDONLY open of the same object (pool_ro_fd), so their mapping can
 * never be made writable (mmap PROT_WRITE and mprotect fail with EACCES).
 * Called on the loop thread only.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "pool.h"

/*
 * Deals with an existing object of our arena's name: a live broker's (its flock is held:
 * -EBUSY) or the orphan of one that died, which is unlinked - not truncated, because clients
 * of the dead broker may still map it and read their leases until they detach; the kernel frees
 * it with the last mapping. Returns 0 when the name is free again.
 */
static int orphan_reclaim(const char *name, int *reclaimed)
{
	struct stat st;
	int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0), err = 0;

	if (fd < 0)
		return errno == ENOENT ? 0 : -errno; /* gone meanwhile */
	if (flock(fd, LOCK_EX | LOCK_NB) < 0)
		err = errno == EWOULDBLOCK ? -EBUSY : -errno;
	else if (fstat(fd, &st) < 0)
		err = -errno;
	else if (st.st_uid != geteuid())
		err = -EPERM;
	if (!err) {
		log_warn("pool: reclaiming orphaned arena %s (%lld bytes) left by a broker that "
			 "died",
			 name, (long long)st.st_size);
		if (shm_unlink(name) < 0 && errno != ENOENT)
			err = -errno;
		(*reclaimed)++;
	}
	close(fd);
	return err;
}

static int arena_open(struct pool_arena *a, const char *name, uint64_t size, int *reclaimed)
{
	int fd = -1, err;

	if (snprintf(a->name, sizeof(a->name), "%s", name) >= (int)sizeof(a->name))
		return -ENAMETOOLONG;
	for (int tries = 0; fd < 0 && tries < 3; tries++) {
		fd = shm_open(a->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0 && errno != EEXIST)
			return -errno;
		if (fd < 0) {
			err = orphan_reclaim(a->name, reclaimed);
			if (err)
				return err;
		}
	}
	if (fd < 0)
		return -EBUSY; /* another broker keeps recreating it */
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		/* Another broker starting at this very moment took it: it is theirs now. */
		err = errno == EWOULDBLOCK ? -EBUSY : -errno;
		goto err_close;
	}
	/* Our read-write fd stays valid; nobody can open the name for writing any more. */
	if (fchmod(fd, 0400) < 0) {
		err = -errno;
		goto err_unlink;
	}
	/*
	 * Reserve the memory now: a tmpfs (/dev/shm) too small for a sparse object would let us
	 * start and then SIGBUS on the first PUT it cannot back. fallocate fails cleanly instead.
	 * (With NUMA placement, the memory policy must be set before this point.)
	 */
	if (ftruncate(fd, (off_t)size) < 0 || fallocate(fd, 0, 0, (off_t)size) < 0) {
		err = -errno;
		goto err_unlink;
	}
	a->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (a->base == MAP_FAILED) {
		err = -errno;
		goto err_unlink;
	}
	a->fd = fd;
	a->size = size;
	a->node = -1;
	return 0;

err_unlink:
	shm_unlink(a->name);
err_close:
	close(fd);
	return err;
}

int pool_open(struct pool *p, const char *name, uint64_t size, uint32_t narenas)
{
	uint64_t per, align = 2ull << 20;
	char an[96];
	int err = 0;

	memset(p, 0, sizeof(*p));
	if (!narenas || narenas > KVB_MAX_ARENAS || !size)
		return -EINVAL;
	/* Arenas are multiples of 2 MiB so huge pages and slabs line up. */
	per = (size / narenas + align - 1) & ~(align - 1);
	for (uint32_t i = 0; i < narenas; i++) {
		if (snprintf(an, sizeof(an), "%s.%u", name, i) >= (int)sizeof(an)) {
			err = -ENAMETOOLONG;
			break;
		}
		err = arena_open(&p->arena[i], an, per, &p->reclaimed);
		if (err)
			break;
		p->narenas++;
		p->total += per;
	}
	if (err)
		pool_close(p);
	return err;
}

void pool_prefault(struct pool *p)
{
	for (uint32_t i = 0; i < p->narenas; i++) {
		struct pool_arena *a = &p->arena[i];

		/*
		 * The memory is reserved (fallocate): this only builds the page tables. One call
		 * where the kernel has it (5.14+), else a write per page, which cannot fault.
		 */
		if (madvise(a->base, a->size, MADV_POPULATE_WRITE) == 0)
			continue;
		for (uint64_t off = 0; off < a->size; off += 4096)
			((volatile uint8_t *)a->base)[off] = 0;
	}
}

int pool_ro_fd(const struct pool *p, uint32_t i)
{
	char path[64];
	int fd;

	if (i >= p->narenas)
		return -EINVAL;
	/* Reopen through /proc so the new description is read-only whatever the name does. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d", p->arena[i].fd);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

void pool_close(struct pool *p)
{
	for (uint32_t i = 0; i < p->narenas; i++) {
		struct pool_arena *a = &p->arena[i];

		munmap(a->base, a->size);
		shm_unlink(a->name);
		close(a->fd);
	}
	p->narenas = 0;
	p->total = 0;
}
