// SPDX-License-Identifier: MIT
/*
 * t_metrics_http.c - kvbrokerd --metrics-listen: Prometheus scrapes /metrics over HTTP from the
 * running broker. The reply is 200 with the exposition content type, every line parses
 * (metrics_check), the values follow the state the test creates, the families are exactly
 * those `kvbctl metrics` prints (one generator), other paths and methods are refused, a
 * scraper that stalls mid-request does not slow the broker's ops, and a bad address is a
 * start-up error.
 */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "metrics.h"

#define PAGE (16u * 1024)

/* An HTTP/1.0 request to 127.0.0.1:port; returns the status code, *resp the whole reply. */
static int http(int port, const char *method, const char *path, char **resp)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	size_t cap = 1 << 16, len = 0;
	char req[256], *buf = malloc(cap);
	int fd = socket(AF_INET, SOCK_STREAM, 0), code = 0;
	ssize_t n;

	CHECK(buf != NULL && fd >= 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	CHECKF(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect to port %d", port);
	snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: localhost\r\n\r\n", method, path);
	CHECK(write(fd, req, strlen(req)) == (ssize_t)strlen(req));
	for (;;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};

		CHECKF(poll(&p, 1, 5000) == 1, "no HTTP reply in 5 s");
		n = read(fd, buf + len, cap - len - 1);
		if (n <= 0)
			break;
		len += (size_t)n;
		if (len == cap - 1) {
			char *nb = realloc(buf, cap * 2);

			CHECK(nb != NULL);
			buf = nb;
			cap *= 2;
		}
	}
	buf[len] = '\0';
	close(fd);
	sscanf(buf, "HTTP/1.%*d %d", &code);
	*resp = buf;
	return code;
}

/* The body of an HTTP reply (after the blank line). */
static const char *body(const char *resp)
{
	const char *b = strstr(resp, "\r\n\r\n");

	CHECKF(b != NULL, "HTTP reply without a header end:\n%s", resp);
	return b + 4;
}

