// SPDX-License-Identifier: MIT
/*
 * test_cslot.c - Redis Cluster slot routing: the CRC16 test vector and known slots (as
 * CLUSTER KEYSLOT answers them), hash tags, MOVED/ASK parsing with hostile inputs, and the
 * CLUSTER SLOTS walk over well-formed and malformed replies.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "cslot.h"

static void test_cslot_crc16_vector(void **state)
{
	(void)state;
	assert_int_equal(cslot_crc16("123456789", 9), 0x31c3);
	assert_int_equal(cslot_crc16("", 0), 0);
}

static void test_cslot_known_slots(void **state)
{
	(void)state;
	/* redis-cli CLUSTER KEYSLOT of each. */
	assert_int_equal(cslot_of("foo", 3), 12182);
	assert_int_equal(cslot_of("bar", 3), 5061);
	assert_int_equal(cslot_of("hello", 5), 866);
}

static void test_cslot_hash_tags(void **state)
{
	(void)state;
	assert_int_equal(cslot_of("{user1000}.following", 20), cslot_of("user1000", 8));
	assert_int_equal(cslot_of("foo{}{bar}", 10), cslot_of("foo{}{bar}", 10));
	/* An empty tag hashes the whole key; an unclosed one too. */
	assert_int_equal(cslot_of("foo{}{bar}", 10), cslot_crc16("foo{}{bar}", 10) & 16383);
	assert_int_equal(cslot_of("foo{bar", 7), cslot_crc16("foo{bar", 7) & 16383);
	assert_int_equal(cslot_of("foo{{bar}}zap", 13), cslot_of("{bar", 4));
}

static int redir(const char *s, struct cslot_redirect *r)
{
	return cslot_parse_redirect(s, strlen(s), r);
}

static void test_cslot_redirect_parse(void **state)
{
	struct cslot_redirect r;

	(void)state;
	assert_int_equal(redir("MOVED 3999 127.0.0.1:6381", &r), 0);
	assert_int_equal(r.ask, 0);
	assert_int_equal(r.slot, 3999);
	assert_int_equal(r.port, 6381);
	assert_string_equal(r.host, "127.0.0.1");
	assert_int_equal(redir("ASK 16383 10.0.0.2:7000", &r), 0);
	assert_int_equal(r.ask, 1);
	assert_int_equal(r.slot, 16383);
	assert_string_equal(r.host, "10.0.0.2");
	assert_int_equal(redir("MOVED 1 ::1:6379", &r), 0);
	assert_string_equal(r.host, "::1");
	assert_int_equal(r.port, 6379);
	assert_int_equal(redir("MOVED 7 :6379", &r), 0); /* no endpoint: the same host */
	assert_string_equal(r.host, "");
}

static void test_cslot_redirect_hostile(void **state)
{
	static const char *bad[] = {
		"MOVED 16384 127.0.0.1:1",
		"MOVED -1 h:1",
		"MOVED 12 h",
		"MOVED 12 h:",
		"MOVED 12 h:0",
		"MOVED 12 h:65536",
		"MOVED x h:1",
		"ASK 1 h:1x",
		"MOVED  h:1",
		"MOVED 99999999999 h:1",
	};
	char longhost[200];
	struct cslot_redirect r;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(redir(bad[i], &r), -EINVAL);
	assert_int_equal(redir("ERR wrong number of arguments", &r), -ENOENT);
	assert_int_equal(redir("MOVED", &r), -ENOENT);
	assert_int_equal(redir("CLUSTERDOWN Hash slot not served", &r), -ENOENT);
	memset(longhost, 'a', sizeof(longhost));
	memcpy(longhost, "MOVED 1 ", 8);
	memcpy(longhost + sizeof(longhost) - 6, ":6379", 6);
	assert_int_equal(redir(longhost, &r), -EINVAL);
	/* Not NUL-terminated: the length is what counts. */
	assert_int_equal(cslot_parse_redirect("MOVED 5 h:12345678", 12, &r), 0);
	assert_int_equal(r.port, 12);
}

