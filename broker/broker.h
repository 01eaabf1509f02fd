/* SPDX-License-Identifier: MIT */
/*
 * broker.h - the broker's state shared by its files: configuration, sessions (one per attached
 * client), global counters. Everything here is owned and touched by the loop thread alone.
 */
#ifndef KVB_BROKER_BROKER_H
#define KVB_BROKER_BROKER_H

#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "bg.h"
#include "clock.h"
#include "copy.h"
#include "keeper.h"
#include "list.h"
#include "loop.h"
#include "ns.h"
#include "numa_topo.h"
#include "ops.h"
#include "pool.h"
#include "remote.h"
#include "ring.h"
#include "store.h"
#include "tenant.h"
#include "tier.h"
#include "wire.h"

#define SESSION_MAX_BUFS 256
#define SESSION_MAX_VIEWS 256
#define SESSION_MAX_NS 64	  /* namespaces one client may open */
#define SESSION_HELLO_TIMEOUT 5.0 /* seconds a connection may stay silent before HELLO */
#define CONN_SPARE 64		  /* handshakes (no HELLO yet) at once: the oldest makes room */
#define SESSION_DRAIN_WARN 5.0	  /* seconds a dead session may drain before it is logged */
#define SESSION_POLL_BATCH 64	  /* SQEs per session per round (and OPS_ROUND_WORK units) */

struct config {
	char socket_path[108];
	char pool_name[80];
	uint64_t pool_bytes;
	uint64_t slab_bytes;
	double high_wm, low_wm;
	uint32_t poll_us;
	uint32_t max_clients;
	uint32_t max_control; /* --max-control: control-only connections (kvbctl) */
	double control_idle; /* --control-idle: seconds a silent control connection lives, 0 ever */
	uint32_t max_leases;
	uint32_t arg_size;
	uint64_t max_buf_bytes; /* host memory one client may register */
	uint32_t max_sq;	/* SQ entries one client may ask for (larger asks are clamped) */
	uint32_t max_bufs;	/* registered buffers per client, <= SESSION_MAX_BUFS */
	uint32_t max_ns;	/* namespaces per client, <= SESSION_MAX_NS */
	uint32_t max_inflight;	/* ops per client taken from its SQ and not yet completed */
	int prefault;
	int dir;		  /* [dir] --no-directory clears it */
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
	char metrics_listen[80];   /* --metrics-listen HOST:PORT, "" when off */
	struct tenant_cfg tenants; /* --tenants, --tenant, --tenant-share (tenant.c) */
	struct ns_limit ns_limits[NS_LIMITS_MAX]; /* --ns-limit (ns.h [ns-limit]) */
	uint32_t n_ns_limits;
	uint64_t max_lease_bytes; /* --max-lease-bytes: page bytes one client may lease */
	double max_lease_frac;	  /* ... as a fraction of its partition (N%) */
	double max_pinned;	  /* --max-pinned: fraction of a partition leases may pin */
	double lease_lifetime;	  /* --lease-lifetime: seconds a lease may be held, 0 ever */
	int keep;		  /* 0: --no-pool-keep (pool.c [keep]) */
	int free_pool;		  /* --free-pool: free a kept pool and exit */
	int takeover;		  /* --takeover: the running broker hands its pool over */
	int pool_overcommit;	  /* --pool-overcommit: start a pool that does not fit */
	struct remote_cfg remote; /* remote.url NULL: no remote tier */
};

/* xfer.c: page copies (see stats "copy"). */
struct xfer_stats {
	uint64_t inline_jobs, queued_jobs, parked, errors, gpu_jobs;
	/*
	 * Filled PUTs (KVB_SQEF_FILL, xfer_fill): run, completed EXISTED having read nothing
	 * (ask-first), bytes they copied, steps that found nothing new, and given up (-EAGAIN).
	 */
	uint64_t fill_puts, fill_existed, fill_bytes, fill_waits, fill_gaveup;
	double pin_seconds; /* registering the pool with CUDA */
	uint64_t pinned_bytes;
};

