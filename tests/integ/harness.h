/* SPDX-License-Identifier: MIT */
/*
 * harness.h - helpers for the multi-process integration tests, which run against a REAL
 * kvbrokerd the way memcached's tests start a real daemon per test.
 *
 * A test calls harness_init(), starts a broker on a private socket in a fresh temporary
 * directory (so tests running side by side never share a socket or a pool name), attaches real
 * clients with libkvbroker or, for tests that must break the protocol, with the raw client
 * below, forks client processes, and checks results with the CHECK macros. Any failed check
 * prints what was compared, with values; in the test's main process it also dumps the broker's
 * log, stops the broker and exits 1. In a forked child it just exits 1 and the parent reports
 * it. Exit codes follow tests/run.sh: 0 pass, 1 fail, 77 skip.
 *
 * Everything here is for one thread per process; children are made with fork(), and a child
 * never touches a kvb_client its parent opened (connect again in the child).
 */
#ifndef KVB_TESTS_HARNESS_H
#define KVB_TESTS_HARNESS_H

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvbroker.h"
#include "ring.h"
#include "wire.h"

#define H_PASS 0
#define H_FAIL 1
#define H_SKIP 77

/* ---- failing checks ---- */

/* Reports a failed check (printf-style) and exits: 1 in the main process after dumping and
 * stopping the broker, 1 in a child without touching the broker. */
void harness_fail(const char *file, int line, const char *fmt, ...)
	__attribute__((noreturn, format(printf, 3, 4)));

/* Ends the test with 77 after printing why (the runner shows the last line). */
void harness_skip(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond))                                                                       \
			harness_fail(__FILE__, __LINE__, "CHECK(%s) failed", #cond);               \
	} while (0)

#define CHECKF(cond, ...)                                                                          \
	do {                                                                                       \
		if (!(cond))                                                                       \
			harness_fail(__FILE__, __LINE__, __VA_ARGS__);                             \
	} while (0)

/* Integer comparisons that print both sides. Values are compared as signed 64-bit. */
#define CHECK_OP_(a, op, b)                                                                        \
	do {                                                                                       \
		long long va_ = (long long)(a), vb_ = (long long)(b);                              \
		if (!(va_ op vb_))                                                                 \
			harness_fail(__FILE__, __LINE__,                                           \
				     "CHECK(%s %s %s) failed: %lld (0x%llx) vs %lld (0x%llx)", #a, \
				     #op, #b, va_, (unsigned long long)va_, vb_,                   \
				     (unsigned long long)vb_);                                     \
	} while (0)
#define CHECK_EQ(a, b) CHECK_OP_(a, ==, b)
#define CHECK_NE(a, b) CHECK_OP_(a, !=, b)
#define CHECK_LT(a, b) CHECK_OP_(a, <, b)
#define CHECK_LE(a, b) CHECK_OP_(a, <=, b)
#define CHECK_GT(a, b) CHECK_OP_(a, >, b)
#define CHECK_GE(a, b) CHECK_OP_(a, >=, b)

/* An API call's return value, printed with kvb_strerror() when it is not what was wanted. */
#define CHECK_RC(expr, want)                                                                       \
	do {                                                                                       \
		long long rc_ = (long long)(expr), want_ = (long long)(want);                      \
		if (rc_ != want_)                                                                  \
			harness_fail(__FILE__, __LINE__, "%s returned %lld (%s), want %lld (%s)",  \
				     #expr, rc_, harness_strerror(rc_), want_,                     \
				     harness_strerror(want_));                                     \
	} while (0)
#define CHECK_OK(expr) CHECK_RC(expr, 0)

/* "Success" / kvb_strerror() for negative values; never NULL. */
const char *harness_strerror(long long rc);

/* ---- set-up ---- */

