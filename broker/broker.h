/* SPDX-License-Identifier: MIT */
/*
 * broker.h - the broker's state shared by its files: configuration, sessions (one per attached
 * client), global counters. Everything here is owned and touched by the loop thread alone.
 */
#ifndef KVB_BROKER_BROKER_H
#define KVB_BROKER_BROKER_H

#include <stdint.h>
#include <sys/types.h>

#include "copy.h"
#include "list.h"
#include "ns.h"
#include "numa_topo.h"
#include "pool.h"
#include "ring.h"
#include "store.h"
#include "tier.h"
#include "wire.h"

#define SESSION_MAX_BUFS 256
#define SESSION_MAX_VIEWS 256
#define SESSION_MAX_NS 64	  /* namespaces one client may open */
#define SESSION_HELLO_TIMEOUT 5.0 /* seconds a connection may stay silent before HELLO */
#define CONN_SPARE 64		  /* connections beyond --max-clients (kvbctl, handshakes) */

struct config {
	char socket_path[108];
	char pool_name[80];
	uint64_t pool_bytes;
	uint64_t slab_bytes;
	double high_wm, low_wm;
	uint32_t poll_us;
	uint32_t max_clients;
	uint32_t max_leases;
	uint32_t arg_size;
	uint64_t max_buf_bytes; /* host memory one client may register */
	uint32_t max_sq;	/* SQ entries one client may ask for (larger asks are clamped) */
	uint32_t max_bufs;	/* registered buffers per client, <= SESSION_MAX_BUFS */
	uint32_t max_ns;	/* namespaces per client, <= SESSION_MAX_NS */
	uint32_t max_inflight;	/* ops per client taken from its SQ and not yet completed */
	int prefault;
	char numa[128];		  /* --numa: auto, off, interleave or a node list */
	enum hp_mode hugepage;	  /* --hugepages */
	struct disk_cfg disk;	  /* disk.paths NULL: no disk tier */
	uint32_t copy_threads;	  /* host copy workers */
	uint64_t copy_inline;	  /* host jobs up to this many bytes run on the loop thread */
	uint32_t copy_delay_us;	  /* testing: each queued host job sleeps this long */
	uint32_t copy_fail_every; /* testing: every n-th queued host job fails */
	int gpu;		  /* 0: --no-gpu */
	int gpu_path;		  /* --gpu-path: CUDA_PATH_AUTO, _COPY or _KERNEL */
	gid_t group;
	int has_group;
	char metrics_listen[80]; /* --metrics-listen HOST:PORT, "" when off */
};

/* xfer.c: page copies (see stats "copy"). */
struct xfer_stats {
	uint64_t inline_jobs, queued_jobs, parked, errors, gpu_jobs;
	double pin_seconds; /* registering the pool with CUDA */
	uint64_t pinned_bytes;
};

struct counters {
	uint64_t puts, gets, hits, misses, dedup, errors, acquires, releases, lookups, lookup_keys,
		deletes, nops, prefetches, bytes_in, bytes_out, disconnects, protocol_errors,
		refused;
};

/*
 * A buffer a client registered. Host: its memfd mapped read-write here. GPU: base is the
 * device address of its first byte in the broker's context of CUDA device dev (never
 * dereferenced on the host), opened from the client's handle (gm, copy_cuda.c).
 * closing: unregistered while ops were in flight; released when the session's last completes.
 * fdb: an unsealed file registered with KVB_BUF_FDCOPY (fdcopy.c): base is then an address
 * range reserved PROT_NONE (never dereferenced: ops compute segments in it as usual and the
 * copy engine moves the bytes with pread/pwrite on the file at the matching offsets).
 */
struct sbuf {
	void *base;
	uint64_t len;
	uint64_t lead; /* host: bytes mapped before base (BUF_REG_FD at an unaligned offset) */
	int32_t dev;   /* COPY_HOST or a CUDA device index */
	uint8_t closing;
	struct gpu_map *gm;
	struct fdbuf *fdb; /* NULL: mapped (or GPU) */
};

/* A view; parts[p].page_stride is never 0 here (VIEW_CREATE's parts get tpp * stride). */
struct sview {
	struct ns *ns;
	uint32_t nparts;
	struct kvb_view_part2 parts[];
};

/* What one client's ops did, for kvbctl clients/top: struct counters credited to it. */
struct session_counters {
	uint64_t puts, gets, hits, misses, dedup, errors, bytes_in, bytes_out;
};

