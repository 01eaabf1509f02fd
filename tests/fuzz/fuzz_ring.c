// SPDX-License-Identifier: MIT
/*
 * fuzz_ring.c - libFuzzer target over raw ring images: whatever a client can put in its ring
 * region (SQEs, the SQ tail, the CQ head, the argument area), consumed by the broker's real
 * session_poll() -> ops_submit() -> kvb_sqe_check() against a real store.
 *
 * Input, all little-endian:
 *   [0]      ring size: 8 << (byte & 3) SQ entries
 *   [1..4]   base: the rings' starting index (exercises wrap-around at 2^32)
 *   [5..6]   n: bytes for the argument area, then n bytes (LOOKUP keys and tiers live there)
 *   rounds:  u32 tail_lie, u32 cq_back, u8 nsqe, then up to nsqe x 64 SQE bytes. The SQEs go
 *            into the slots after our tail; the shared SQ tail is published as tail + tail_lie
 *            and the CQ head as (CQ tail - cq_back): 0 and 0 are an honest client. Then the
 *            broker polls once.
 *   An SQE whose off has 0xEE in its top byte (RELEASE) gets the lease of ACQUIRE completion
 *   number (off & 0xff) instead, so the fuzzer reaches real releases, double releases included.
 *
 * Oracles beyond ASan/UBSan: every SQE the broker consumed got exactly one CQE, in order, with
 * its user_data; every CQE's res is >= -4095; an honest index never ends the session; and when
 * the session ends every lease and pin it held is gone and no fd leaked (fuzz_session_end).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_broker.h"
#include "proto.h"

#define MAX_LEASES 256

static uint32_t rd32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_broker *fb = fuzz_broker();
	struct session *s;
	uint64_t leases[MAX_LEASES];
	uint32_t nleases = 0, base, tail, entries, cq_tail_seen;
	size_t pos = 0, n;
	int alive = 1;

	if (size < 7)
		return 0;
	base = rd32(data + 1);
	s = fuzz_session_ring(fb, 8u << (data[0] & 3), base);
	entries = s->sq.mask + 1;
	n = (size_t)data[5] | (size_t)data[6] << 8;
	pos = 7;
	if (n > size - pos)
		n = size - pos;
	if (n > s->arg_size)
		n = s->arg_size;
	memcpy(s->arg, data + pos, n);
	pos += n;
	tail = base;
	cq_tail_seen = base;

	while (alive && pos + 9 <= size) {
		uint32_t tail_lie = rd32(data + pos), cq_back = rd32(data + pos + 4);
		uint32_t nsqe = data[pos + 8], head0, head1, cq_tail, told;
		int rc;

		pos += 9;
		head0 = kvb_load_relaxed(s->sq.head);
		/* Only free slots: an honest client never writes an SQE the broker may be reading. */
		if (nsqe > entries - (tail - head0))
			nsqe = entries - (tail - head0);
		for (uint32_t i = 0; i < nsqe && pos < size; i++) {
			struct kvb_sqe sqe = {0};
			size_t k = size - pos < sizeof(sqe) ? size - pos : sizeof(sqe);

			memcpy(&sqe, data + pos, k);
			pos += k;
			if (sqe.opcode == KVB_OP_RELEASE && (sqe.off >> 56) == 0xEE && nleases)
				sqe.off = leases[(sqe.off & 0xff) % nleases];
			memcpy(kvb_ring_slot(&s->sq, tail), &sqe, sizeof(sqe));
			tail++;
		}
		kvb_store_release(s->sq.tail, tail + tail_lie);
		/* The client reaped everything so far, then (perhaps) lies about it. */
		kvb_store_release(s->cq.head, kvb_load_relaxed(s->cq.tail) - cq_back);
		rc = session_poll(&fb->b, s, 64, &told);
		if (rc < 0) {
			/* Only an impossible index may end a session. */
			if (!tail_lie && !cq_back)
				fuzz_fail("an honest ring ended the session");
			alive = 0;
			break;
		}
		head1 = kvb_load_relaxed(s->sq.head);
		cq_tail = kvb_load_relaxed(s->cq.tail);
		if (head1 - head0 != (uint32_t)rc || cq_tail - cq_tail_seen != (uint32_t)rc)
			fuzz_fail("SQEs consumed != CQEs posted");
		if (told > (uint32_t)rc)
			fuzz_fail("more told ops than SQEs");
		for (uint32_t i = 0; i < (uint32_t)rc; i++) {
			const struct kvb_sqe *sqe = kvb_ring_slot(&s->sq, head0 + i);
			const struct kvb_cqe *cqe = kvb_ring_slot(&s->cq, cq_tail_seen + i);

			if (cqe->user_data != sqe->user_data)
				fuzz_fail("CQE user_data does not match its SQE");
			if (cqe->res < -4095)
				fuzz_fail("CQE res is not an errno");
			if (sqe->opcode == KVB_OP_ACQUIRE && cqe->res == 0 && nleases < MAX_LEASES)
				leases[nleases++] = cqe->lease;
		}
		cq_tail_seen = cq_tail;
		/* After a lie the broker may have consumed past our tail: follow its head. */
		if (tail - head1 > entries)
			tail = head1;
	}
	fuzz_session_end(fb, s, alive);
	return 0;
}
