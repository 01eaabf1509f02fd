// SPDX-License-Identifier: MIT
/*
 * test_ring.c - the SPSC ring of proto/ring.h on a heap region: empty, full, wrap-around of the
 * free-running uint32_t indices, batch publish, detection of impossible indices, the NEED_WAKEUP
 * sleep/doorbell protocol, and two threads pushing millions of sequence-numbered entries.
 *
 * The region mimics the real one: head, tail and flags words on their own cache lines, so the
 * threaded test measures the same sharing pattern the broker and client see. The threaded test
 * also runs under TSan (make tsan); TSan cannot see across processes, which is why the stress
 * test uses threads rather than fork.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

/*
 * GCC 12 warns that TSan does not model atomic_thread_fence ([W1] in ring.h). Every access the
 * fences order is itself atomic, so TSan sees no race either way; it just cannot prove the
 * Dekker pairing. Silence the warning here so make tsan builds with -Werror.
 */
#if defined(__SANITIZE_THREAD__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#pragma GCC diagnostic ignored "-Wtsan"
#endif
#include "clock.h"
#include "ring.h"
#include "wire.h"

#define LINE 64

/* One ring's shared words, each on its own cache line as in the real region. */
struct shared {
	_Alignas(LINE) kvb_atomic_u32 tail;
	_Alignas(LINE) kvb_atomic_u32 head;
	_Alignas(LINE) kvb_atomic_u32 flags;
	_Alignas(LINE) char pad;
};

struct entry {
	uint64_t seq;
	uint64_t check; /* ~seq: a torn or stale entry shows up as a mismatch */
};

struct fixture {
	struct shared *sh;
	struct entry *ents;
	uint32_t nentries;
	struct kvb_ring prod;
	struct kvb_ring cons;
};

static void fixture_init(struct fixture *f, uint32_t nentries, uint32_t start)
{
	f->sh = aligned_alloc(LINE, sizeof(*f->sh));
	assert_non_null(f->sh);
	memset(f->sh, 0, sizeof(*f->sh));
	f->ents = calloc(nentries, sizeof(*f->ents));
	assert_non_null(f->ents);
	f->nentries = nentries;
	atomic_init(&f->sh->head, start);
	atomic_init(&f->sh->tail, start);
	atomic_init(&f->sh->flags, 0);
	kvb_ring_init(&f->prod, &f->sh->head, &f->sh->tail, &f->sh->flags, f->ents, nentries,
		      sizeof(struct entry), 1);
	kvb_ring_init(&f->cons, &f->sh->head, &f->sh->tail, &f->sh->flags, f->ents, nentries,
		      sizeof(struct entry), 0);
}

static void fixture_fini(struct fixture *f)
{
	free(f->ents);
	free(f->sh);
}

/* Producer: write n entries with sequence numbers from *seq and publish them in one batch. */
static void push(struct fixture *f, uint32_t n, uint64_t *seq)
{
	for (uint32_t i = 0; i < n; i++) {
		struct entry *e = kvb_ring_prod_slot(&f->prod, i);

		e->seq = *seq;
		e->check = ~*seq;
		(*seq)++;
	}
	kvb_ring_publish(&f->prod, n);
}

/* Consumer: read n entries, check they continue the sequence from *seq, and hand them back. */
static void pop(struct fixture *f, uint32_t n, uint64_t *seq)
{
	for (uint32_t i = 0; i < n; i++) {
		const struct entry *e = kvb_ring_cons_slot(&f->cons, i);

		assert_int_equal(e->seq, *seq);
		assert_int_equal(e->check, ~*seq);
		(*seq)++;
	}
	kvb_ring_consume(&f->cons, n);
}

static void test_ring_empty(void **state)
{
	struct fixture f;

	(void)state;
	fixture_init(&f, 8, 0);
	assert_int_equal(kvb_ring_entries(&f.prod), 8);
	assert_int_equal(kvb_ring_avail(&f.cons), 0);
	assert_int_equal(kvb_ring_space(&f.prod), 8);
	/* Writing a slot without publishing it must not make it visible. */
	((struct entry *)kvb_ring_prod_slot(&f.prod, 0))->seq = 42;
	assert_int_equal(kvb_ring_avail(&f.cons), 0);
	fixture_fini(&f);
}

/*
 * kvb_ring_space_min(): the room from the head seen last while that is enough (no load of the
 * consumer's line), a fresh load when it is not, and the sanity check of a fresh load kept.
 */
