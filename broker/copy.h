/* SPDX-License-Identifier: MIT */
/*
 * copy.h - the copy-engine interface: moves a page between the pool and a client's registered
 * memory as a list of segments. Backends: host (memcpy, copy_host.c) now; CUDA (device copies
 * from the pinned pool, completion by events) plugs in behind the same calls.
 *
 * Contract: run() completes the job before returning and returns 0 or a negative errno. The
 * caller pins the page and keeps the buffer registered for the duration. Asynchronous backends
 * (CUDA streams polled by events) extend this with a submit/poll pair when they land; the ops
 * already pin around the copy, which is what asynchronous completion needs.
 */
#ifndef KVB_BROKER_COPY_H
#define KVB_BROKER_COPY_H

#include <stdint.h>

struct copy_seg {
	void *dst;
	const void *src;
	uint64_t len;
};

struct copy_engine {
	const char *name;
	int (*run)(struct copy_engine *e, const struct copy_seg *segs, uint32_t nsegs);
	void (*destroy)(struct copy_engine *e);
};

struct copy_engine *copy_host_create(void);

#endif /* KVB_BROKER_COPY_H */
