// SPDX-License-Identifier: MIT
/*
 * peer_memc.c - kvbbench-peers' memcached modes: SET and GET of the same pages through
 * libmemcached, what an engine would do with memcached as its shared KV store.
 *
 * One memcached_st per thread (TCP with TCP_NODELAY, or a unix socket, --server), the default
 * text protocol or, with --proto binary, the binary one. (Measured on the development machines:
 * a text-protocol SET of a 64 KiB value stalls ~40 ms in most round trips, the binary one does
 * not; so the benchmark SETs with the binary protocol and GETs with the default.) Keys "kvbb:<page bytes>:<index>"; the working set is SET from the parent
 * before a GET run (the server needs -I above the largest page and -m above the working sets).
 * GET copies the value libmemcached returns (malloc'd by it) into a destination ring as large
 * as the working set and frees it, so the work matches kvb_get into a buffer; SET overwrites
 * pages of the working set, each with its key in its first 32 bytes.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libmemcached/memcached.h>

#include "kvbbench.h"

static memcached_st *mconnect(const char *server, int binary, char *err, size_t errlen)
{
	char host[256];
	const char *colon;
	memcached_return_t rc;
	memcached_st *m;

	if (!server) {
		snprintf(err, errlen, "memc modes need --server HOST:PORT or --server /path");
		return NULL;
	}
	m = memcached_create(NULL);
	if (!m) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (server[0] == '/') {
		rc = memcached_server_add_unix_socket(m, server);
	} else {
		colon = strrchr(server, ':');
		if (!colon || (size_t)(colon - server) >= sizeof(host)) {
			snprintf(err, errlen, "--server: HOST:PORT or /path/to/socket");
			memcached_free(m);
			return NULL;
		}
		memcpy(host, server, (size_t)(colon - server));
		host[colon - server] = 0;
		rc = memcached_server_add(m, host, (in_port_t)atoi(colon + 1));
		if (rc == MEMCACHED_SUCCESS)
			rc = memcached_behavior_set(m, MEMCACHED_BEHAVIOR_TCP_NODELAY, 1);
	}
	if (rc == MEMCACHED_SUCCESS && binary)
		rc = memcached_behavior_set(m, MEMCACHED_BEHAVIOR_BINARY_PROTOCOL, 1);
	if (rc != MEMCACHED_SUCCESS) {
		snprintf(err, errlen, "memcached at %s: %s", server, memcached_strerror(m, rc));
		memcached_free(m);
		return NULL;
	}
	return m;
}

static int prep_get(struct kvbb_cfg *cfg, char *err, size_t errlen)
{
	memcached_st *m = mconnect(cfg->server, cfg->binary, err, errlen);
	uint8_t *page = malloc(cfg->page_bytes);
	memcached_return_t mr = MEMCACHED_SUCCESS;
	char key[64];
	uint64_t i;

	if (!m || !page) {
		free(page);
		if (m)
			memcached_free(m);
		return -EIO;
	}
	for (i = 0; i < cfg->pages && mr == MEMCACHED_SUCCESS; i++) {
		kvb_key k = kvbb_key(cfg->ws_seed, 0, i);
		int kl = kvbb_text_key(key, sizeof(key), cfg->page_bytes, i);

		kvbb_fill_page(page, cfg->page_bytes, &k);
		mr = memcached_set(m, key, (size_t)kl, (const char *)page, cfg->page_bytes, 0, 0);
		if (mr != MEMCACHED_SUCCESS)
			snprintf(err, errlen, "populate: set %s: %s (is -I large enough?)", key,
				 memcached_strerror(m, mr));
	}
	free(page);
	memcached_free(m);
	return mr == MEMCACHED_SUCCESS ? 0 : -EIO;
}

static int prep_set(struct kvbb_cfg *cfg, char *err, size_t errlen)
{
	memcached_st *m = mconnect(cfg->server, cfg->binary, err, errlen);

	if (!m)
		return -EIO;
	memcached_free(m);
	return 0;
}

static int setup(struct kvbb_w *w, char *err, size_t errlen)
{
	w->peer = mconnect(w->cfg->server, w->cfg->binary, err, errlen);
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
		memcached_free(w->peer);
	free(w->buf);
}

static int64_t op_get(struct kvbb_w *w, uint64_t i)
{
	const struct kvbb_cfg *cfg = w->cfg;
	uint64_t p = kvbb_pick(w, i);
	uint8_t *slot = w->buf + (i % w->slots) * cfg->page_bytes;
	char key[64];
	int kl = kvbb_text_key(key, sizeof(key), cfg->page_bytes, p);
	memcached_return_t mr;
	uint32_t flags;
	size_t len = 0;
	char *v = memcached_get(w->peer, key, (size_t)kl, &len, &flags, &mr);
	int64_t rc = (int64_t)cfg->page_bytes;

	w->kind = K_GET;
	if (!v) {
		if (mr != MEMCACHED_NOTFOUND)
			return -EIO;
		w->s->misses++;
		return cfg->miss_ok || cfg->miss_fill ? 0 : -ENOENT;
	}
	if (len != cfg->page_bytes) {
		rc = -EPROTO;
	} else {
		memcpy(slot, v, len);
		if (w->verify) {
			kvb_key k = kvbb_key(cfg->ws_seed, 0, p);

			if (kvbb_check_page(slot, len, &k))
				rc = -EBADMSG;
		}
	}
	free(v);
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
	if (memcached_set(w->peer, key, (size_t)kl, (const char *)slot, cfg->page_bytes, 0, 0) !=
	    MEMCACHED_SUCCESS)
		return -EIO;
	return (int64_t)cfg->page_bytes;
}

const struct kvbb_mode kvbb_memc_modes[] = {
	{"memc-get", "memcached GET of a page (libmemcached) copied into a destination buffer",
	 MF_DATA, prep_get, setup, op_get, teardown, NULL, 0},
	{"memc-set", "memcached SET of a page (libmemcached), overwriting the working set", MF_DATA,
	 prep_set, setup, op_set, teardown, NULL, 0},
	{NULL, NULL, 0, NULL, NULL, NULL, NULL, NULL, 0},
};
