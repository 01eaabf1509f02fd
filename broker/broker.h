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
#include "pool.h"
#include "ring.h"
#include "store.h"
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
	int pidfd; /* the connecting process, -1 when none (peer.c [pidfd]) */
	uint32_t id;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	char name[KVB_NAME_MAX];
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
	int stalled; /* SQEs waiting, but its CQ is full: the client must reap first */
	int dead;    /* destroyed, waiting in the graveyard until the epoll batch is done */
};

struct broker {
	struct config cfg;
	struct pool pool;
	struct store store;
	struct ns_table nst;
	struct copy_engine *copy;
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
	int stop;
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

/* ops.c: executes one validated-shape SQE copied out of the ring. */
void ops_exec(struct broker *b, struct session *s, const struct kvb_sqe *sqe, struct kvb_cqe *cqe);
/* Drops every lease a session holds (client gone). */
void ops_release_all(struct broker *b, struct session *s);

/* stats.c: the STATS document; free() the result. NULL on allocation failure. */
char *stats_json(const struct broker *b);

/* loop.c: epoll data of the two fds that are not sessions' (session pointers are >= 4096). */
#define LOOP_LISTEN 8u
#define LOOP_SIGNAL 16u
/* loop.c */
int loop_run(struct broker *b);
double now_sec(void);

#endif /* KVB_BROKER_BROKER_H */
