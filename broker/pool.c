// SPDX-License-Identifier: MIT
/*
 * pool.c - arenas as named POSIX shared-memory objects.
 *
 * Lifecycle of an arena "/<name>.<i>":
 *   - open O_RDWR|O_CREAT, refuse objects owned by another uid, then chmod 0400: the broker
 *     keeps its read-write fd, while nobody (of our uid, unless root) can open the name for
 *     writing any more. A restarted broker finds its orphan at 0400, so it opens it read-only
 *     first to put the write bit back (it owns it);
 *   - flock(LOCK_EX|LOCK_NB): the lock lives as long as the broker process (the kernel drops it
 *     when the process dies, however it dies). Failing to get it means a live broker owns the
 *     arena: we refuse to run twice. Getting it on an object that already has a size means its
 *     owner crashed: the orphan is reclaimed (truncated to zero, which frees its memory, then
 *     sized again) instead of leaking. Re-adopting its pages is left to the warm-restart work;
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

static int arena_open(struct pool_arena *a, const char *name, uint64_t size, int *reclaimed)
{
	struct stat st;
	int fd, err;

	if (snprintf(a->name, sizeof(a->name), "%s", name) >= (int)sizeof(a->name))
		return -ENAMETOOLONG;
	fd = shm_open(a->name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0 && errno == EACCES) {
		/* An orphan of ours at 0400: make it writable again, then open it. */
		fd = shm_open(a->name, O_RDONLY | O_CLOEXEC, 0);
		if (fd < 0 || fchmod(fd, 0600) < 0) {
			err = -errno;
			if (fd >= 0)
				close(fd);
			return err;
		}
		close(fd);
		fd = shm_open(a->name, O_RDWR | O_CLOEXEC, 0);
	}
	if (fd < 0)
		return -errno;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		err = errno == EWOULDBLOCK ? -EBUSY : -errno;
		goto err_close;
	}
	if (fstat(fd, &st) < 0) {
		err = -errno;
		goto err_close;
	}
	if (st.st_uid != geteuid()) {
		err = -EPERM;
		goto err_close;
	}
	if (fchmod(fd, 0400) < 0) {
		err = -errno;
		goto err_close;
	}
	if (st.st_size > 0) {
		log_warn("pool: reclaiming orphaned arena %s (%lld bytes) left by a broker that "
			 "died",
			 a->name, (long long)st.st_size);
		if (ftruncate(fd, 0) < 0) {
			err = -errno;
			goto err_close;
		}
		(*reclaimed)++;
	}
	if (ftruncate(fd, (off_t)size) < 0) {
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

		/* One call where the kernel has it (5.14+), else a write per page. */
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