static void test_ring_space_min(void **state)
{
	struct fixture f;
	uint64_t wseq = 0, rseq = 0;

	(void)state;
	fixture_init(&f, 16, 0);
	push(&f, 10, &wseq);
	assert_int_equal(kvb_ring_space_min(&f.prod, 1), 6);
	pop(&f, 4, &rseq);
	/* 6 left by the cached head: enough for 1, so the consumer's new head is not read. */
	assert_int_equal(kvb_ring_space_min(&f.prod, 1), 6);
	/* Asking for more than that reads it: the 4 freed slots appear. */
	assert_int_equal(kvb_ring_space_min(&f.prod, 7), 10);
	push(&f, 10, &wseq);
	assert_int_equal(kvb_ring_space_min(&f.prod, 1), 0);
	pop(&f, 16, &rseq);
	assert_int_equal(kvb_ring_space_min(&f.prod, 1), 16);
	/* An impossible head is still caught when it has to be read. */
	push(&f, 16, &wseq);
	kvb_store_release(f.prod.head, f.prod.local + 5);
	assert_int_equal(kvb_ring_space_min(&f.prod, 1), -1);
	fixture_fini(&f);
}

static void test_ring_full(void **state)
{
	struct fixture f;
	uint64_t wseq = 0, rseq = 0;

	(void)state;
	fixture_init(&f, 16, 0);
	push(&f, 16, &wseq);
	assert_int_equal(kvb_ring_space(&f.prod), 0);
	assert_int_equal(kvb_ring_avail(&f.cons), 16);
	/* Consuming one frees exactly one slot, and only once the head is published. */
	pop(&f, 1, &rseq);
	assert_int_equal(kvb_ring_space(&f.prod), 1);
	push(&f, 1, &wseq);
	assert_int_equal(kvb_ring_space(&f.prod), 0);
	assert_int_equal(kvb_ring_avail(&f.cons), 16);
	pop(&f, 16, &rseq);
	assert_int_equal(kvb_ring_avail(&f.cons), 0);
	assert_int_equal(kvb_ring_space(&f.prod), 16);
	assert_int_equal(rseq, 17);
	fixture_fini(&f);
}

/*
 * Start both indices a few entries below UINT32_MAX and run the ring around the wrap of the
 * uint32_t counters several times with uneven batches: tail - head must stay correct across the
 * wrap, and slots must follow index & mask.
 */
static void test_ring_wraparound(void **state)
{
	const uint32_t start = UINT32_MAX - 5;
	struct fixture f;
	uint64_t wseq = 0, rseq = 0;
	int wrapped = 0;

	(void)state;
	fixture_init(&f, 8, start);
	assert_int_equal(f.prod.local, start);
	assert_int_equal(f.cons.local, start);
	assert_int_equal(kvb_ring_space(&f.prod), 8);
	/* The first slot is start & mask, not slot 0. */
	assert_ptr_equal(kvb_ring_prod_slot(&f.prod, 0), &f.ents[start & 7]);
	for (int round = 0; round < 100; round++) {
		uint32_t n = 1 + (uint32_t)round % 8;
		int64_t space = kvb_ring_space(&f.prod);

		assert_true(space >= 0);
		if ((uint32_t)space < n)
			n = (uint32_t)space;
		push(&f, n, &wseq);
		assert_int_equal(kvb_ring_avail(&f.cons), wseq - rseq);
		/* Leave a few entries behind now and then so the ring is often partly full. */
		pop(&f, (uint32_t)(wseq - rseq) - (round % 3 == 0 && wseq - rseq > 1), &rseq);
		if (f.prod.local < start)
			wrapped = 1;
	}
	assert_true(wrapped);
	assert_int_equal(atomic_load(&f.sh->tail), (uint32_t)(start + wseq));
	assert_int_equal(atomic_load(&f.sh->head), (uint32_t)(start + rseq));
	/* Full across the wrap: head below UINT32_MAX, tail above 0. */
	fixture_fini(&f);
	fixture_init(&f, 8, UINT32_MAX - 3);
	wseq = rseq = 0;
	push(&f, 8, &wseq);
	assert_int_equal(atomic_load(&f.sh->tail), 4);
	assert_int_equal(kvb_ring_space(&f.prod), 0);
	assert_int_equal(kvb_ring_avail(&f.cons), 8);
	pop(&f, 8, &rseq);
	assert_int_equal(kvb_ring_space(&f.prod), 8);
	fixture_fini(&f);
}

