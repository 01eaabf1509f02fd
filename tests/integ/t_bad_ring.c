// SPDX-License-Identifier: MIT
/*
 * t_bad_ring.c - a client can hurt only itself (rule 1, docs/design.md). A raw client speaking the
 * wire protocol by hand sends what libkvbroker never would:
 *   - malformed SQEs (unknown opcode, reserved bits, bad LOOKUP bounds, forged lease): each gets
 *     its own CQE with -EINVAL and the client stays connected;
 *   - an unknown namespace or buffer: -EBADF; a buffer range outside the registered buffer,
 *     including offsets that overflow: -EFAULT; nothing is stored by a refused PUT;
 *   - random bytes in every SQE slot: one error CQE each, still connected;
 *   - an impossible SQ tail, then (another client) an impossible CQ head: disconnected;
 *   - [notes] in the note ring: directory reads are counted at the next STATS; other SQEs and
 *     random bytes are protocol errors and the client stays; an impossible tail disconnects;
 *   - a HELLO with another ABI major: refused with -EPROTO and the socket closed;
 *   - garbage datagrams on the control socket: that connection closed.
 * Meanwhile an honest client of the same namespace keeps working byte-exact, before, between
 * and after, and the broker exits cleanly at the end.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "proto.h"

#define SEED 9
#define NHONEST 16
#define BUFLEN (64 * 1024)

static struct harness_broker *b;
static kvb_client *honest;
static uint32_t ns;
static size_t pb;
static int nhonest; /* pages the honest client has stored so far */

static void layout(struct kvb_layout *l)
{
	harness_layout(l, "test/bad-ring", KVB_LAYOUT_MLA, 16, 1, 0, 2, 512); /* 16 KiB */
}

/* The honest client stores four more pages and reads back every page it ever stored. */
static void honest_round(const char *when)
{
	uint8_t *page = malloc(pb);
	char what[64];

	CHECK(page != NULL);
	for (int i = 0; i < 4; i++, nhonest++) {
		kvb_key k = harness_key(SEED, (uint64_t)nhonest);

		harness_fill(page, pb, &k, SEED);
		CHECK_RC(kvb_put(honest, ns, k, page, pb), 0);
	}
	for (int i = 0; i < nhonest; i++) {
		kvb_key k = harness_key(SEED, (uint64_t)i);

		snprintf(what, sizeof(what), "honest page %d %s", i, when);
		memset(page, 0, pb);
		CHECK_RC(kvb_get(honest, ns, k, page, pb), (long long)pb);
		CHECK(harness_verify(page, pb, &k, SEED, what) == 0);
	}
	CHECK_OK(kvb_nop(honest));
	free(page);
}

struct expect {
	struct kvb_sqe sqe;
	int res;
	const char *what;
};

static void sqe_page(struct kvb_sqe *s, uint8_t op, uint32_t ns_, const kvb_key *k, uint32_t buf,
		     uint64_t off)
{
	memset(s, 0, sizeof(*s));
	s->opcode = op;
	s->ns = ns_;
	if (k)
		memcpy(s->key, k->b, sizeof(s->key));
	s->buf = buf;
	s->off = off;
}

/* Submits every case (in as many rounds as the SQ needs) and checks each CQE by user_data. */
static void run_cases(struct harness_raw *r, struct expect *e, int n)
{
	struct kvb_cqe cqe[64];
	int sent = 0, got = 0, seen[64] = {0};

	CHECK(n <= 64);
	for (int i = 0; i < n; i++)
		e[i].sqe.user_data = 0xbad0000000000000ull + (uint64_t)i;
	while (got < n) {
		if (sent < n) {
			struct kvb_sqe batch[64];
			int m = 0, rc;

			while (sent + m < n && m < 64) {
				batch[m] = e[sent + m].sqe;
				m++;
			}
			rc = harness_raw_submit(r, batch, (uint32_t)m);
			CHECKF(rc >= 0, "raw submit: %d", rc);
			sent += rc;
		}
		{
			int rc = harness_raw_reap(r, &cqe[got], (uint32_t)(n - got), 1, 2000);

			CHECKF(rc > 0, "no CQE within 2 s (%d of %d completed, %d sent): %d", got,
			       n, sent, rc);
			got += rc;
		}
	}
	for (int j = 0; j < got; j++) {
		uint64_t i = cqe[j].user_data - 0xbad0000000000000ull;

		CHECKF(i < (uint64_t)n, "CQE with unknown user_data 0x%llx",
		       (unsigned long long)cqe[j].user_data);
		CHECKF(!seen[i], "two CQEs for case %llu", (unsigned long long)i);
		seen[i] = 1;
		if (e[i].res == 1) /* any error will do: random bytes */
			CHECKF(cqe[j].res < 0, "%s: res %d, want an error", e[i].what, cqe[j].res);
		else
			CHECKF(cqe[j].res == e[i].res, "%s: res %d (%s), want %d (%s)", e[i].what,
			       cqe[j].res, harness_strerror(cqe[j].res), e[i].res,
			       harness_strerror(e[i].res));
	}
}