struct counters {
	uint64_t puts, gets, hits, misses, dedup, errors, acquires, releases, lookups, lookup_keys,
		deletes, nops, prefetches, bytes_in, bytes_out, disconnects, protocol_errors,
		refused, expired;
	uint64_t dir_gets;     /* [dir] GETs a client did itself through the pool directory */
	uint64_t dir_acquires; /* [hazard] ACQUIREs it took itself under its hazard table */
	uint64_t hazard_pins;  /* [hazard] pages pinned as they left for a client reading them */
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

/*
 * A view; parts[p].page_stride is never 0 here (VIEW_CREATE's parts get tpp * stride).
 * refs: the session's table plus each op using it (ops.c decodes it once).
 */
struct sview {
	uint32_t refs;
	struct ns *ns;
	uint32_t nparts;
	struct kvb_view_part2 parts[];
};

static inline void sview_put(struct sview *v)
{
	if (!--v->refs)
		free(v);
}

/* What one client's ops did, for kvbctl clients/top: credited when each op completes. */
struct session_counters {
	uint64_t puts, gets, hits, misses, dedup, errors, bytes_in, bytes_out;
};

struct session {
	struct list link;
	struct broker *b;
	struct loop_fd on_sock, on_sq, on_pid; /* its fds in the loop (the session is the arg) */
	int sock;
	int pidfd; /* the connecting process, -1 when none (peer.c [pidfd]) */
	uint32_t id;
	pid_t pid;
	uid_t uid;
	gid_t gid;
	uint32_t tenant;  /* its tenant's key (ns identity), tenant.c */
	uint32_t part;	  /* its tenant's pool partition */
	int tenant_bound; /* counted in tt.t[part].clients */
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
	struct kvb_ring notes;	  /* [notes] (wire.h), we consume */
	int notes_bad;		  /* its note ring's tail was impossible */
	uint64_t notes_read;	  /* entries drained from it, ever */
	uint64_t nap_read;	  /* [note-nap] notes_read at the last sleep ... */
	double nap_at;		  /* ... and its time */
	kvb_atomic_u32 *hz_count; /* [hazard] (wire.h): the client's table */
	kvb_atomic_u64 *hz;
	struct page *hz_pin[KVB_HZ_ENTRIES]; /* pinned for that entry, NULL none */
	uint64_t hz_val[KVB_HZ_ENTRIES];     /* the entry's value when we pinned */
	double hz_at[KVB_HZ_ENTRIES];	     /* when (--lease-lifetime) */
	uint32_t hz_npins;
	uint64_t hz_bytes[KVB_HZ_ENTRIES];   /* page bytes of each lease it told us of */
	uint64_t hz_gone[KVB_HZ_ENTRIES];    /* a lease id released before its ACQUIRE was read */
	uint32_t hz_max;		     /* its table's entries (KVB_HZ_MAX at most) */
	kvb_atomic_u32 *hz_allow;	     /* KVB_HZ_MAX: entries it may still use */
	kvb_atomic_u64 *hz_budget;	     /* KVB_HZ_BUDGET: bytes it may still hold so */
	uint32_t hz_leases;		     /* leases it holds under its table, as told */
	uint64_t hz_held;		     /* their page bytes (the lease limits count them) */
	kvb_atomic_u32 *loop_cpu, *spin_cpu; /* spinning hints (wire.h): ours, the client's */
	kvb_atomic_u32 *fill, *fill_stop;    /* KVB_SQEF_FILL (wire.h): the client's, ours */
	uint32_t fill_seq;		     /* KVB_SQEF_FILL SQEs taken from its SQ */
	uint32_t fill_seen;		     /* the fill word as its filled PUT last read it */
	uint8_t *arg;
	uint32_t arg_size;