struct session {
	struct list link;
	int sock;
	int pidfd; /* the connecting process, -1 when none (peer.c [pidfd]) */
	uint32_t id;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	char name[KVB_NAME_MAX];
	int node;		 /* NUMA node it declared, or its GPU's; -1 unknown */
	char gpu[KVB_BUSID_MAX]; /* its GPU's PCI bus id, "" none */
	struct store_pref pref;	 /* arenas for its new pages, nearest first; n 0: default */
	int hello_done;
	int control_only;

	/* ring region, shared with the client (untrusted contents) */
	void *region;
	uint64_t region_size;
	int region_fd;
	int sq_efd, cq_efd;
	struct kvb_ring sq, cq;
	uint8_t *arg;
	uint32_t arg_size;

	uint8_t ns_opened[STORE_MAX_NS / 8];
	uint32_t nns;
	struct sbuf bufs[SESSION_MAX_BUFS];
	struct sview *views[SESSION_MAX_VIEWS];
	uint64_t *leases; /* lease ids held, with multiplicity */
	uint32_t nleases, cap_leases;
	uint64_t buf_bytes; /* registered host memory */
	uint32_t nclosing;  /* buffers unregistered while ops were in flight (sbuf.closing) */
	uint32_t nfdbufs;   /* buffers with sbuf.fdb (jobs need fdcopy_resolve) */
	uint64_t ops;
	struct session_counters c;
	double accepted_at;
	int stalled;	   /* SQEs waiting, but its CQ is full: the client must reap first */
	uint32_t inflight; /* ops consumed whose CQE is still owed (each holds a CQ slot) */
	int dead;	   /* destroyed, waiting in the graveyard until the epoll batch is done */
};

struct broker {
	struct config cfg;
	struct pool pool;
	struct store store;
	struct ns_table nst;
	struct copy_engine *copy; /* host memory */
	struct copy_engine *gpu;  /* GPU memory (copy_cuda.c), NULL when GPU copies are off */
	struct list parked;	  /* PUTs waiting for a PUT of the same key (xfer.c) */
	struct xfer_stats xs;
	struct tier *tier; /* NULL without --disk */
	struct counters ctr;
	struct list sessions;
	struct list graveyard;
	uint32_t nsessions; /* ring clients (control connections not counted) */
	uint32_t nconns;    /* every connection */
	uint32_t next_id;
	uint64_t leases; /* leases held by all clients */
	int listen_fd;
	int spare_fd; /* kept open so that accept can refuse a peer when fds run out */
	int epfd;
	int sigfd;
	double start_time;
	struct {		   /* seconds each start-up phase took (log, stats "startup") */
		double reserve_s;  /* arenas created, bound, reserved, sealed */
		double prefault_s; /* every page allocated and mapped */
		double pin_s;	   /* registered with the GPU driver */
		double ready_s;	   /* from start to listening, everything included */
	} startup;
	int lock_fd; /* "<socket>.lock", write-locked for our life: one broker per socket */
	int stop;
	struct metrics_http *metrics; /* --metrics-listen server, NULL when off */
};

/* epoll tags in the low bits of a session pointer (sessions are 8-byte aligned). */
#define TAG_SOCK 1u
#define TAG_SQ 2u
#define TAG_PID 3u /* the peer's pidfd: readable once that process exited */
#define TAG_MASK 7u

/*
 * peer.c: a pidfd (FD_CLOEXEC) of the process that connected on accepted socket fd, whose
 * SO_PEERCRED pid is pid, or -1 when none can be had safely; *how says which way it was found.
 */
int peer_pidfd(int fd, pid_t pid, const char **how);

/* session.c: session_accept returns 1 when a connection was taken, 0 when none waits. */
int session_accept(struct broker *b);
void session_destroy(struct broker *b, struct session *s, const char *why);
void session_reap(struct broker *b);
/* Ends connections that sent no HELLO within SESSION_HELLO_TIMEOUT. */
void session_expire(struct broker *b, double now);
int session_on_msg(struct broker *b, struct session *s);
/* Consumes up to max SQEs; returns SQEs handled, or -1 when the session was destroyed. */
int session_poll(struct broker *b, struct session *s, uint32_t max);

/*
 * Completes an op that ops_exec deferred: posts its CQE into the slot reserved for it. On a
 * dead session the CQE is dropped; the session is freed (its buffers unmapped) only after its
 * last in-flight op completed. Every deferred op must end here exactly once.
 */
void session_complete(struct broker *b, struct session *s, const struct kvb_cqe *cqe);

/*
 * ops.c: executes one SQE copied out of the ring. Returns OPS_DONE with *cqe filled, or
 * OPS_DEFERRED when the op continues asynchronously (a disk read, a copy on another engine)
 * and will end with session_complete(); until then it may use the session's buffers and views
 * but must not start new work for a session that died meanwhile (s->dead).
 */
