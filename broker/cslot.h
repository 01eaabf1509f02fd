/* SPDX-License-Identifier: MIT */
/*
 * cslot.h - Redis Cluster slot routing, the part no Debian library gives hiredis 0.14: the key's
 * slot (CRC16/XMODEM of the key, or of its {hash tag}, mod 16384), MOVED/ASK redirections and the
 * CLUSTER SLOTS reply. Pure functions over bytes and hiredis reply objects; no I/O, no state.
 */
#ifndef KVB_BROKER_CSLOT_H
#define KVB_BROKER_CSLOT_H

#include <stddef.h>
#include <stdint.h>

#define CSLOT_COUNT 16384u
#define CSLOT_HOST_MAX 64

/* CRC16/XMODEM (poly 0x1021, init 0), as Redis's crc16.c: "123456789" -> 0x31c3. */
uint16_t cslot_crc16(const void *p, size_t len);

/*
 * The slot of a key as every Redis Cluster node computes it: the CRC16 of the bytes between the
 * first '{' and the next '}' when that is not empty, else of the whole key, mod 16384. Our keys
 * carry no braces, so pages spread over every shard; the tag rule is here to agree with servers.
 */
uint16_t cslot_of(const void *key, size_t len);

/* A redirection: "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>". */
struct cslot_redirect {
	int ask; /* 1: ASK (this once, after ASKING), 0: MOVED (the slot moved for good) */
	uint16_t slot;
	uint16_t port;
	char host
		[CSLOT_HOST_MAX]; /* "" when the server sent no endpoint (":port"): the same host */
};

/*
 * Parses an error reply's text (len bytes, not NUL-terminated). 0 and *r filled, -ENOENT when
 * it is not a redirection (another error), -EINVAL when it is one but malformed (slot out of
 * range, no port, port out of range, host too long). IPv6 hosts: the port follows the last ':'.
 */
int cslot_parse_redirect(const char *s, size_t len, struct cslot_redirect *r);

/*
 * Walks a CLUSTER SLOTS reply (a struct redisReply *, given as void * so that this header
 * needs no hiredis): fn(arg, first, last, host, port) once per slot range with its master
 * (replicas are ignored: the tier runs without them). An empty host is passed as "". Returns
 * the ranges walked, or -EPROTO when the reply is not shaped as CLUSTER SLOTS answers (fn may
 * have been called for the ranges before the bad one).
 */
int cslot_walk_slots(const void *reply,
		     void (*fn)(void *arg, uint16_t first, uint16_t last, const char *host,
				uint16_t port),
		     void *arg);

#endif /* KVB_BROKER_CSLOT_H */