/*
 * Records argv[0] (to find kvbrokerd), names the test, ignores SIGPIPE, line-buffers stdout and
 * arms a deadline (default 90 s, $KVB_TEST_DEADLINE) after which the broker's log is dumped and
 * the test fails, before the runner's harder timeout (120 s) would kill it. SIGTERM and SIGINT
 * do the same, so even a test the runner kills leaves its broker's log and no processes behind.
 */
void harness_init(int argc, char **argv);

/* Prints a "# ..." progress line with the time since harness_init(). */
void harness_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- the broker ---- */

struct harness_broker {
	char dir[PATH_MAX]; /* private temporary directory, removed at exit */
	char sock[108];	    /* control socket inside dir */
	char log[PATH_MAX]; /* its stderr */
	pid_t pid;	    /* running: > 0; 0 stopped; -pid exited on its own */
	int status;	    /* wait status once it exited */
};

/*
 * Starts kvbrokerd (dirname(argv[0])/../bin/kvbrokerd, or $KVB_BROKERD) with --socket in a new
 * private directory, plus the extra arguments (a --pool is added when none is given: 128M), and
 * waits up to 5 s until kvb_connect() succeeds. Fails the test when the broker exits or is not
 * ready in time. The broker gets SIGTERM if the test process dies. The harness owns the
 * returned struct (it outlives main() for the exit-time clean-up).
 * A "--socket PATH" among the arguments starts it on that socket instead (to restart a broker on
 * the socket of one that died). Call as harness_broker_start("--pool", "64M"), with at least
 * one argument; the array is
 * NULL-terminated by the macro (a NULL sentinel passed through "..." is not portable C).
 */
struct harness_broker *harness_broker_startv(const char *const *args);
#define harness_broker_start(...) harness_broker_startv((const char *const[]){__VA_ARGS__, NULL})

/*
 * When set, called in the broker's child after its stdio is set up, just before the exec: a test
 * that plays the service manager passes fds and environment this way (t_fdstore). It must not
 * touch fds 0-2.
 */
extern void (*harness_broker_preexec)(void *arg);
extern void *harness_broker_preexec_arg;

/* SIGTERM, wait up to 5 s, and fail the test unless it exited with status 0. */
void harness_broker_stop(struct harness_broker *b);

/* Is the broker process still running (not exited, not a zombie)? */
int harness_broker_alive(struct harness_broker *b);

/* Prints the broker's log (its last 64 KiB) to stdout. */
void harness_broker_dump_log(const struct harness_broker *b);

/* Does the broker's log contain this text? */
int harness_broker_log_has(const struct harness_broker *b, const char *text);

/* kvb_connect() to b with the given name and SQ size (0: default); fails the test on error. */
kvb_client *harness_connect(const struct harness_broker *b, const char *name, uint32_t sq_entries);

/* ---- stats ---- */

/* The broker's stats JSON through kvb_stats_json(); fails the test on error. free() it. */
char *harness_stats(kvb_client *c);

/*
 * Reads a number out of a stats document. path: dot-separated members, each optionally
 * followed by [N] (array index) or [member=value] (the first array element whose member equals
 * the number or string value), e.g. "pool.bytes_used", "namespaces[id=3].dedup",
 * "client_list[0].leases". Fails the test (printing the document) when the path is missing
 * or not a number.
 */
uint64_t harness_stat_u64(const char *json, const char *path);
double harness_stat_f64(const char *json, const char *path);

/* Does the path exist (any type)? */
int harness_stat_has(const char *json, const char *path);

/* One fresh stats fetch and read. */
uint64_t harness_stat(kvb_client *c, const char *path);

/*
 * Polls the stats every 10 ms until path equals want or timeout_ms passed; returns the last
 * value read (the caller checks it).
 */
uint64_t harness_stat_wait(kvb_client *c, const char *path, uint64_t want, int timeout_ms);

/* ---- keys, layouts and page content ---- */

/* A deterministic key for (seed, i); distinct for distinct inputs with overwhelming odds. */
kvb_key harness_key(uint64_t seed, uint64_t i);