	uint8_t ns_opened[STORE_MAX_NS / 8];
	uint32_t nns;
	struct sbuf bufs[SESSION_MAX_BUFS];
	struct sview *views[SESSION_MAX_VIEWS];
	uint64_t *leases; /* lease ids held, with multiplicity */
	uint64_t *ledger; /* [records] their mirror the keeper holds (orphan.c), NULL none */
	int rec_fd[2];	  /* [records] its region and ledger, for a keeper that replaces one */
	int rec_kept;	  /* [records] the current keeper (or fd store) has its record */
	double *lease_at; /* when each was taken (--lease-lifetime) */
	uint32_t nleases, cap_leases;
	uint64_t lease_bytes; /* page bytes of the leases held (--max-lease-bytes) */
	uint64_t buf_bytes;   /* registered host memory */
	uint32_t nclosing;    /* buffers unregistered while ops were in flight (sbuf.closing) */
	uint32_t nfdbufs;     /* buffers with sbuf.fdb (jobs need fdcopy_resolve) */
	uint8_t batch_more; /* the SQE being submitted has more behind it (xfer.c [batch-queue]) */
	uint64_t ops;
	struct session_counters c;
	double accepted_at;
	double active_at;    /* its last control message (control connections expire idle) */
	int stalled;	     /* SQEs waiting, but its CQ is full: the client must reap first */
	uint32_t inflight;   /* ops consumed whose CQE is still owed (each holds a CQ slot) */
	int dead;	     /* destroyed, waiting in the graveyard until the epoll batch is done */
	struct list live;    /* its ops taken from the SQ and not completed (struct op slink) */
	uint32_t nops;	     /* on that list */
	struct waitq yieldq; /* its long ops' next steps, run at its next turn (fair rounds) */
	double dead_at;	     /* when it was destroyed (the drain log) */
	char *stats_doc;     /* paged STATS: the rendering pages are cut from */
	size_t stats_len;
	int drain_logged;
};

struct broker {
	struct config cfg;
	struct pool pool;
	struct store store;
	struct ns_table nst;
	struct tenant_table tt;
	struct copy_engine *copy; /* host memory */
	struct copy_engine *gpu;  /* GPU memory (copy_cuda.c), NULL when GPU copies are off */
	struct bg *bg;		  /* populates and unmaps clients' memory (bg.c); NULL: inline */
	struct waitq runq;	  /* woken ops, run again by ops_poll (ops.c) */
	uint64_t ops_parked;	  /* ops on any wait list now: a waitq, runq, a yield queue */
	struct op *op_cache;	  /* [op-cache] freed ops kept for the next SQEs (ops.c) */
	uint32_t op_ncached;
	struct seg_map seg_cache[OPS_SEG_CACHE]; /* [seg-list] idle segment lists (ops.c) */
	uint32_t seg_ncached;
	double seg_used; /* when one was last taken or given back */
	struct xfer_stats xs;
	struct tier *tier;     /* NULL without --disk */
	struct remote *remote; /* NULL without --remote */
	struct counters ctr;
	/*
	 * [hist] Timings (hist.h) and where hits came from, counted at completion (ops.c);
	 * off: KVB_BROKER_NO_HISTOGRAMS set, for make bench's with-and-without rows only.
	 */
	struct {
		struct hist h[HIST__COUNT];
		uint64_t tier_hits[3];	      /* RAM, disk (promoted), remote (fetched) */
		double t_end;		      /* the last timed op's end */
		const struct session *next_s; /* whose next SQE starts at next_t0 (ops_submit) */
		double next_t0;
		uint8_t off;
	} obs;
	struct list sessions;
	struct list graveyard;
	struct list orphans; /* [orphans] clients of the previous broker still leasing (orphan.c) */
	struct {
		uint32_t live;	  /* orphans left */
		uint64_t pins;	  /* pages they hold */
		uint64_t unkept;  /* sessions whose leases could not be kept for a successor */
		uint32_t pending; /* records not with the current keeper yet (watch.c resends) */
	} orphan_st;
	uint32_t run_id;    /* random, per run: tags our sessions' records (orphan.c) */
	uint32_t nsessions; /* ring clients (control connections not counted) */
	uint32_t ncontrol;  /* control-only connections past HELLO */
	uint32_t npending;  /* connections that have not sent HELLO yet */
	uint32_t nconns;    /* every connection */
	uint32_t next_id;
	uint64_t leases; /* leases held by all clients */
	/* page bytes leased by the clients of each partition (--max-pinned counts these, not the
	 * broker's own pins of pages being demoted, promoted or copied) */
	uint64_t leased_bytes[POOL_MAX_PARTS];
	int listen_fd;
	int spare_fd; /* kept open so that accept can refuse a peer when fds run out */
	struct loop loop;
	struct loop_fd on_listen, on_signal, on_copy[2];
	int sigfd;
	double expired_at; /* the last handshake and idle expiry (rounds.c) */
	uint32_t loop_cpu; /* the CPU + 1 the loop last ran a round on (session_note_cpu) */
	uint8_t cq_spun;   /* [busy-share] this round posted to a client spinning on loop_cpu */
	/*
	 * Page copies queued on host workers (not views' many-segment jobs), and whether the
	 * loop yields its idle rounds while there are any (xfer.c [copy-yield]).
	 */
	uint32_t copy_yield;
	int copy_yield_on;
	/*
	 * [cqe-first] An inline or filled PUT's commit after its CQE was posted (xfer.c): the page
	 * (its header sealed) and namespace; late_ok while session_poll or ops_run_yielded runs an
	 * op that may leave one (they commit it before the next op and before they return).
	 */
	struct {
		struct page *pg;
		const struct ns *n;
	} late;
	int late_ok;
	double start_time;
	struct {		   /* seconds each start-up phase took (log, stats "startup") */
		double reserve_s;  /* arenas created, bound, reserved, sealed */
		double prefault_s; /* every page allocated and mapped */
		double pin_s;	   /* registered with the GPU driver */
		double ready_s;	   /* from start to listening, everything included */
		double adopt_s;	   /* a kept pool's index rebuilt (adopt.c), 0 cold */
		uint64_t adopted_pages, adopt_torn;
	} startup;
	int keeper;	       /* a keeper holds our pool (keeper.c): freed at a clean exit */
	struct keeper_link kl; /* [owner] our connection to it, -1 when none (watch.c) */
	struct {	       /* watch.c: the keeper and the files beside the socket */
		struct loop_fd on_keeper;
		double at, retry_at;	  /* last look, next keeper start after a failure */
		uint64_t keeper_deaths;	  /* keepers that died under us */
		uint64_t keeper_starts;	  /* ... and were replaced */
		uint64_t files_made;	  /* socket or lock files made again after removal */
		struct stat sock;	  /* the socket file we listen on */
		int lock_lost, sock_lost; /* another broker holds that file now (logged once) */
		uint32_t busy_tries;	  /* keeper starts that found the dead one answering */
	} watch;
	int fdstore;  /* systemd's fd store holds it (sdnotify.c): FDSTOREREMOVE at a clean exit */
	int handover; /* SIGUSR2: exit leaving the pool to the keeper (main.c [handover]) */
	double handover_wait_s; /* --takeover: how long the old broker took to go */
	int freed_kept; /* start-up freed a kept pool: its memory is on its way back (pool_fits) */
	int lock_fd;	/* "<socket>.lock", write-locked for our life: one broker per socket */
	struct metrics_http *metrics; /* --metrics-listen server, NULL when off */
	char metrics_addr[80];	      /* the address it bound, "" when off (stats) */
};

/*
 * peer.c: a pidfd (FD_CLOEXEC) of the process that connected on accepted socket fd, whose
 * SO_PEERCRED pid is pid, or -1 when none can be had safely; *how says which way it was found.
 */
int peer_pidfd(int fd, pid_t pid, const char **how);

/* session.c: session_accept returns 1 when a connection was taken, 0 when none waits. */
int session_accept(struct broker *b);
/* A new session (calloc'd) of b: its lists, its loop handlers. */
void session_init(struct broker *b, struct session *s);
/* The listening socket is readable (a struct loop_fd callback; arg: the broker). */
void session_on_listen(void *arg);
/*
 * ctl.c (and the fuzzers): the session's view of its ring region r of size bytes, laid out as
 * h says (kvb_region_layout): the SQ, CQ and note rings from the indices r holds, the hazard
 * table, the hints' and fill words, and the hazard budget words written for the client.
 */
void session_region_init(struct broker *b, struct session *s, uint8_t *r, uint64_t size,
			 const struct kvb_region_hdr *h);
/*
 * [notes] Runs what a session's note ring holds (wire.h KVB_FEAT_NOTES), or every session's:
 * rounds.c's tick, STATS, a RELEASE or the lease limits (ops.c). Never ends a session: an
 * impossible tail is left for session_poll() to end it.
 */
void session_notes(struct broker *b, struct session *s);
/*
 * Every session's notes, then [hazard] the pins of table entries that moved on: each tick,
 * before STATS, and before a full pool or --max-pinned refuses anything. Returns 1 when that
 * unpinned a page (a retry may succeed), else 0.
 */
int session_settle(struct broker *b);
/*
 * [hazard] (wire.h): store.c's withdrawn hook (arg: the broker) pins a page leaving the
 * directory for every client that reads it under its hazard table. Loop thread only.
 */
void session_hz_withdrawn(void *arg, struct page *pg);
/*
 * [hazard] The client told us of lease id of its table (ops.c, KVB_SQEF_HELD): an ACQUIRE of
 * page pg (NULL: not READY any more) of bytes, counted (leases, lease bytes, the partition's
 * leased bytes) and pinned from now on if its entry still names it, as a lease of ours is
 * (pinned pages, the map, eviction see it); or a RELEASE (pg NULL, bytes 0), counted, and
 * unpinned when the entry has moved on. Either may come first (the SQ and the note ring are
 * read at different times): a RELEASE before its ACQUIRE cancels it.
 */
void session_hz_told(struct broker *b, struct session *s, uint64_t id, struct page *pg,
		     uint64_t bytes);
/*
 * [hazard] Rewrites what s may still lease under its own table (KVB_HZ_MAX, KVB_HZ_BUDGET):
 * the limits less the leases it holds through us. ops.c calls it as those come and go.
 */
void session_hz_allow(struct broker *b, struct session *s);
/* rounds.c: one turn of every session; returns ops run. */
uint32_t session_poll_all(struct broker *b);
/*
 * rounds.c: announces sleep on every SQ. Returns 0 when some SQ got entries meanwhile (don't
 * sleep), else the sleep's timeout in microseconds. session_wake_all() takes the announcement
 * back.
 */
int session_prepare_sleep(struct broker *b);
/*
 * Spinning hints (wire.h): session_note_cpu() writes the CPU the loop runs on into every
 * session's region when it changed (each round: a load of the rseq CPU id while it did not);
 * session_cpu_shared() is 1 when a client spins, or sleeps waiting for us, on that same CPU
 * (the loop then yields its idle rounds). session_cq_spun() is 1 (once) when the round posted
 * completions to a client spinning on that CPU (the loop then yields after the busy round,
 * loop.c [busy-share]). Loop thread only.
 */
void session_note_cpu(struct broker *b);
int session_cpu_shared(struct broker *b);
int session_cq_spun(struct broker *b);
void session_wake_all(struct broker *b);
void session_destroy(struct broker *b, struct session *s, const char *why);
/* Before session_destroy of a client we end on purpose: tells its library to unmap the pool
 * (KVB_SQ_REVOKED). */
void session_revoke(struct session *s);
/* A free buffer slot of s (--max-bufs counts every kind of buffer), or -EMFILE. */
int session_buf_slot(const struct broker *b, const struct session *s, uint32_t *id);
void session_reap(struct broker *b);
/* Ends connections that sent no HELLO within SESSION_HELLO_TIMEOUT, and control connections
 * silent for --control-idle seconds. */
void session_expire(struct broker *b, double now);
/* ctl.c: one control datagram of s; < 0 when the session was destroyed. */
int ctl_on_msg(struct broker *b, struct session *s);
/* Unmaps a host buffer or closes a GPU buffer's handle; no op may be using it. */
void session_buf_release(struct broker *b, struct session *s, struct sbuf *sb);
/*
 * One turn of a session: its yielded ops' next steps, then SQEs, up to max SQEs and about
 * OPS_ROUND_WORK units of work. Returns ops run (0: idle), or -1 when the session was
 * destroyed; *told gets how many of them were told ops (ops.h [told]).
 */
int session_poll(struct broker *b, struct session *s, uint32_t max, uint32_t *told);

/*
 * Completes an op that ops_submit deferred: posts its CQE into the slot reserved for it. On a
 * dead session the CQE is dropped; the session is freed (its buffers unmapped) only after its
 * last in-flight op completed. Every deferred op must end here exactly once.
 */
void session_complete(struct broker *b, struct session *s, const struct kvb_cqe *cqe);

/*
 * xfer.c: an op's page copy as a copy-engine job: op->segs (view ops) or op->seg1, the client
 * side on device op->dev, for a PUT (dir COPY_TO_POOL: op->pg is WRITING, the writer's pin
 * held; committed or aborted when the copy ends) or a GET (COPY_FROM_POOL: op->pg pinned,
 * unpinned when the copy ends). Returns OPS_DONE with op->cqe set, or OPS_DEFERRED: the
 * engine completes the op (ops_complete) from xfer_poll.
 */
int xfer_start(struct broker *b, struct op *op, uint32_t dir);
/*
 * xfer.c [fill]: one step of a filled PUT's copy (KVB_SQEF_FILL): op->pg WRITING, op->seg1 the
 * whole page. Copies what the client's fill word says is ready; OPS_DONE once the page is
 * committed (or the fill given up: -EAGAIN), else parks op on its session's yield queue.
 */
int xfer_fill(struct broker *b, struct op *op);
uint32_t xfer_poll(struct broker *b);
/*
 * The loop saw a copy engine's eventfd readable: drains both eventfds whatever is in flight,
 * then polls. An engine's poll() drains only while it has jobs in flight, and a completion
 * that rings after the poll that took it (a CUDA host callback after its event) must not leave
 * a level-triggered eventfd readable: the idle loop would spin on it.
 */
uint32_t xfer_event(struct broker *b);
/* The loop is about to sleep: engines with copies in flight must ring their eventfds. */
void xfer_arm(struct broker *b);
/*
 * [cqe-first] Commits the PUT whose CQE went out first, if any: session_poll calls it before
 * each op it runs and once it posted the CQEs of its batch, so no op, request or thread sees
 * the page before its commit but the client that wrote it.
 */
void xfer_commit_late(struct broker *b);
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
/* stats.c: the document session s may read [tenant-stats]: all of it for the operator (root,
 * the broker's uid) or without tenants, else its own tenant's view. */
char *stats_json_for(const struct broker *b, const struct session *s);
struct cJSON;
/* stats_clients.c: count[ns] = attached clients that opened ns. */
void stats_ns_clients(const struct broker *b, uint32_t count[STORE_MAX_NS]);
/* stats_clients.c: page bytes PUTs did not store because the page was there, all namespaces. */
uint64_t stats_dedup_bytes(const struct broker *b);
/* stats_clients.c: a client's namespaces ("ns") and counters, into its client_list entry. */
void stats_client_json(struct cJSON *o, const struct session *s);
/* stats_map.c: the "map" array of the STATS document (kvbctl map): every arena, or those of
 * partition part (>= 0) only [tenant-stats]. */
struct cJSON *stats_map_json(const struct broker *b, int part);

/* adopt.c: rebuilds namespaces and store from an adopted pool's side table (pagehdr.c). */
int adopt_pool(struct broker *b);

/* rounds.c: the loop's hooks for this broker (main.c). */
void rounds_hooks(struct broker *b, struct loop_hooks *h);

#endif /* KVB_BROKER_BROKER_H */
