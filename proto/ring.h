/* SPDX-License-Identifier: MIT */
/*
 * ring.h - the single-producer single-consumer rings of the ring region, and the only place
 * where atomics are spelled out.
 *
 * Index protocol (DPDK rte_ring_c11 / io_uring):
 *   - head and tail are free-running uint32_t counters; an entry lives at index & mask. The ring
 *     holds tail - head entries (unsigned arithmetic makes wrap-around free), never more than
 *     entries.
 *   - Producer: writes the entries at tail..tail+n-1, then store-release tail+n [R1]. It reads the
 *     consumer's head with load-acquire [R2] to know the free space.
 *   - Consumer: load-acquire tail [R1 pairs], reads entries, then store-release head [R2 pairs],
 *     which hands the slots back to the producer only after the reads are done.
 *   - Each side keeps a private copy of its own index; the shared one is written, never re-read,
 *     by its owner. The other side's index is untrusted when it comes from a client: callers
 *     check that 0 <= tail - head <= entries before using it (kvb_ring_sane()).
 *
 * Wake-up protocol (io_uring SQPOLL), for either direction:
 *   - Sleeper: sets NEED_WAKEUP in the flags word, full fence [W1], re-reads the tail; only when
 *     still empty does it block on its doorbell (an eventfd).
 *   - Producer: publishes the tail, full fence [W1 pairs], reads the flags; rings the doorbell
 *     only when NEED_WAKEUP is set. The two fences make it impossible for both the producer to
 *     miss the flag and the sleeper to miss the tail.
 *
 * Thread-safety: one producer and one consumer per ring; they may be in different processes.
 */
#ifndef KVB_PROTO_RING_H
#define KVB_PROTO_RING_H

#include <assert.h>
#include <stdatomic.h>
#include <stdint.h>

/* Only lock-free atomics work across processes. */
static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free");
static_assert(sizeof(_Atomic uint32_t) == sizeof(uint32_t), "atomic u32 layout");

typedef _Atomic uint32_t kvb_atomic_u32;
typedef _Atomic uint64_t kvb_atomic_u64;
static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free (hazard table)");
static_assert(sizeof(kvb_atomic_u64) == sizeof(uint64_t), "atomic u64 layout");

/* The hazard table's entries (wire.h [hazard]). */
static inline uint64_t kvb_load64_relaxed(const kvb_atomic_u64 *p)
{
	return atomic_load_explicit(p, memory_order_relaxed);
}

/* Pairs with the client's release store that clears an entry after its reads. */
static inline uint64_t kvb_load64_acquire(const kvb_atomic_u64 *p)
{
	return atomic_load_explicit(p, memory_order_acquire);
}

static inline void kvb_store64_relaxed(kvb_atomic_u64 *p, uint64_t v)
{
	atomic_store_explicit(p, v, memory_order_relaxed);
}

static inline void kvb_store64_release(kvb_atomic_u64 *p, uint64_t v)
{
	atomic_store_explicit(p, v, memory_order_release);
}

static inline uint32_t kvb_load_acquire(const kvb_atomic_u32 *p)
{
	return atomic_load_explicit(p, memory_order_acquire);
}

static inline uint32_t kvb_load_relaxed(const kvb_atomic_u32 *p)
{
	return atomic_load_explicit(p, memory_order_relaxed);
}

static inline void kvb_store_release(kvb_atomic_u32 *p, uint32_t v)
{
	atomic_store_explicit(p, v, memory_order_release);
}

static inline void kvb_store_relaxed(kvb_atomic_u32 *p, uint32_t v)
{
	atomic_store_explicit(p, v, memory_order_relaxed);
}

static inline void kvb_fence_full(void)
{
	atomic_thread_fence(memory_order_seq_cst);
}

/* The seqlock fences of the pool directory (pooldir.h [D1], [D2]). */
static inline void kvb_fence_acquire(void)
{
	atomic_thread_fence(memory_order_acquire);
}

static inline void kvb_fence_release(void)
{
	atomic_thread_fence(memory_order_release);
}

static inline void kvb_flag_set(kvb_atomic_u32 *p, uint32_t bits)
{
	atomic_fetch_or_explicit(p, bits, memory_order_relaxed);
}

static inline void kvb_flag_clear(kvb_atomic_u32 *p, uint32_t bits)
{
	atomic_fetch_and_explicit(p, ~bits, memory_order_relaxed);
}

static inline void kvb_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}

/* One side's view of a ring: where the shared words and entries are, and its private index. */
struct kvb_ring {
	kvb_atomic_u32 *head;
	kvb_atomic_u32 *tail;
	kvb_atomic_u32 *flags;
	void *entries;
	uint32_t mask;
	uint32_t esize;	 /* bytes per entry */
	uint32_t local;	 /* producer: our tail; consumer: our head */
	uint32_t cached; /* producer: last head seen; consumer: last tail seen */
};