static void bad_sqes(void)
{
	struct harness_raw r;
	struct kvb_layout l;
	struct expect e[40];
	uint32_t rns, buf;
	uint64_t rpb;
	uint8_t *map, *arg;
	kvb_key fresh = harness_key(SEED + 1, 0), unknown = harness_key(SEED + 1, 99);
	kvb_key stored = harness_key(SEED, 0), stored1 = harness_key(SEED, 1);
	size_t hits;
	int n = 0;

	CHECK_OK(harness_raw_hello(&r, b->sock, KVB_ABI_MAJOR, 8));
	layout(&l);
	CHECK_OK(harness_raw_ns_open(&r, &l, &rns, &rpb));
	CHECK_EQ(rns, ns);
	CHECK_EQ(rpb, pb);
	CHECK_OK(harness_raw_buf_reg(&r, BUFLEN, &buf, (void **)&map));
	harness_fill(map, pb, &fresh, SEED);

#define CASE(res_, what_)                                                                          \
	do {                                                                                       \
		e[n].res = (res_);                                                                 \
		e[n].what = (what_);                                                               \
		n++;                                                                               \
	} while (0)

	memset(&e, 0, sizeof(e));
	e[n].sqe.opcode = 200;
	CASE(-EINVAL, "unknown opcode 200");
	e[n].sqe.opcode = KVB_OP__COUNT;
	CASE(-EINVAL, "unknown opcode KVB_OP__COUNT");
	e[n].sqe.opcode = KVB_OP_NOP;
	e[n].sqe.resv0 = 1;
	CASE(-EINVAL, "NOP with resv0");
	e[n].sqe.opcode = KVB_OP_NOP;
	e[n].sqe.flags = 0x80;
	CASE(-EINVAL, "NOP with an unknown flag");
	sqe_page(&e[n].sqe, KVB_OP_GET, ns, &stored, buf, 0);
	e[n].sqe.layer_count = 1;
	CASE(-EINVAL, "buffer GET with a layer range");
	sqe_page(&e[n].sqe, KVB_OP_PUT, ns, &fresh, buf, 0);
	e[n].sqe.flags = 0x40;
	CASE(-EINVAL, "PUT with an unknown flag");
	sqe_page(&e[n].sqe, KVB_OP_LOOKUP, ns, NULL, 0, 0);
	e[n].sqe.batch.count = 1u << 27; /* 2^27 keys x 32 B: 4 GiB, wraps to 0 in 32 bits */
	CASE(-EINVAL, "LOOKUP past the argument area");
	sqe_page(&e[n].sqe, KVB_OP_LOOKUP, ns, NULL, 0, 0);
	e[n].sqe.batch.count = 4;
	e[n].sqe.batch.out_off = 64; /* inside the keys */
	CASE(-EINVAL, "LOOKUP tiers over its keys");
	sqe_page(&e[n].sqe, KVB_OP_RELEASE, 0, NULL, 0, 0x123456789ull);
	CASE(-EINVAL, "RELEASE of a forged lease id");

	sqe_page(&e[n].sqe, KVB_OP_PUT, 9999, &fresh, buf, 0);
	CASE(-EBADF, "PUT to an unknown namespace");
	sqe_page(&e[n].sqe, KVB_OP_GET, 9999, &stored, buf, 0);
	CASE(-EBADF, "GET from an unknown namespace");
	sqe_page(&e[n].sqe, KVB_OP_PUT, ns, &fresh, 777, 0);
	CASE(-EBADF, "PUT from an unknown buffer");
	sqe_page(&e[n].sqe, KVB_OP_GET, ns, &stored, 777, 0);
	CASE(-EBADF, "GET into an unknown buffer");
	sqe_page(&e[n].sqe, KVB_OP_PUT, ns, &fresh, buf, BUFLEN - pb + 1);
	CASE(-EFAULT, "PUT one byte past the buffer");
	sqe_page(&e[n].sqe, KVB_OP_PUT, ns, &fresh, buf, UINT64_MAX - 100);
	CASE(-EFAULT, "PUT at an offset that overflows");
	sqe_page(&e[n].sqe, KVB_OP_PUT, ns, &fresh, buf, BUFLEN);
	CASE(-EFAULT, "PUT at the end of the buffer");
	sqe_page(&e[n].sqe, KVB_OP_GET, ns, &stored, buf, BUFLEN - 8);
	CASE(-EFAULT, "GET past the buffer");
	sqe_page(&e[n].sqe, KVB_OP_GET, ns, &stored, buf, 1ull << 63);
	CASE(-EFAULT, "GET at 2^63");

	/* Valid ones in between still work. */
	sqe_page(&e[n].sqe, KVB_OP_NOP, 0, NULL, 0, 0);
	CASE(0, "NOP");
	sqe_page(&e[n].sqe, KVB_OP_GET, ns, &unknown, buf, 0);
	CASE(-ENOENT, "GET of an unknown key");
	run_cases(&r, e, n);

	/* A refused PUT stored nothing. */
	CHECK_OK(kvb_lookup(honest, ns, &fresh, 1, &hits));
	CHECK_EQ(hits, 0);

	/* Valid PUT / GET / LOOKUP through the raw rings. */
	n = 0;
	memset(&e, 0, sizeof(e));
	sqe_page(&e[n].sqe, KVB_OP_PUT, ns, &fresh, buf, 0);
	CASE(0, "PUT from the raw buffer");
	run_cases(&r, e, n);
	n = 0;
	memset(&e, 0, sizeof(e));
	sqe_page(&e[n].sqe, KVB_OP_GET, ns, &fresh, buf, BUFLEN - pb);
	CASE((int)pb, "GET into the raw buffer's end");
	sqe_page(&e[n].sqe, KVB_OP_PUT, ns, &fresh, buf, 0);
	CASE(0, "second PUT (EXISTED, res 0)");
	run_cases(&r, e, n);
	CHECK(harness_verify(map + BUFLEN - pb, pb, &fresh, SEED, "raw GET") == 0);

	arg = (uint8_t *)r.region + r.hdr.arg_off;
	memcpy(arg, &stored, 32);
	memcpy(arg + 32, &stored1, 32);
	memcpy(arg + 64, &unknown, 32);
	memcpy(arg + 96, &fresh, 32);
	memset(arg + 128, 0x55, 4);
	n = 0;
	memset(&e, 0, sizeof(e));
	sqe_page(&e[n].sqe, KVB_OP_LOOKUP, ns, NULL, 0, 0);
	e[n].sqe.batch.count = 4;
	e[n].sqe.batch.out_off = 128;
	CASE(2, "LOOKUP: 2 leading hits");
	run_cases(&r, e, n);
	CHECK_EQ(arg[128], KVB_TIER_RAM);
	CHECK_EQ(arg[129], KVB_TIER_RAM);
	CHECK_EQ(arg[130], KVB_TIER_NONE);
	CHECK_EQ(arg[131], KVB_TIER_RAM);

	/* Random bytes in SQEs (a sane tail): one error CQE each. */
	n = 0;
	memset(&e, 0, sizeof(e));
	{
		uint64_t s = 0x1234;

		for (int i = 0; i < 24; i++) {
			for (size_t j = 0; j < sizeof(e[n].sqe); j++) {
				s = s * 6364136223846793005ull + 1442695040888963407ull;
				((uint8_t *)&e[n].sqe)[j] = (uint8_t)(s >> 56);
			}
			e[n].sqe.resv0 |= 1; /* never a valid op by accident */
			CASE(1, "random SQE");
		}
	}
	run_cases(&r, e, n);
	CHECK_EQ(harness_raw_hung_up(&r, 100), 0);
	honest_round("after malformed SQEs");

	/* An impossible SQ tail: the broker must end this session, and only it. */
	{
		uint32_t head = kvb_load_acquire(harness_raw_word(&r, r.hdr.sq_head_off));

		kvb_store_release(harness_raw_word(&r, r.hdr.sq_tail_off),
				  head + r.hdr.sq_entries + 5);
		harness_raw_doorbell(&r);
		CHECKF(harness_raw_hung_up(&r, 2000),
		       "still connected 2 s after an SQ tail %u "
		       "ahead of head %u",
		       r.hdr.sq_entries + 5, head);
	}
	harness_raw_close(&r);
}

