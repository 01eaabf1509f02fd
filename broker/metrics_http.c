// SPDX-License-Identifier: MIT
/*
 * metrics_http.c - GET /metrics over HTTP (--metrics-listen), with libmicrohttpd.
 *
 * Why a thread and a snapshot, not an fd in the loop's epoll: the broker's state belongs to the
 * loop thread alone, and the loop must never wait on a network peer. A scraper that sends its
 * request a byte at a time, or reads the reply slowly, would stall an HTTP parser run on the
 * loop, and the exposition text (tens of KiB with many namespaces and clients) would be built
 * there on every scrape. So libmicrohttpd runs its own thread (MHD_USE_AUTO_INTERNAL_THREAD)
 * that accepts, parses and writes; the loop's only part is metrics_http_tick(): at most once a
 * second it renders the STATS document (stats_json(), the same walk a `kvbctl status` costs)
 * and swaps it in as the snapshot under a mutex, with trylock so the loop never waits either.
 * The HTTP thread copies the snapshot under the same mutex (a strdup) and turns it into the
 * exposition text outside it, with the shared generator of common/metrics.c, so `kvbctl
 * metrics` and this endpoint print the same families. A scrape therefore sees the broker as of
 * at most about two seconds ago (the loop wakes at least once a second); Prometheus scrapes
 * every 15 s or so.
 *
 * Threads: the loop calls start, tick and stop; the HTTP thread runs on_request. Only `snap`
 * (guarded by `lock`) is shared between them.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "broker.h"
#include "metrics.h"
#include "metrics_http.h"

#define PUBLISH_EVERY 1.0 /* seconds between snapshots */

struct metrics_http {
	struct MHD_Daemon *d;
	pthread_mutex_t lock;
	char *snap;	  /* latest STATS JSON, under lock */
	double published; /* loop thread only */
	char addr[INET6_ADDRSTRLEN + 8];
};

static enum MHD_Result respond(struct MHD_Connection *c, unsigned status, const char *type,
			       char *body)
{
	struct MHD_Response *r;
	enum MHD_Result ret;

	if (!body)
		return MHD_NO; /* out of memory: MHD closes the connection */
	r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

/* HTTP thread. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *upload,
				  size_t *upload_size, void **state)
{
	struct metrics_http *m = cls;
	char *json = NULL, *text;

	(void)version;
	(void)upload;
	(void)upload_size;
	(void)state;
	if (strcmp(method, "GET") && strcmp(method, "HEAD"))
		return respond(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain",
			       strdup("only GET /metrics\n"));
	if (strcmp(url, "/metrics"))
		return respond(c, MHD_HTTP_NOT_FOUND, "text/plain",
			       strdup("kvbrokerd: metrics are at /metrics\n"));
	pthread_mutex_lock(&m->lock);
	if (m->snap)
		json = strdup(m->snap);
	pthread_mutex_unlock(&m->lock);
	text = json ? metrics_from_json(json) : NULL;
	free(json);
	if (!text)
		return respond(c, MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain",
			       strdup("kvbrokerd: no statistics snapshot yet\n"));
	return respond(c, MHD_HTTP_OK, METRICS_CONTENT_TYPE, text);
}

/* "HOST:PORT", "[V6]:PORT", ":PORT", "PORT" -> a numeric socket address. */
static int parse_addr(const char *s, struct sockaddr_storage *ss)
{
	struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE};
	struct addrinfo *res;
	char host[INET6_ADDRSTRLEN + 2] = "127.0.0.1";
	const char *colon = strrchr(s, ':'), *port = colon ? colon + 1 : s;
	size_t hl = colon ? (size_t)(colon - s) : 0;
	int err;

	if (hl) {
		if (s[0] == '[' && s[hl - 1] == ']') {
			s++;
			hl -= 2;
		}
		if (hl >= sizeof(host))
			return -EINVAL;
		memcpy(host, s, hl);
		host[hl] = '\0';
	}
	if (!*port || strspn(port, "0123456789") != strlen(port))
		return -EINVAL;
	err = getaddrinfo(host, port, &hints, &res);
	if (err)
		return -EINVAL;
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	freeaddrinfo(res);
	return 0;
}

int metrics_http_start(const char *addr, struct metrics_http **out)
{
	struct sockaddr_storage ss = {0};
	struct metrics_http *m;
	const union MHD_DaemonInfo *info;
	char host[INET6_ADDRSTRLEN];
	int v6, err = parse_addr(addr, &ss);

	if (err)
		return err;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	pthread_mutex_init(&m->lock, NULL);
	v6 = ss.ss_family == AF_INET6;
	errno = 0; /* MHD leaves the bind's errno on failure; nothing stale */
	/*
	 * AUTO picks epoll on Linux: with many clients attached the broker's fds run past 1024,
	 * which select(), MHD's default, cannot watch.
	 */
	m->d = MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD | (v6 ? MHD_USE_IPv6 : 0), 0, NULL,
				NULL, on_request, m, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
				MHD_OPTION_CONNECTION_LIMIT, 32u, MHD_OPTION_CONNECTION_TIMEOUT,
				10u, MHD_OPTION_END);
	if (!m->d) {
		err = errno ? -errno : -EADDRINUSE;
		pthread_mutex_destroy(&m->lock);
		free(m);
		return err;
	}
	info = MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_BIND_PORT);
	inet_ntop(ss.ss_family,
		  v6 ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
		     : (const void *)&((struct sockaddr_in *)&ss)->sin_addr,
		  host, sizeof(host));
	snprintf(m->addr, sizeof(m->addr), v6 ? "[%s]:%u" : "%s:%u", host,
		 info ? (unsigned)info->port : 0u);
	*out = m;
	return 0;
}

const char *metrics_http_addr(const struct metrics_http *m)
{
	return m->addr;
}

void metrics_http_tick(struct broker *b)
{
	struct metrics_http *m = b->metrics;
	double now = clock_now();
	char *js, *old;

	if (!m || (m->snap && now - m->published < PUBLISH_EVERY))
		return;
	js = stats_json(b);
	if (!js)
		return;
	/* The HTTP thread holds the lock for a strdup at most; if it does now, retry next round. */
	if (pthread_mutex_trylock(&m->lock)) {
		free(js);
		return;
	}
	old = m->snap;
	m->snap = js;
	pthread_mutex_unlock(&m->lock);
	free(old);
	m->published = now;
}

void metrics_http_stop(struct metrics_http *m)
{
	if (!m)
		return;
	MHD_stop_daemon(m->d);
	pthread_mutex_destroy(&m->lock);
	free(m->snap);
	free(m);
}