/* ---- CLUSTER SLOTS replies built by hand ---- */

static redisReply *rep(int type)
{
	redisReply *r = calloc(1, sizeof(*r));

	r->type = type;
	return r;
}

static redisReply *rnum(long long v)
{
	redisReply *r = rep(REDIS_REPLY_INTEGER);

	r->integer = v;
	return r;
}

static redisReply *rstr(const char *s)
{
	redisReply *r = rep(REDIS_REPLY_STRING);

	r->str = strdup(s);
	r->len = strlen(s);
	return r;
}

static redisReply *rarr(size_t n, ...)
{
	redisReply *r = rep(REDIS_REPLY_ARRAY);
	va_list ap;

	r->elements = n;
	r->element = calloc(n, sizeof(*r->element));
	va_start(ap, n);
	for (size_t i = 0; i < n; i++)
		r->element[i] = va_arg(ap, redisReply *);
	va_end(ap);
	return r;
}

struct seen {
	int n;
	uint16_t first[8], last[8], port[8];
	char host[8][CSLOT_HOST_MAX];
};

static void on_range(void *arg, uint16_t first, uint16_t last, const char *host, uint16_t port)
{
	struct seen *s = arg;

	s->first[s->n] = first;
	s->last[s->n] = last;
	s->port[s->n] = port;
	strcpy(s->host[s->n], host);
	s->n++;
}

static void test_cslot_walk_slots(void **state)
{
	struct seen s = {0};
	redisReply *r = rarr(
		2,
		rarr(3, rnum(0), rnum(8191), rarr(3, rstr("127.0.0.1"), rnum(7000), rstr("id0"))),
		rarr(4, rnum(8192), rnum(16383), rarr(2, rstr("10.1.1.1"), rnum(7001)),
		     rarr(2, rstr("10.1.1.2"), rnum(7002))));

	(void)state;
	assert_int_equal(cslot_walk_slots(r, on_range, &s), 2);
	assert_int_equal(s.n, 2);
	assert_int_equal(s.first[0], 0);
	assert_int_equal(s.last[0], 8191);
	assert_string_equal(s.host[0], "127.0.0.1");
	assert_int_equal(s.port[0], 7000);
	assert_int_equal(s.first[1], 8192);
	assert_int_equal(s.last[1], 16383);
	assert_string_equal(s.host[1], "10.1.1.1"); /* the master, not its replica */
	assert_int_equal(s.port[1], 7001);
	freeReplyObject(r);
}

static void test_cslot_walk_malformed(void **state)
{
	struct seen s = {0};
	redisReply *bad[] = {
		rstr("ERR This instance has cluster support disabled"),
		rarr(1, rarr(2, rnum(0), rnum(5))),
		rarr(1, rarr(3, rnum(0), rnum(16384), rarr(2, rstr("h"), rnum(1)))),
		rarr(1, rarr(3, rnum(9), rnum(5), rarr(2, rstr("h"), rnum(1)))),
		rarr(1, rarr(3, rnum(0), rnum(5), rarr(2, rstr("h"), rnum(0)))),
		rarr(1, rarr(3, rnum(0), rnum(5), rarr(2, rnum(3), rnum(1)))),
		rarr(1, rarr(3, rstr("0"), rnum(5), rarr(2, rstr("h"), rnum(1)))),
		rarr(1, rnum(4)),
	};

	(void)state;
	assert_int_equal(cslot_walk_slots(NULL, on_range, &s), -EPROTO);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(cslot_walk_slots(bad[i], on_range, &s), -EPROTO);
		freeReplyObject(bad[i]);
	}
	assert_int_equal(s.n, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cslot_crc16_vector),
		cmocka_unit_test(test_cslot_known_slots),
		cmocka_unit_test(test_cslot_hash_tags),
		cmocka_unit_test(test_cslot_redirect_parse),
		cmocka_unit_test(test_cslot_redirect_hostile),
		cmocka_unit_test(test_cslot_walk_slots),
		cmocka_unit_test(test_cslot_walk_malformed),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