static inline void kvb_ring_init(struct kvb_ring *r, kvb_atomic_u32 *head, kvb_atomic_u32 *tail,
				 kvb_atomic_u32 *flags, void *entries, uint32_t nentries,
				 uint32_t esize, int producer)
{
	r->head = head;
	r->tail = tail;
	r->flags = flags;
	r->entries = entries;
	r->mask = nentries - 1;
	r->esize = esize;
	r->local = producer ? kvb_load_relaxed(tail) : kvb_load_relaxed(head);
	r->cached = producer ? kvb_load_relaxed(head) : kvb_load_relaxed(tail);
}

static inline uint32_t kvb_ring_entries(const struct kvb_ring *r)
{
	return r->mask + 1;
}

static inline void *kvb_ring_slot(const struct kvb_ring *r, uint32_t idx)
{
	return (char *)r->entries + (uint64_t)(idx & r->mask) * r->esize;
}

/* Is an (untrusted) distance between two indices possible? */
static inline int kvb_ring_sane(const struct kvb_ring *r, uint32_t head, uint32_t tail)
{
	return tail - head <= kvb_ring_entries(r);
}

/*
 * Producer: free slots. Reads the consumer's head [R2]. Returns -1 when the head is impossible
 * (a hostile consumer), which the caller treats as a protocol violation.
 */
static inline int64_t kvb_ring_space(struct kvb_ring *r)
{
	uint32_t head = kvb_load_acquire(r->head); /* [R2] pairs with the consumer's release */

	if (!kvb_ring_sane(r, head, r->local))
		return -1;
	r->cached = head;
	return kvb_ring_entries(r) - (r->local - head);
}

/*
 * Producer: free slots, from the head last seen while that leaves at least want of them;
 * otherwise as kvb_ring_space(). The consumer's head line is written by the other side on
 * every consume, so re-reading it is a cross-CPU cache miss on the way to every publish
 * (the fixed cost per op); the head only grows, so the old value under-counts the
 * room and is always safe to use. A cached head passed kvb_ring_sane() when it was read and
 * our tail grew only within the room it left, so it is still sane.
 */
static inline int64_t kvb_ring_space_min(struct kvb_ring *r, uint32_t want)
{
	uint32_t room = kvb_ring_entries(r) - (r->local - r->cached);

	if (room >= want && room <= kvb_ring_entries(r))
		return room;
	return kvb_ring_space(r);
}

/* Producer: the slot for the n-th entry after our tail (call within the space returned). */
static inline void *kvb_ring_prod_slot(const struct kvb_ring *r, uint32_t n)
{
	return kvb_ring_slot(r, r->local + n);
}

/* Producer: make n written entries visible [R1]. */
static inline void kvb_ring_publish(struct kvb_ring *r, uint32_t n)
{
	r->local += n;
	kvb_store_release(r->tail, r->local); /* [R1] pairs with the consumer's acquire */
}

/*
 * Consumer: entries ready. Reads the producer's tail once [R1]. Returns -1 when the tail is
 * impossible (a hostile producer).
 */
static inline int64_t kvb_ring_avail(struct kvb_ring *r)
{
	uint32_t tail = kvb_load_acquire(r->tail); /* [R1] pairs with the producer's release */

	if (!kvb_ring_sane(r, r->local, tail))
		return -1;
	r->cached = tail;
	return tail - r->local;
}

/* Consumer: the n-th ready entry. */
static inline void *kvb_ring_cons_slot(const struct kvb_ring *r, uint32_t n)
{
	return kvb_ring_slot(r, r->local + n);
}

/* Consumer: hand n consumed slots back [R2]. */
static inline void kvb_ring_consume(struct kvb_ring *r, uint32_t n)
{
	r->local += n;
	kvb_store_release(r->head, r->local); /* [R2] pairs with the producer's acquire */
}

/* Producer side of [W1]: after publishing, does the consumer sleep? */
static inline int kvb_ring_needs_wakeup(const struct kvb_ring *r, uint32_t flag)
{
	kvb_fence_full(); /* [W1] pairs with the sleeper's fence in kvb_ring_prepare_sleep() */
	return (kvb_load_relaxed(r->flags) & flag) != 0;
}

/*
 * Consumer side of [W1]: announce sleep, then re-check. Returns 1 when it may block (ring still
 * empty), 0 when entries arrived meanwhile (the flag is cleared again).
 */
static inline int kvb_ring_prepare_sleep(struct kvb_ring *r, uint32_t flag)
{
	kvb_flag_set(r->flags, flag);
	kvb_fence_full(); /* [W1] pairs with the producer's fence in kvb_ring_needs_wakeup() */
	if (kvb_load_acquire(r->tail) != r->local) {
		kvb_flag_clear(r->flags, flag);
		return 0;
	}
	return 1;
}

#endif /* KVB_PROTO_RING_H */
