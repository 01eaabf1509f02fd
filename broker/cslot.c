// SPDX-License-Identifier: MIT
/*
 * cslot.c - Redis Cluster slot routing: key -> slot, redirection parsing, the CLUSTER SLOTS
 * reply (cslot.h). Everything a node sends is untrusted: lengths and ranges are checked, never
 * assumed. Pure functions, any thread.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <string.h>

#include "cslot.h"

uint16_t cslot_crc16(const void *p, size_t len)
{
	const uint8_t *b = p;
	uint16_t crc = 0;

	/* Bitwise: keys are ~140 bytes and a lookup is a network round trip, so no table. */
	for (size_t i = 0; i < len; i++) {
		crc ^= (uint16_t)(b[i] << 8);
		for (int k = 0; k < 8; k++)
			crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
	}
	return crc;
}

uint16_t cslot_of(const void *key, size_t len)
{
	const char *k = key, *open = memchr(k, '{', len), *close;

	if (open) {
		size_t rest = len - (size_t)(open - k) - 1;

		close = memchr(open + 1, '}', rest);
		if (close && close > open + 1)
			return cslot_crc16(open + 1, (size_t)(close - open - 1)) &
			       (CSLOT_COUNT - 1);
	}
	return cslot_crc16(k, len) & (CSLOT_COUNT - 1);
}

/* Decimal digits of s[0, len) into *v, at most max; -EINVAL on anything else. */
static int parse_dec(const char *s, size_t len, unsigned long max, unsigned long *v)
{
	unsigned long x = 0;

	if (!len || len > 10)
		return -EINVAL;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		x = x * 10 + (unsigned long)(s[i] - '0');
	}
	if (x > max)
		return -EINVAL;
	*v = x;
	return 0;
}

int cslot_parse_redirect(const char *s, size_t len, struct cslot_redirect *r)
{
	const char *sp, *colon = NULL, *end = s + len;
	unsigned long slot, port;
	size_t skip;

	if (len > 4 && !memcmp(s, "ASK ", 4)) {
		r->ask = 1;
		skip = 4;
	} else if (len > 6 && !memcmp(s, "MOVED ", 6)) {
		r->ask = 0;
		skip = 6;
	} else {
		return -ENOENT;
	}
	s += skip;
	sp = memchr(s, ' ', (size_t)(end - s));
	if (!sp || parse_dec(s, (size_t)(sp - s), CSLOT_COUNT - 1, &slot))
		return -EINVAL;
	for (const char *c = sp + 1; c < end; c++)
		if (*c == ':')
			colon = c;
	if (!colon || parse_dec(colon + 1, (size_t)(end - colon - 1), 65535, &port) || !port ||
	    (size_t)(colon - sp - 1) >= sizeof(r->host))
		return -EINVAL;
	memcpy(r->host, sp + 1, (size_t)(colon - sp - 1));
	r->host[colon - sp - 1] = 0;
	r->slot = (uint16_t)slot;
	r->port = (uint16_t)port;
	return 0;
}

int cslot_walk_slots(const void *reply,
		     void (*fn)(void *arg, uint16_t first, uint16_t last, const char *host,
				uint16_t port),
		     void *arg)
{
	const redisReply *r = reply;
	char host[CSLOT_HOST_MAX];
	int n = 0;

	if (!r || r->type != REDIS_REPLY_ARRAY)
		return -EPROTO;
	for (size_t i = 0; i < r->elements; i++) {
		const redisReply *e = r->element[i], *m;

		/* [first, last, [host, port, id, ...], replicas...] */
		if (!e || e->type != REDIS_REPLY_ARRAY || e->elements < 3)
			return -EPROTO;
		m = e->element[2];
		if (e->element[0]->type != REDIS_REPLY_INTEGER ||
		    e->element[1]->type != REDIS_REPLY_INTEGER || m->type != REDIS_REPLY_ARRAY ||
		    m->elements < 2 || m->element[0]->type != REDIS_REPLY_STRING ||
		    m->element[1]->type != REDIS_REPLY_INTEGER)
			return -EPROTO;
		if (e->element[0]->integer < 0 ||
		    e->element[1]->integer >= (long long)CSLOT_COUNT ||
		    e->element[0]->integer > e->element[1]->integer ||
		    m->element[1]->integer <= 0 || m->element[1]->integer > 65535 ||
		    m->element[0]->len >= sizeof(host))
			return -EPROTO;
		memcpy(host, m->element[0]->str, m->element[0]->len);
		host[m->element[0]->len] = 0;
		fn(arg, (uint16_t)e->element[0]->integer, (uint16_t)e->element[1]->integer, host,
		   (uint16_t)m->element[1]->integer);
		n++;
	}
	return n;
}