/* A batch becomes visible all at once, at publish, and slots are where prod_slot said. */
static void test_ring_batch_publish(void **state)
{
	struct fixture f;
	uint64_t wseq = 100, rseq = 100;

	(void)state;
	fixture_init(&f, 32, 7);
	for (uint32_t i = 0; i < 20; i++) {
		struct entry *e = kvb_ring_prod_slot(&f.prod, i);

		assert_ptr_equal(e, &f.ents[(7 + i) & 31]);
		e->seq = wseq + i;
		e->check = ~(wseq + i);
		assert_int_equal(kvb_ring_avail(&f.cons), 0);
	}
	kvb_ring_publish(&f.prod, 20);
	wseq += 20;
	assert_int_equal(atomic_load(&f.sh->tail), 27);
	assert_int_equal(kvb_ring_avail(&f.cons), 20);
	assert_int_equal(f.cons.cached, 27);
	assert_int_equal(kvb_ring_space(&f.prod), 12);
	/* The consumer may also hand slots back in pieces. */
	pop(&f, 5, &rseq);
	assert_int_equal(kvb_ring_space(&f.prod), 17);
	assert_int_equal(kvb_ring_avail(&f.cons), 15);
	pop(&f, 15, &rseq);
	assert_int_equal(rseq, wseq);
	assert_int_equal(kvb_ring_avail(&f.cons), 0);
	fixture_fini(&f);
}

/*
 * Indices written by a hostile peer: a tail more than a ring ahead of our head, a tail behind our
 * head, a head ahead of our tail, a head more than a ring behind. All return -1 and leave the
 * cached view alone; the exact boundary (a ring of distance) is still sane.
 */
static void test_ring_insane_indices(void **state)
{
	struct fixture f;

	(void)state;
	fixture_init(&f, 16, 1000);
	f.cons.cached = 1000;
	/* Exactly full is possible. */
	atomic_store(&f.sh->tail, 1016);
	assert_int_equal(kvb_ring_avail(&f.cons), 16);
	/* One more than a ring's worth is not. */
	atomic_store(&f.sh->tail, 1017);
	assert_int_equal(kvb_ring_avail(&f.cons), -1);
	assert_int_equal(f.cons.cached, 1016);
	/* A tail behind the consumer's own head (distance wraps to ~4 G). */
	atomic_store(&f.sh->tail, 999);
	assert_int_equal(kvb_ring_avail(&f.cons), -1);
	atomic_store(&f.sh->tail, UINT32_MAX);
	assert_int_equal(kvb_ring_avail(&f.cons), -1);
	assert_true(kvb_ring_sane(&f.cons, 1000, 1016));
	assert_false(kvb_ring_sane(&f.cons, 1000, 1017));
	assert_false(kvb_ring_sane(&f.cons, 1000, 999));

	/* Producer side: our tail is 1000; the consumer's head must be within a ring behind it. */
	atomic_store(&f.sh->head, 984);
	assert_int_equal(kvb_ring_space(&f.prod), 0);
	atomic_store(&f.sh->head, 983);
	assert_int_equal(kvb_ring_space(&f.prod), -1);
	atomic_store(&f.sh->head, 1001); /* consumed more than was ever produced */
	assert_int_equal(kvb_ring_space(&f.prod), -1);
	atomic_store(&f.sh->head, 1000);
	assert_int_equal(kvb_ring_space(&f.prod), 16);

	/* Near the wrap too: head UINT32_MAX - 1, tail 15 is 17 ahead. */
	fixture_fini(&f);
	fixture_init(&f, 16, UINT32_MAX - 1);
	atomic_store(&f.sh->tail, 14);
	assert_int_equal(kvb_ring_avail(&f.cons), 16);
	atomic_store(&f.sh->tail, 15);
	assert_int_equal(kvb_ring_avail(&f.cons), -1);
	fixture_fini(&f);
}

/*
 * The NEED_WAKEUP protocol as a single thread sees it: a sleeper on an empty ring sets the flag
 * and may block; a producer that publishes afterwards sees the flag; a sleeper that finds an entry
 * raced in (published before its re-check) backs off and clears the flag.
 */