static void bad_cq_head(void)
{
	struct harness_raw r;
	struct kvb_sqe nop = {.opcode = KVB_OP_NOP, .user_data = 1};
	struct kvb_cqe cqe;

	CHECK_OK(harness_raw_hello(&r, b->sock, KVB_ABI_MAJOR, 8));
	CHECK_EQ(harness_raw_submit(&r, &nop, 1), 1);
	CHECK_EQ(harness_raw_reap(&r, &cqe, 1, 1, 2000), 1);
	CHECK_EQ(cqe.res, 0);
	/* Claim to have consumed 1000 CQEs that were never posted. */
	kvb_store_release(harness_raw_word(&r, r.hdr.cq_head_off),
			  kvb_load_acquire(harness_raw_word(&r, r.hdr.cq_tail_off)) + 1000);
	CHECK_EQ(harness_raw_submit(&r, &nop, 1), 1);
	harness_raw_doorbell(&r);
	CHECKF(harness_raw_hung_up(&r, 2000), "still connected 2 s after an impossible CQ head");
	harness_raw_close(&r);
}

/* [notes] What a client may put in its note ring (wire.h KVB_FEAT_NOTES), and what not. */
static void bad_notes(void)
{
	struct harness_raw r;
	struct kvb_layout l;
	struct kvb_sqe *e;
	kvb_atomic_u32 *tail;
	kvb_client *ctl;
	uint64_t gets0, perr0;
	uint32_t rns, t;
	char *json;

	CHECK_OK(harness_raw_hello(&r, b->sock, KVB_ABI_MAJOR, 8));
	CHECK(r.hdr.features & KVB_FEAT_NOTES);
	layout(&l);
	CHECK_OK(harness_raw_ns_open(&r, &l, &rns, NULL));
	e = (struct kvb_sqe *)(void *)((char *)r.region + kvb_region_notes_off(&r.hdr) +
				       KVB_NOTES_SQES);
	tail = (kvb_atomic_u32 *)(void *)((char *)r.region + kvb_region_notes_off(&r.hdr) +
					  KVB_NOTES_TAIL);
	/*
	 * STATS from a control client (no ring: nothing it does wakes the broker's rounds first),
	 * so the count below is the one the broker drains before it answers.
	 */
	{
		struct kvb_opts o = {.socket_path = b->sock,
				     .name = "notes-stats",
				     .flags = KVB_CONNECT_CONTROL};

		ctl = NULL;
		CHECK_OK(kvb_connect(&o, &ctl));
	}
	json = harness_stats(ctl); /* the honest client's own reads are counted by now */
	gets0 = harness_stat_u64(json, "counters.dir_gets");
	perr0 = harness_stat_u64(json, "counters.protocol_errors");
	free(json);

	/*
	 * Three reads told through the ring while the broker sleeps (its poll window long over):
	 * counted when the next STATS is answered, before any tick of the broker's could.
	 */
	usleep(50 * 1000);
	for (t = 0; t < 3; t++) {
		kvb_key k = harness_key(SEED, t);

		memset(&e[t], 0, sizeof(e[t]));
		e[t].opcode = KVB_OP_GET;
		e[t].flags = KVB_SQEF_GET;
		e[t].ns = rns;
		memcpy(e[t].key, k.b, sizeof(e[t].key));
	}
	kvb_store_release(tail, 3);
	json = harness_stats(ctl);
	CHECK_EQ(harness_stat_u64(json, "counters.dir_gets"), gets0 + 3);
	CHECK_EQ(harness_stat_u64(json, "counters.protocol_errors"), perr0);
	free(json);

	/* A PUT, a GET naming a buffer, and random bytes: errors, and the client stays. */
	memset(&e[3], 0, 3 * sizeof(e[3]));
	e[3].opcode = KVB_OP_PUT;
	e[3].ns = rns;
	e[4].opcode = KVB_OP_GET;
	e[4].flags = KVB_SQEF_GET;
	e[4].buf = 1;
	for (size_t j = 0; j < sizeof(e[5]); j++)
		((uint8_t *)&e[5])[j] = (uint8_t)(j * 37 + 11);
	usleep(50 * 1000);
	kvb_store_release(tail, 6);
	json = harness_stats(ctl);
	CHECK_EQ(harness_stat_u64(json, "counters.dir_gets"), gets0 + 3);
	CHECK_EQ(harness_stat_u64(json, "counters.protocol_errors"), perr0 + 3);
	free(json);
	CHECK_EQ(harness_raw_hung_up(&r, 100), 0);
	CHECK_EQ(harness_stat(honest, "pool.pages"), (uint64_t)nhonest + 1); /* no PUT ran */

	/* An impossible tail: the session ends, within the broker's nap and a round. */
	kvb_store_release(tail, 6 + KVB_NOTES_ENTRIES + 1);
	CHECKF(harness_raw_hung_up(&r, 3000), "still connected 3 s after an impossible note tail");
	harness_raw_close(&r);
	kvb_close(ctl);
	CHECKF(harness_broker_log_has(b, "note-ring"),
	       "the broker's log does not say why it ended the note ring's session");
}