/* n chained keys (kvb_key_chain) over synthetic tokens: a prefix of tpp-token pages. */
void harness_key_chain(kvb_key *keys, size_t n, uint32_t tokens_per_page, uint64_t seed);

/* Fills / checks len bytes of page content derived from (key, seed). */
void harness_fill(void *buf, size_t len, const kvb_key *key, uint64_t seed);

/* The broker memfds (pool arenas, ring regions) this process maps, from /proc/self/maps. */
int harness_memfd_maps(void);

/* Reaps exactly n completions of c into out[] (in completion order), 5 s at most each; fails. */
void harness_reap_n(kvb_client *c, struct kvb_completion *out, size_t n);

/*
 * 0 when buf holds harness_fill(key, seed) content; otherwise prints the first mismatch (offset,
 * got, want, how many bytes differ) under the given label and returns -1.
 */
int harness_verify(const void *buf, size_t len, const kvb_key *key, uint64_t seed,
		   const char *what);

/* Expected byte at offset off of the (key, seed) content. */
uint8_t harness_byte(const kvb_key *key, uint64_t seed, size_t off);

/* A one-component layout; page_bytes = tpp * layers * bytes. */
void harness_layout(struct kvb_layout *l, const char *model, uint32_t kind, uint32_t tpp,
		    uint32_t tp_size, uint32_t tp_rank, uint32_t layers, uint32_t bytes);

/* Adds a component to a layout. */
void harness_layout_add(struct kvb_layout *l, const char *name, uint32_t layers, uint32_t bytes);

/* Bytes a page occupies in the pool: page_bytes rounded up to 4 KiB. */
static inline uint64_t harness_slot_bytes(uint64_t page_bytes)
{
	return (page_bytes + 4095) & ~(uint64_t)4095;
}

/* Hex of the first 8 bytes of a key, for messages (static buffer rotation of 4). */
const char *harness_key_str(const kvb_key *key);

/* ---- processes ---- */

/*
 * Forks a child that runs fn(idx, arg) and exits with its return value (a CHECK that fails in
 * the child exits 1). The child is killed if the test process dies. Returns the pid.
 */
pid_t harness_fork(int (*fn)(int idx, void *arg), int idx, void *arg);

/*
 * Waits for the children; those still running after timeout_ms are killed with SIGKILL and
 * count as failed. Each child's exit status goes to status[i] (may be NULL) as its exit code,
 * 128 + signal, or -1 for timed out. Prints every child that did not exit 0. Returns how many.
 */
int harness_wait(const pid_t *pids, int n, int timeout_ms, int *status);

/* harness_fork() n children fn(0..n-1, arg) and harness_wait() for them. */
int harness_run_children(int n, int (*fn)(int idx, void *arg), void *arg, int timeout_ms);

/* Anonymous shared memory that forked children write results into. Zeroed. */
void *harness_shared(size_t len);

/*
 * A counting gate between processes (a pipe): harness_gate_open(g, n) lets n waiters through,
 * harness_gate_wait() lets one through or fails the test after timeout_ms. Children wait on a
 * gate the parent opens to start together; the parent waits on a gate each child opens once
 * to learn that they are ready. Create it before forking.
 */
struct harness_gate {
	int fd[2];
};
void harness_gate_init(struct harness_gate *g);
void harness_gate_open(struct harness_gate *g, int n);
void harness_gate_wait(struct harness_gate *g, int timeout_ms);

/* Monotonic milliseconds / nanoseconds. */
uint64_t harness_now_ms(void);
uint64_t harness_now_ns(void);

/* ---- the raw protocol client ---- */

/*
 * A client that speaks proto/wire.h by hand, for tests that must send what libkvbroker never
 * would: another ABI, garbage SQEs, impossible ring indices. It maps the region and owns the
 * producer side of the SQ and the consumer side of the CQ.
 */