static void test_ring_wakeup_flag(void **state)
{
	struct fixture f;
	uint64_t wseq = 0, rseq = 0;

	(void)state;
	fixture_init(&f, 8, UINT32_MAX);
	assert_int_equal(kvb_ring_needs_wakeup(&f.prod, KVB_SQ_NEED_WAKEUP), 0);

	/* Empty: may sleep, flag stays set, producer must ring. */
	assert_int_equal(kvb_ring_prepare_sleep(&f.cons, KVB_SQ_NEED_WAKEUP), 1);
	assert_int_equal(atomic_load(&f.sh->flags) & KVB_SQ_NEED_WAKEUP, KVB_SQ_NEED_WAKEUP);
	push(&f, 1, &wseq);
	assert_int_equal(kvb_ring_needs_wakeup(&f.prod, KVB_SQ_NEED_WAKEUP), 1);

	/* The woken consumer clears the flag and drains. */
	kvb_flag_clear(&f.sh->flags, KVB_SQ_NEED_WAKEUP);
	assert_int_equal(kvb_ring_needs_wakeup(&f.prod, KVB_SQ_NEED_WAKEUP), 0);
	assert_int_equal(kvb_ring_avail(&f.cons), 1);
	pop(&f, 1, &rseq);

	/* An entry published before the sleeper's re-check: no sleep, flag cleared again. */
	push(&f, 3, &wseq);
	assert_int_equal(kvb_ring_prepare_sleep(&f.cons, KVB_SQ_NEED_WAKEUP), 0);
	assert_int_equal(atomic_load(&f.sh->flags) & KVB_SQ_NEED_WAKEUP, 0);
	assert_int_equal(kvb_ring_avail(&f.cons), 3);
	pop(&f, 3, &rseq);

	/* Other bits of the flags word are left alone by set and clear. */
	atomic_store(&f.sh->flags, 0x80u);
	assert_int_equal(kvb_ring_prepare_sleep(&f.cons, KVB_SQ_NEED_WAKEUP), 1);
	assert_int_equal(atomic_load(&f.sh->flags), 0x80u | KVB_SQ_NEED_WAKEUP);
	kvb_flag_clear(&f.sh->flags, KVB_SQ_NEED_WAKEUP);
	assert_int_equal(atomic_load(&f.sh->flags), 0x80u);
	assert_int_equal(kvb_ring_needs_wakeup(&f.prod, KVB_SQ_NEED_WAKEUP), 0);
	fixture_fini(&f);
}

/* ---- two threads ---- */

#define STRESS_TARGET (32u << 20) /* entries; under sanitizers the time budget ends it first */
#define STRESS_BUDGET_NS 1000000000ull
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define STRESS_MIN 10000u
#else
#define STRESS_MIN 100000u /* a loaded 2-vCPU machine still moves 0.5 M/s */
#endif

struct stress {
	struct fixture f;
	int doorbell;	/* eventfd: the producer rings it when the consumer sleeps */
	uint64_t total; /* entries the producer will send (set before start) */
	uint64_t sent;
	uint64_t received;
	uint64_t sleeps;       /* consumer went to sleep on the doorbell */
	uint64_t rings;	       /* producer rang the doorbell */
	uint64_t lost_wakeups; /* consumer timed out asleep while entries were ready */
	uint64_t bad;	       /* consumer: first out-of-sequence entry + 1, or 0 */
	int prod_err;	       /* producer: the ring or the doorbell failed */
	kvb_atomic_u32 stop;   /* producer's deadline passed: total is final */
};