static void bad_hello(void)
{
	struct harness_raw r;
	int rc;

	rc = harness_raw_hello(&r, b->sock, KVB_ABI_MAJOR + 1, 8);
	CHECKF(rc == -EPROTO, "HELLO with ABI major %d: %d (%s), want -EPROTO", KVB_ABI_MAJOR + 1,
	       rc, harness_strerror(rc));
	CHECKF(harness_raw_hung_up(&r, 2000), "socket still open after a refused HELLO");
	harness_raw_close(&r);
	rc = harness_raw_hello(&r, b->sock, 0, 8);
	CHECKF(rc == -EPROTO, "HELLO with ABI major 0: %d (%s), want -EPROTO", rc,
	       harness_strerror(rc));
	harness_raw_close(&r);
	/* A bad sq_entries is refused (not a power of two). */
	rc = harness_raw_hello(&r, b->sock, KVB_ABI_MAJOR, 100);
	CHECKF(rc < 0, "HELLO with sq_entries 100 accepted");
	harness_raw_close(&r);

	/* Garbage datagrams instead of a HELLO. */
	{
		static const char junk[] = "GET / HTTP/1.0\r\n\r\n";
		struct kvb_msg_hdr h = {.magic = KVB_MSG_MAGIC, .type = KVB_MSG_HELLO, .len = 1000};
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		const void *msgs[2] = {junk, &h};
		size_t lens[2] = {sizeof(junk), sizeof(h)};

		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", b->sock);
		for (int i = 0; i < 2; i++) {
			memset(&r, 0, sizeof(r));
			r.sq_efd = r.cq_efd = -1;
			r.sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
			CHECK(r.sock >= 0);
			CHECK_EQ(connect(r.sock, (struct sockaddr *)&sa, sizeof(sa)), 0);
			CHECK_OK(harness_raw_send(&r, msgs[i], lens[i]));
			CHECKF(harness_raw_hung_up(&r, 2000),
			       "garbage datagram %d: still connected", i);
			harness_raw_close(&r);
		}
	}
}

