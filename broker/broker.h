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
	int prefault;
	char numa[128];	       /* --numa: auto, off, interleave or a node list */
	enum hp_mode hugepage; /* --hugepages */
	struct disk_cfg disk;  /* disk.paths NULL: no disk tier */
	gid_t group;
	int has_group;
};

struct counters {
	uint64_t puts, gets, hits, misses, dedup, errors, acquires, releases, lookups, lookup_keys,
		deletes, nops, prefetches, bytes_in, bytes_out, disconnects, protocol_errors,
		refused;
};

/* A host buffer a client registered: its memfd mapped read-write in the broker. */
struct sbuf {
	void *base;
	uint64_t len;
};

struct sview {
	struct ns *ns;
	uint32_t nparts;
	struct kvb_view_part parts[];
};

struct session {
	struct list link;
	int sock;
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
	uint64_t ops;
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
	struct copy_engine *copy;
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
};

/* epoll tags in the low bits of a session pointer (sessions are 8-byte aligned). */
#define TAG_SOCK 1u
#define TAG_SQ 2u
#define TAG_MASK 7u

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

/* stats.c: the STATS document; free() the result. NULL on allocation failure. */
char *stats_json(const struct broker *b);

/* loop.c: epoll data of the two fds that are not sessions' (session pointers are >= 4096). */
#define LOOP_LISTEN 8u
#define LOOP_SIGNAL 16u
#define LOOP_DISK 24u
/* loop.c */
int loop_run(struct broker *b);
double now_sec(void);

#endif /* KVB_BROKER_BROKER_H */
