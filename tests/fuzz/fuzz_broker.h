/* SPDX-License-Identifier: MIT */
/*
 * fuzz_broker.h - a real broker core (pool, store, namespaces, copy engine, sessions) inside a
 * libFuzzer process, so the fuzz targets drive the broker's own session_poll(), ops_submit() and
 * session_on_msg() rather than a model of them. One thread; no event loop runs: each target
 * calls the session functions the loop would call, and then checks the invariants a hostile
 * client must never break (every lease and pin released at teardown, no fd or mapping leaked,
 * no dead session left unfreed).
 */
#ifndef KVB_TESTS_FUZZ_BROKER_H
#define KVB_TESTS_FUZZ_BROKER_H

#include <stddef.h>
#include <stdint.h>

#include "broker.h"

/* Two namespaces: FUZZ_NS_A (16 KiB pages, one component), FUZZ_NS_B (1 KiB pages, two
 * components: 5 view parts). Buffers 0 and 1 of every session are FUZZ_BUF_LEN bytes. */
#define FUZZ_BUF_LEN (64u * 1024)

struct fuzz_broker {
	struct broker b;
	uint32_t ns_a, ns_b;
	uint64_t pb_a, pb_b;
	int fd_probe;  /* session-kind fds open after set-up: a leak raises the count */
	int map_probe; /* shared mappings after set-up: a leaked ring or buffer raises it */
};

/* The process-wide broker, created on first use (pool is an unlinked shm object). */
struct fuzz_broker *fuzz_broker(void);

/*
 * A ring client of sq_entries (clamped to a power of two in 8..64) with both namespaces open,
 * two registered host buffers, and on FUZZ_NS_B view 0 over buffer 1 and view 1 (page strides)
 * over buffer 0. Its rings start at index base.
 */
struct session *fuzz_session_ring(struct fuzz_broker *fb, uint32_t sq_entries, uint32_t base);

/* A freshly accepted control connection on one end of a socketpair; *peer gets the other. */
struct session *fuzz_session_sock(struct fuzz_broker *fb, int *peer);

/* Ends a session (if still alive), reaps it and checks that nothing it held is left. */
void fuzz_session_end(struct fuzz_broker *fb, struct session *s, int alive);

/* abort()s with a message: the oracle's failure, which libFuzzer reports as a crash. */
void fuzz_fail(const char *what) __attribute__((noreturn));

#endif /* KVB_TESTS_FUZZ_BROKER_H */