int main(int argc, char **argv)
{
	struct kvb_layout l;
	char *json;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M");
	honest = harness_connect(b, "honest", 0);
	layout(&l);
	CHECK_OK(kvb_ns_open(honest, &l, &ns, &pb));
	honest_round("at start");

	harness_log("malformed SQEs, then an impossible SQ tail");
	bad_sqes();
	honest_round("after an impossible SQ tail");
	CHECK_EQ(harness_stat_wait(honest, "clients", 1, 2000), 1);
	json = harness_stats(honest);
	CHECK_GE(harness_stat_u64(json, "counters.protocol_errors"), 1);
	CHECK_GE(harness_stat_u64(json, "counters.disconnects"), 1);
	free(json);
	CHECKF(harness_broker_log_has(b, "impossible"),
	       "the broker's log does not say why it disconnected the client");

	harness_log("an impossible CQ head");
	bad_cq_head();
	honest_round("after an impossible CQ head");

	harness_log("the note ring: reads counted, anything else refused, an impossible tail");
	bad_notes();
	honest_round("after a bad note ring");

	harness_log("wrong ABI and garbage on the control socket");
	bad_hello();
	honest_round("after bad HELLOs");

	CHECK_EQ(harness_stat_wait(honest, "clients", 1, 2000), 1);
	CHECK_EQ(harness_stat(honest, "pool.pages"), (uint64_t)nhonest + 1);
	kvb_close(honest);
	harness_broker_stop(b);
	return H_PASS;
}