enum { OPS_DONE = 0, OPS_DEFERRED = 1 };
int ops_exec(struct broker *b, struct session *s, const struct kvb_sqe *sqe, struct kvb_cqe *cqe);
/*
 * Runs a parked op again (tier.c: the read or the RAM it waited for is there) and completes it
 * with session_complete() unless it deferred again. An op of a session that died meanwhile is
 * completed (dropped) without running. Request counters are not counted twice.
 */
void ops_resume(struct broker *b, struct session *s, const struct kvb_sqe *sqe);
/* Drops every lease a session holds (client gone). */
void ops_release_all(struct broker *b, struct session *s);

/*
 * xfer.c: page copies as copy-engine jobs. xfer_start copies segs (n of them, the client side
 * on device dev) for a PUT (dir COPY_TO_POOL: pg is WRITING, the writer's pin held; committed
 * or aborted when the copy ends) or a GET (COPY_FROM_POOL: pg pinned by the caller, unpinned
 * when the copy ends). Returns OPS_DONE with *cqe filled, or OPS_DEFERRED (session_complete
 * follows). xfer_park_put makes a PUT of a WRITING page wait for its writer; xfer_existed fills
 * the CQE of a PUT whose key is stored. xfer_poll completes what the engines finished.
 */
int xfer_start(struct broker *b, struct session *s, struct ns *n, struct page *pg, int32_t dev,
	       uint32_t dir, const struct copy_seg *segs, uint32_t nsegs, struct kvb_cqe *cqe);
int xfer_park_put(struct broker *b, struct session *s, const struct kvb_sqe *sqe, struct page *pg,
		  struct kvb_cqe *cqe);
void xfer_existed(struct broker *b, struct ns *n, struct kvb_cqe *cqe);
uint32_t xfer_poll(struct broker *b);
/* The loop is about to sleep: engines with copies in flight must ring their eventfds. */
void xfer_arm(struct broker *b);
/* Engines up (host always, CUDA when asked and present) / down (waits for their jobs). */
int xfer_init(struct broker *b);
void xfer_fini(struct broker *b);
/* The "copy" member of the STATS document. */
struct cJSON;
struct cJSON *xfer_stats_json(const struct broker *b);

/*
 * fdcopy.c: KVB_BUF_FDCOPY buffers. fdcopy_buf_open fills *sb for [off, off + len) of the
 * unsealed tmpfs file fd (the caller checked type, range and budget; fd stays the caller's);
 * fdcopy_buf_close undoes it. fdcopy_resolve gives a host job of session s whose segments
 * reach such buffers its fds (room for job->nsegs entries; left NULL when none does).
 */
int fdcopy_buf_open(int fd, uint64_t off, uint64_t len, struct sbuf *sb);
void fdcopy_buf_close(struct sbuf *sb);
void fdcopy_resolve(const struct session *s, struct copy_job *job, struct copy_fdseg *room);

/* stats.c: the STATS document; free() the result. NULL on allocation failure. */
char *stats_json(const struct broker *b);
struct cJSON;
/*
 * stats_clients.c: per-client counters. The loop snapshots the global counters (stats_snap)
 * before it runs a session's SQEs and credits the session with the difference
 * (stats_account): an op that completes inside that window is that client's. An op that
 * completes later (deferred: disk, copy engines) must credit what it counts at completion to
 * its session's c itself.
 */
void stats_snap(const struct broker *b, struct session_counters *c);
void stats_account(const struct broker *b, struct session *s,
		   const struct session_counters *before);
/* stats_clients.c: count[ns] = attached clients that opened ns. */
void stats_ns_clients(const struct broker *b, uint32_t count[STORE_MAX_NS]);
/* stats_clients.c: page bytes PUTs did not store because the page was there, all namespaces. */
uint64_t stats_dedup_bytes(const struct broker *b);
/* stats_clients.c: a client's namespaces ("ns") and counters, into its client_list entry. */
void stats_client_json(struct cJSON *o, const struct session *s);
/* stats_map.c: the "map" array of the STATS document (kvbctl map). */
struct cJSON *stats_map_json(const struct broker *b);

/* loop.c: epoll data of the two fds that are not sessions' (session pointers are >= 4096). */
#define LOOP_LISTEN 8u
#define LOOP_SIGNAL 16u
#define LOOP_DISK 24u /* the disk ring's eventfd (tier.c) */
#define LOOP_COPY 32u /* a copy engine's completion eventfd (xfer.c) */
/* loop.c */
int loop_run(struct broker *b);
double now_sec(void);

#endif /* KVB_BROKER_BROKER_H */
