/* SPDX-License-Identifier: MIT */
/*
 * disk.h - the disk tier's device side: the cache paths (files or block devices, O_DIRECT where
 * the file system allows it), their superblocks, and one io_uring with the pool registered as
 * fixed buffers, the paths as registered files and an eventfd the loop sleeps on. No policy
 * here: tier.c decides what to read and write. Loop thread only.
 */
#ifndef KVB_BROKER_DISK_H
#define KVB_BROKER_DISK_H

#include <liburing.h>
#include <stdint.h>
#include <sys/types.h>

#include "pool.h"
#include "slot.h"

#define DISK_MAX_PATHS 16

struct disk_path {
	char name[256];
	int fd;
	int direct;	     /* opened O_DIRECT */
	int blockdev;	     /* a block device, not a file */
	uint64_t bytes;	     /* bytes of it the cache uses, superblock included */
	uint64_t eof;	     /* file size found at open: a slot past it was cut short */
	int formatted;	     /* a fresh superblock was written at this start */
	int created;	     /* this start created the file (a failed start removes it) */
	int regular;	     /* a regular file (a failed start cuts it back to eof) */
	const char *why_new; /* why it was formatted (for the log) */
};

struct disk_cfg {
	const char *paths; /* comma-separated */
	uint64_t size;	   /* whole cache, split evenly across the paths */
	uint32_t qd;	   /* I/Os in flight */
	int sqpoll;
};

struct disk {
	struct io_uring ring;
	int ring_ok;
	uint32_t npaths;
	struct disk_path path[DISK_MAX_PATHS];
	uint8_t cache_id[16];
	int warm;	  /* every superblock matched: the slots are worth a scan */
	int direct;	  /* every path O_DIRECT */
	int fixed_bufs;	  /* the pool and the header blocks are registered buffers */
	int sqpoll;	  /* the ring runs a kernel submission thread */
	int efd;	  /* eventfd the ring signals on each completion */
	uint32_t qd;	  /* ring SQ entries: I/Os in flight at most */
	uint32_t pending; /* SQEs prepared, not yet submitted */
	/* fixed buffers: each arena in chunks of chunk_bytes, then the header blocks */
	const struct pool *pool;
	uint64_t chunk_bytes;
	uint32_t arena_buf0[POOL_MAX_ARENAS];
	uint8_t *hdrs; /* nhdrs blocks of SLOT_BLOCK bytes, for headers being written */
	uint32_t nhdrs;
	uint32_t hdr_buf;
};

/*
 * Opens the paths, reads their superblocks (warm when they all match this geometry, else each
 * is formatted afresh), sets up the ring, registers the files, the pool (in chunks the kernel
 * accepts, each a multiple of slab_bytes so a slot never straddles two) and nhdrs header blocks.
 * Returns 0 or a negative errno (with a log line that says what failed).
 */
int disk_open(struct disk *d, const struct disk_cfg *c, const struct pool *p, uint64_t slab_bytes,
	      uint32_t nhdrs);
void disk_close(struct disk *d);

/*
 * After a failed start, before disk_close: removes the files this start created and cuts the
 * files it found back to their size at open, so that a --disk-size larger than the free space
 * leaves the file system as it was (disk_open does this itself when it fails).
 */
void disk_undo(struct disk *d);

/*
 * 1 when a path of this st_mode, on a file system of this statfs f_type, gets buffered I/O by
 * choice: a regular file on tmpfs, where the page cache is the memory. A block device always
 * goes O_DIRECT: its node lives on devtmpfs, whose f_type is tmpfs's too, and the file system
 * that holds a device node says nothing about the device (path_open took /dev/nvme0n1 for
 * tmpfs: page-cache double buffering, write errors reported late or never).
 */
int disk_tmpfs_file(mode_t mode, long f_type);

/* Header block i, for a header being written. */
static inline void *disk_hdr(struct disk *d, uint32_t i)
{
	return d->hdrs + (uint64_t)i * SLOT_BLOCK;
}

/*
 * Prepares a read or a write of len bytes at off of path pi from or to mem, which is pool
 * memory, a header block or (reads only) any aligned buffer. IOSQE_IO_LINK in flags chains it
 * to the next one. The SQE is submitted by disk_submit(); its completion carries ud. Returns 0,
 * or -EBUSY when the ring has no free SQE.
 */
int disk_prep(struct disk *d, int write, uint32_t pi, uint64_t off, void *mem, uint32_t len,
	      uint64_t ud, unsigned flags);

/* Free SQEs in the ring. (A function, not inline: test_tier puts a fake disk behind it.) */
uint32_t disk_space(struct disk *d);

/* Submits what was prepared; 0 or a negative errno. */
int disk_submit(struct disk *d);

/*
 * Reaps up to max completions without blocking (wait: block until at least one), calling
 * fn(arg, ud, res) for each. Returns how many.
 */
uint32_t disk_reap(struct disk *d, uint32_t max, int wait,
		   void (*fn)(void *arg, uint64_t ud, int32_t res), void *arg);

/* Drains the eventfd after the loop saw it readable. */
void disk_ack_event(struct disk *d);

#endif /* KVB_BROKER_DISK_H */
