// SPDX-License-Identifier: MIT
/*
 * bg.c - the broker's background thread: populating the mappings of clients' buffers at
 * registration and unmapping what disconnecting clients leave, off the loop thread.
 *
 * Why: the loop serves every client, and both are long. A client's fresh 512 MiB buffer faulted
 * in by the copies that first touch it costs ~130k faults of 1-2 us on the copy path (measured
 * with `kvbbench --procs 8 --layout kimi mla-tp`: about 80% of the load phase); populating it
 * here, right after registration, overlaps that with the client's own start-up and takes it
 * off the copies. Unmapping a dead session's buffers frees their page tables (and, for the last
 * reference, their memory): tens of milliseconds for GiBs, which the loop used to spend while
 * every other client waited.
 *
 * Safety. Jobs run in FIFO order on one thread, so a buffer's populate always runs before its
 * unmap and never on an address the kernel handed to someone else. Populating races with
 * nothing: faults into a shared mapping of a sealed memfd change no byte, and copies may run
 * into the mapping meanwhile. A failed populate (a kernel before 5.14 lacks
 * MADV_POPULATE_WRITE) only leaves the faults to the copies, as before.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bg.h"
#include "log.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define BG_NICE 10 /* the thread's nice value, relative to 0 ([bg-nice]) */

enum bg_kind { BG_POPULATE, BG_UNMAP };

struct bg_job {
	struct bg_job *next;
	enum bg_kind kind;
	void *addr;
	size_t len;
};

struct bg {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct bg_job *head, **tail;
	size_t pending; /* queued or running */
	int stop;
	pthread_t tid;
};

static void bg_run(const struct bg_job *j)
{
	if (j->kind == BG_UNMAP)
		munmap(j->addr, j->len);
	else if (madvise(j->addr, j->len, MADV_POPULATE_WRITE) < 0 && errno != EINVAL)
		log_debug("populate %zu bytes: %d", j->len, errno);
}

/* KVB_BG_NICE (0..19) overrides BG_NICE: A/B runs of the same build. */
static int bg_nice(void)
{
	const char *e = getenv("KVB_BG_NICE");

	return e && *e >= '0' && *e <= '9' ? atoi(e) : BG_NICE;
}

static void *bg_main(void *arg)
{
	struct bg *g = arg;

	/*
	 * [bg-nice] Below the copy workers (nice 5): where no core is idle, the other clients'
	 * copies and the loop come before one client's page tables. TP=8 Kimi ranks that left
	 * as soon as their own pages were in had their buffers unmapped here, 10-20 ms each, while
	 * the others still loaded: at nice 0 that took the workers' CPU (load phase 131 -> 71 ms
	 * at --qd 16, noisy: docs/benchmarks.md). A populate that waits longer only leaves its
	 * first faults to the copies, as before there was this thread.
	 */
	if (setpriority(PRIO_PROCESS, (id_t)gettid(), bg_nice()) < 0)
		log_debug("bg thread: setpriority: %d", errno);
	pthread_mutex_lock(&g->lock);
	for (;;) {
		struct bg_job *j = g->head;

		if (!j) {
			if (g->stop)
				break;
			pthread_cond_wait(&g->cond, &g->lock);
			continue;
		}
		g->head = j->next;
		if (!g->head)
			g->tail = &g->head;
		pthread_mutex_unlock(&g->lock);
		bg_run(j);
		free(j);
		pthread_mutex_lock(&g->lock);
		g->pending--;
	}
	pthread_mutex_unlock(&g->lock);
	return NULL;
}

struct bg *bg_start(void)
{
	struct bg *g = calloc(1, sizeof(*g));

	if (!g)
		return NULL;
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cond, NULL);
	g->tail = &g->head;
	if (pthread_create(&g->tid, NULL, bg_main, g)) {
		pthread_cond_destroy(&g->cond);
		pthread_mutex_destroy(&g->lock);
		free(g);
		return NULL;
	}
	return g;
}

void bg_stop(struct bg *g)
{
	if (!g)
		return;
	pthread_mutex_lock(&g->lock);
	g->stop = 1;
	pthread_cond_signal(&g->cond);
	pthread_mutex_unlock(&g->lock);
	pthread_join(g->tid, NULL);
	pthread_cond_destroy(&g->cond);
	pthread_mutex_destroy(&g->lock);
	free(g);
}

static void bg_push(struct bg *g, enum bg_kind kind, void *addr, size_t len)
{
	struct bg_job *j = g ? malloc(sizeof(*j)) : NULL;

	if (!j) {
		if (kind == BG_UNMAP)
			munmap(addr, len); /* no thread, or no memory: the old way */
		return;
	}
	*j = (struct bg_job){.kind = kind, .addr = addr, .len = len};
	pthread_mutex_lock(&g->lock);
	*g->tail = j;
	g->tail = &j->next;
	g->pending++;
	pthread_cond_signal(&g->cond);
	pthread_mutex_unlock(&g->lock);
}

void bg_populate(struct bg *g, void *addr, size_t len)
{
	bg_push(g, BG_POPULATE, addr, len);
}

void bg_unmap(struct bg *g, void *addr, size_t len)
{
	bg_push(g, BG_UNMAP, addr, len);
}

size_t bg_pending(struct bg *g)
{
	size_t n;

	if (!g)
		return 0;
	pthread_mutex_lock(&g->lock);
	n = g->pending;
	pthread_mutex_unlock(&g->lock);
	return n;
}