/* The "# TYPE" lines of an exposition, in order, for comparing two of them. */
static char *types(const char *text)
{
	char *out = calloc(1, strlen(text) + 1), *o = out;

	CHECK(out != NULL);
	for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
		if (!strncmp(l, "# TYPE ", 7)) {
			size_t n = strcspn(l, "\n") + 1;

			memcpy(o, l, n);
			o += n;
		}
	}
	return out;
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	kvb_client *c;
	uint32_t ns;
	size_t pb;
	uint8_t *page;
	char *js, *resp, *kt, *t1, *t2, err[256], cmd[2 * PATH_MAX];
	const char *addr, *colon;
	int port, stall, found = 0;
	uint64_t t0;
	cJSON *root;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M", "--metrics-listen", "127.0.0.1:0");
	c = harness_connect(b, "scraped", 0);

	/* The bound address is in the stats document (and the log). */
	js = harness_stats(c);
	root = cJSON_Parse(js);
	addr = cJSON_GetStringValue(cJSON_GetObjectItem(root, "metrics_listen"));
	CHECKF(addr && !strncmp(addr, "127.0.0.1:", 10), "metrics_listen: %s", js);
	colon = strrchr(addr, ':');
	port = atoi(colon + 1);
	CHECK(port > 0);
	CHECK(harness_broker_log_has(b, "metrics: http://127.0.0.1:"));
	cJSON_Delete(root);
	free(js);

	/* A first scrape: 200, the exposition content type, every line parses. */
	CHECK_EQ(http(port, "GET", "/metrics", &resp), 200);
	CHECKF(strstr(resp, "Content-Type: text/plain; version=0.0.4"), "headers:\n%s", resp);
	CHECKF(metrics_check(body(resp), err, sizeof(err)) == 0, "%s:\n%s", err, body(resp));
	free(resp);

	/* State the scrape must come to show: 5 pages of a namespace, 2 of them put twice. */
	harness_layout(&l, "http-model", KVB_LAYOUT_MLA, 16, 4, 0, 1, PAGE / 16);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	page = calloc(1, PAGE);
	CHECK(page != NULL);
	for (int i = 0; i < 5; i++)
		CHECK_RC(kvb_put(c, ns, harness_key(3, (uint64_t)i), page, PAGE), 0);
	for (int i = 0; i < 2; i++)
		CHECK_RC(kvb_put(c, ns, harness_key(3, (uint64_t)i), page, PAGE), 1);
	/* The loop publishes a snapshot once a second: poll for up to 5 s. */
	for (t0 = harness_now_ms(); !found && harness_now_ms() - t0 < 5000;) {
		CHECK_EQ(http(port, "GET", "/metrics", &resp), 200);
		found = strstr(body(resp), "kvbroker_pool_pages{tier=\"ram\"} 5\n") &&
			strstr(body(resp), "kvbroker_dedup_total 2\n");
		if (!found)
			free(resp);
		else
			break;
		usleep(100 * 1000);
	}
	CHECKF(found, "scrapes never showed 5 pages and 2 dedup hits:\n%s", body(resp));
	CHECKF(metrics_check(body(resp), err, sizeof(err)) == 0, "%s:\n%s", err, body(resp));
	snprintf(cmd, sizeof(cmd),
		 "kvbroker_ns_dedup_bytes_total{ns=\"%u\",model=\"http-model\",kind=\"mla\"} %u\n",
		 ns, 2 * PAGE);
	CHECKF(strstr(body(resp), cmd), "scrape lacks %s:\n%s", cmd, body(resp));
	CHECK(strstr(body(resp), "kvbroker_client_puts_total{client=") != NULL);

	/* One generator: the HTTP endpoint and kvbctl metrics declare the same families. */
	snprintf(cmd, sizeof(cmd), "--socket %s metrics", b->sock);
	CHECK_EQ(harness_run_tool("kvbctl", cmd, &kt), 0);
	t1 = types(body(resp));
	t2 = types(kt);
	CHECKF(!strcmp(t1, t2), "families differ:\nHTTP:\n%s\nkvbctl:\n%s", t1, t2);
	free(t1);
	free(t2);
	free(kt);
	free(resp);

	/* Other paths and methods. */
	CHECK_EQ(http(port, "GET", "/", &resp), 404);
	free(resp);
	CHECK_EQ(http(port, "POST", "/metrics", &resp), 405);
	free(resp);

	/* A scraper stalled mid-request does not hold up the broker's loop. */
	{
		struct sockaddr_in sa = {.sin_family = AF_INET,
					 .sin_port = htons((uint16_t)port),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		uint64_t t;

		stall = socket(AF_INET, SOCK_STREAM, 0);
		CHECK(connect(stall, (struct sockaddr *)&sa, sizeof(sa)) == 0);
		CHECK(write(stall, "GET /metr", 9) == 9);
		t = harness_now_ms();
		for (int i = 0; i < 200; i++)
			CHECK_RC(kvb_put(c, ns, harness_key(4, (uint64_t)i), page, PAGE), 0);
		CHECKF(harness_now_ms() - t < 3000,
		       "200 PUTs took %llu ms beside a stalled scraper",
		       (unsigned long long)(harness_now_ms() - t));
		CHECK_EQ(http(port, "GET", "/metrics", &resp), 200);
		free(resp);
		close(stall);
	}

	kvb_close(c);
	harness_broker_stop(b);
	free(page);

	/* A bad address is a start-up error, not a broker without metrics. */
	snprintf(cmd, sizeof(cmd),
		 "--socket %s/bad.sock --pool 16M --metrics-listen 127.0.0.1:notaport", b->dir);
	CHECK_EQ(harness_run_tool("kvbrokerd", cmd, &resp), 1);
	CHECKF(strstr(resp, "--metrics-listen 127.0.0.1:notaport"), "no reason given:\n%s", resp);
	free(resp);
	return H_PASS;
}