struct harness_raw {
	int sock;
	int sq_efd; /* we write: wakes the broker */
	int cq_efd; /* the broker writes */
	void *region;
	size_t region_size;
	struct kvb_region_hdr hdr; /* our checked copy */
	struct kvb_ring sq;	   /* we produce */
	struct kvb_ring cq;	   /* we consume */
	uint32_t client_id;
	uint32_t narenas;
	const void *arena[KVB_MAX_ARENAS];
	uint64_t arena_size[KVB_MAX_ARENAS];
	uint32_t seq;
};

/*
 * Connects to sock and sends HELLO with this ABI major and sq_entries. Returns the reply's res
 * (0 on success, the region mapped and the rings ready) or a negative errno: the broker's
 * refusal, or -ECONNRESET when it hung up without replying. r->sock stays open on refusal so
 * the caller can check that the broker closes it.
 */
int harness_raw_hello(struct harness_raw *r, const char *sock, uint16_t abi_major,
		      uint32_t sq_entries);

/*
 * One control request and its reply: returns res, copies up to reply_max body bytes (after
 * struct kvb_msg_reply) into reply. fd (or -1) travels with the request.
 */
int harness_raw_call(struct harness_raw *r, uint16_t type, const void *body, size_t len, int fd,
		     void *reply, size_t reply_max);

/* Sends one datagram verbatim (for malformed ones); returns 0 or -errno. */
int harness_raw_send(struct harness_raw *r, const void *buf, size_t len);

int harness_raw_ns_open(struct harness_raw *r, const struct kvb_layout *l, uint32_t *ns,
			uint64_t *page_bytes);

/* Creates a sealed memfd of len bytes, maps it at *map and registers it; returns the res. */
int harness_raw_buf_reg(struct harness_raw *r, size_t len, uint32_t *buf, void **map);

/* Copies n SQEs into the SQ, publishes them and rings the doorbell when the broker sleeps.
 * Returns how many fit. */
int harness_raw_submit(struct harness_raw *r, const struct kvb_sqe *sqes, uint32_t n);

/* Rings the SQ doorbell unconditionally. */
void harness_raw_doorbell(struct harness_raw *r);

/* Reaps up to max CQEs, waiting up to timeout_ms for at least min; returns the count reaped
 * (fewer than min on timeout), or -EPROTO when the CQ indices are impossible. */
int harness_raw_reap(struct harness_raw *r, struct kvb_cqe *out, uint32_t max, uint32_t min,
		     int timeout_ms);

/* The shared words, for tests that scribble on them. */
kvb_atomic_u32 *harness_raw_word(struct harness_raw *r, uint32_t off);

/* 1 when the broker closed the control socket within timeout_ms, else 0. */
int harness_raw_hung_up(struct harness_raw *r, int timeout_ms);

void harness_raw_close(struct harness_raw *r);

/* ---- the tools (harness_run.c) ---- */

/* Path of a program built beside the tests: BUILD/bin/name. */
void harness_bin_path(const char *name, char *out, size_t len);

/*
 * Runs "BUILD/bin/prog args 2>&1" (prog itself when it is an absolute path) through the shell (args are shell words) and returns its exit
 * code (128 + signal when killed), its stdout and stderr in *out (free it).
 */
int harness_run_tool(const char *prog, const char *args, char **out);

/*
 * A client process of another uid (root only): this test binary re-executed as uid:gid with no
 * supplementary groups through setpriv, as "self --client MODE ARG" (its main must dispatch
 * that to client_main), or, where setpriv cannot run it, a forked child that drops to them
 * itself and exits with client_main(mode, arg). harness_wait_exit(): its exit code, or 128 +
 * the signal that killed it.
 */
pid_t harness_start_as(uid_t uid, gid_t gid, const char *mode, const char *arg,
		       int (*client_main)(const char *mode, const char *arg));
int harness_wait_exit(pid_t pid);

/* Keepers of the broker on sock (pool.c [keep]): processes "kvbrokerd --keeper N <sock>". */
int harness_keepers(const char *sock);

#endif /* KVB_TESTS_HARNESS_H */