/* xorshift: batch sizes that vary without depending on libc's rand state. */
static uint32_t rnd(uint32_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

static void *producer(void *arg)
{
	struct stress *s = arg;
	struct kvb_ring *r = &s->f.prod;
	uint64_t seq = 0, deadline = clock_ns() + STRESS_BUDGET_NS;
	uint32_t seed = 0x9e3779b9u;

	while (seq < s->total) {
		int64_t space = kvb_ring_space(r);
		uint32_t n;

		if (space < 0) {
			s->prod_err = 1;
			break;
		}
		if (space == 0) {
			sched_yield();
			continue;
		}
		n = 1 + rnd(&seed) % 64;
		if (n > space)
			n = (uint32_t)space;
		if (n > s->total - seq)
			n = (uint32_t)(s->total - seq);
		for (uint32_t i = 0; i < n; i++) {
			struct entry *e = kvb_ring_prod_slot(r, i);

			e->seq = seq + i;
			e->check = ~(seq + i);
		}
		kvb_ring_publish(r, n);
		seq += n;
		if (kvb_ring_needs_wakeup(r, KVB_SQ_NEED_WAKEUP)) {
			uint64_t one = 1;

			s->rings++;
			if (write(s->doorbell, &one, sizeof(one)) != sizeof(one))
				s->prod_err = 1;
		}
		/* Now and then pause so the consumer runs dry and exercises the sleep path. */
		if ((seq & 0xffff) < n)
			usleep(50);
		if ((seq & 0xfff) < n && clock_ns() > deadline)
			break;
	}
	s->sent = seq;
	kvb_store_release(&s->stop, 1);
	/* The consumer may be asleep waiting for more: wake it so it sees stop. */
	{
		uint64_t one = 1;

		if (write(s->doorbell, &one, sizeof(one)) != sizeof(one))
			s->prod_err = 1;
	}
	return NULL;
}

static void *consumer(void *arg)
{
	struct stress *s = arg;
	struct kvb_ring *r = &s->f.cons;
	uint64_t seq = 0;
	unsigned idle = 0;

	for (;;) {
		int64_t avail = kvb_ring_avail(r);

		if (avail < 0) {
			s->bad = UINT64_MAX;
			break;
		}
		if (avail == 0) {
			struct pollfd p = {.fd = s->doorbell, .events = POLLIN};
			uint64_t v;
			int rc;

			if (kvb_load_acquire(&s->stop) && kvb_ring_avail(r) == 0 && seq >= s->sent)
				break;
			if (++idle < 256) {
				kvb_cpu_relax();
				continue;
			}
			idle = 0;
			if (!kvb_ring_prepare_sleep(r, KVB_SQ_NEED_WAKEUP))
				continue;
			s->sleeps++;
			rc = poll(&p, 1, 2000);
			kvb_flag_clear(r->flags, KVB_SQ_NEED_WAKEUP);
			if (rc == 0 && kvb_ring_avail(r) > 0)
				s->lost_wakeups++;
			if (rc > 0 && read(s->doorbell, &v, sizeof(v)) != sizeof(v))
				s->bad = UINT64_MAX;
			if (rc == 0 && !kvb_load_acquire(&s->stop))
				s->lost_wakeups++; /* a 2 s stall with a live producer */
			continue;
		}
		idle = 0;
		for (uint32_t i = 0; i < avail; i++) {
			const struct entry *e = kvb_ring_cons_slot(r, i);

			if (!s->bad && (e->seq != seq + i || e->check != ~(seq + i)))
				s->bad = seq + i + 1;
		}
		kvb_ring_consume(r, (uint32_t)avail);
		seq += (uint64_t)avail;
	}
	s->received = seq;
	return NULL;
}

static void run_stress(uint32_t nentries, uint32_t start)
{
	struct stress *s = calloc(1, sizeof(*s));
	pthread_t tp, tc;
	uint64_t t0, t1;

	assert_non_null(s);
	fixture_init(&s->f, nentries, start);
	s->doorbell = eventfd(0, EFD_CLOEXEC);
	assert_true(s->doorbell >= 0);
	s->total = STRESS_TARGET;
	atomic_init(&s->stop, 0);
	t0 = clock_ns();
	assert_int_equal(pthread_create(&tc, NULL, consumer, s), 0);
	assert_int_equal(pthread_create(&tp, NULL, producer, s), 0);
	assert_int_equal(pthread_join(tp, NULL), 0);
	assert_int_equal(pthread_join(tc, NULL), 0);
	t1 = clock_ns();
	printf("# ring %u entries from %u: %llu entries in %.3f s (%.1f M/s), %llu sleeps, "
	       "%llu doorbells\n",
	       nentries, start, (unsigned long long)s->received, (double)(t1 - t0) / 1e9,
	       (double)s->received * 1e3 / (double)(t1 - t0), (unsigned long long)s->sleeps,
	       (unsigned long long)s->rings);
	if (s->bad)
		printf("# first bad entry: %llu (UINT64_MAX: ring error)\n",
		       (unsigned long long)s->bad - 1);
	assert_int_equal(s->prod_err, 0);
	assert_int_equal(s->bad, 0);
	assert_int_equal(s->lost_wakeups, 0);
	assert_int_equal(s->received, s->sent);
	/* Millions normally; sanitizers slow every atomic and access by 5-20x. */
	assert_true(s->received >= STRESS_MIN);
	close(s->doorbell);
	fixture_fini(&s->f);
	free(s);
}

static void test_ring_two_threads(void **state)
{
	(void)state;
	/* A small ring near the uint32_t wrap: many full/empty transitions and index wraps. */
	run_stress(64, UINT32_MAX - 1000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ring_empty),
		cmocka_unit_test(test_ring_full),
		cmocka_unit_test(test_ring_space_min),
		cmocka_unit_test(test_ring_wraparound),
		cmocka_unit_test(test_ring_batch_publish),
		cmocka_unit_test(test_ring_insane_indices),
		cmocka_unit_test(test_ring_wakeup_flag),
		cmocka_unit_test(test_ring_two_threads),
	};

	setvbuf(stdout, NULL, _IOLBF, 0);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
