// SPDX-License-Identifier: MIT
/*
 * peer_redis.c - kvbbench-peers' Redis modes: SET and GET of the same pages through hiredis,
 * what an engine would do with Redis as its shared KV store.
 *
 * One synchronous connection per thread (TCP or unix socket, --server). Values are the pages,
 * keys "kvbb:<page bytes>:<index>"; the working set is SET from the parent before a GET run.
 * GET copies the reply into a destination ring as large as the working set (the reply buffer
 * is hiredis's; an engine needs the page in its own memory), so the work matches kvb_get into
 * a buffer. SET overwrites pages of the working set (Redis has no eviction configured here, so
 * new keys would only grow its memory); each carries its key in its first 32 bytes, so a later
 * GET run still verifies.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis.h>

#include "kvbbench.h"

static redisContext *rconnect(const char *server, char *err, size_t errlen)
{
	char host[256];
	const char *colon;
	redisContext *c;

	if (!server) {
		snprintf(err, errlen, "redis modes need --server HOST:PORT or --server /path");
		return NULL;
	}
	if (server[0] == '/') {
		c = redisConnectUnix(server);
	} else {
		colon = strrchr(server, ':');
		if (!colon || (size_t)(colon - server) >= sizeof(host)) {
			snprintf(err, errlen, "--server: HOST:PORT or /path/to/socket");
			return NULL;
		}
		memcpy(host, server, (size_t)(colon - server));
		host[colon - server] = 0;
		c = redisConnect(host, atoi(colon + 1));
	}
	if (!c || c->err) {
		snprintf(err, errlen, "redis at %s: %s", server, c ? c->errstr : "out of memory");
		if (c)
			redisFree(c);
		return NULL;
	}
	return c;
}

static int rset(redisContext *c, const char *key, int klen, const void *v, size_t len)
{
	redisReply *r = redisCommand(c, "SET %b %b", key, (size_t)klen, v, len);
	int rc = r && r->type == REDIS_REPLY_STATUS ? 0 : -EIO;

	if (r)
		freeReplyObject(r);
	return rc;
}

static int prep_get(struct kvbb_cfg *cfg, char *err, size_t errlen)
{
	redisContext *c = rconnect(cfg->server, err, errlen);
	uint8_t *page = malloc(cfg->page_bytes);
	char key[64];
	uint64_t i;
	int rc = 0;

	if (!c || !page) {
		free(page);
		if (c)
			redisFree(c);
		return -EIO;
	}
	for (i = 0; i < cfg->pages && !rc; i++) {
		kvb_key k = kvbb_key(cfg->ws_seed, 0, i);
		int kl = kvbb_text_key(key, sizeof(key), cfg->page_bytes, i);

		kvbb_fill_page(page, cfg->page_bytes, &k);
		rc = rset(c, key, kl, page, cfg->page_bytes);
		if (rc)
			snprintf(err, errlen, "populate: SET %s: %s", key,
				 c->err ? c->errstr : "error reply");
	}
	free(page);
	redisFree(c);
	return rc;
}

static int prep_set(struct kvbb_cfg *cfg, char *err, size_t errlen)
{
	redisContext *c = rconnect(cfg->server, err, errlen);

	if (!c)
		return -EIO;
	redisFree(c);
	return 0;
}

static int setup(struct kvbb_w *w, char *err, size_t errlen)
{
	w->peer = rconnect(w->cfg->server, err, errlen);
	if (!w->peer)
		return -EIO;
	w->buf = kvbb_alloc_touched(w->slots * w->cfg->page_bytes);
	if (!w->buf) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	return 0;
}

static void teardown(struct kvbb_w *w)
{
	if (w->peer)
		redisFree(w->peer);
	free(w->buf);
}

static int64_t op_get(struct kvbb_w *w, uint64_t i)
{
	const struct kvbb_cfg *cfg = w->cfg;
	uint64_t p = kvbb_pick(w, i);
	uint8_t *slot = w->buf + (i % w->slots) * cfg->page_bytes;
	char key[64];
	int kl = kvbb_text_key(key, sizeof(key), cfg->page_bytes, p);
	redisReply *r = redisCommand(w->peer, "GET %b", key, (size_t)kl);
	int64_t rc = (int64_t)cfg->page_bytes;

	w->kind = K_GET;
	if (!r)
		return -ECONNRESET;
	if (r->type == REDIS_REPLY_NIL) {
		rc = cfg->miss_ok || cfg->miss_fill ? 0 : -ENOENT;
		w->s->misses++;
	} else if (r->type != REDIS_REPLY_STRING || (size_t)r->len != cfg->page_bytes) {
		rc = -EPROTO;
	} else {
		memcpy(slot, r->str, cfg->page_bytes);
		if (w->verify) {
			kvb_key k = kvbb_key(cfg->ws_seed, 0, p);

			if (kvbb_check_page(slot, cfg->page_bytes, &k))
				rc = -EBADMSG;
		}
	}
	freeReplyObject(r);
	return rc;
}

static int64_t op_set(struct kvbb_w *w, uint64_t i)
{
	const struct kvbb_cfg *cfg = w->cfg;
	uint64_t p = kvbb_pick(w, i);
	uint8_t *slot = w->buf + (i % w->slots) * cfg->page_bytes;
	kvb_key k = kvbb_key(cfg->ws_seed, 0, p);
	char key[64];
	int kl = kvbb_text_key(key, sizeof(key), cfg->page_bytes, p);

	w->kind = K_PUT;
	memcpy(slot, k.b, sizeof(k.b));
	if (rset(w->peer, key, kl, slot, cfg->page_bytes))
		return -EIO;
	return (int64_t)cfg->page_bytes;
}

const struct kvbb_mode kvbb_redis_modes[] = {
	{"redis-get", "Redis GET of a page (hiredis) copied into a destination buffer", MF_DATA,
	 prep_get, setup, op_get, teardown, NULL, 0},
	{"redis-set", "Redis SET of a page (hiredis), overwriting the working set", MF_DATA,
	 prep_set, setup, op_set, teardown, NULL, 0},
	{NULL, NULL, 0, NULL, NULL, NULL, NULL, NULL, 0},
};
