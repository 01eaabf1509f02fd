/* SPDX-License-Identifier: MIT */
/*
 * metrics_http.h - kvbrokerd's Prometheus endpoint (--metrics-listen): GET /metrics over HTTP,
 * served by libmicrohttpd's own thread from a snapshot the loop publishes. See metrics_http.c.
 */
#ifndef KVB_BROKER_METRICS_HTTP_H
#define KVB_BROKER_METRICS_HTTP_H

struct broker;
struct metrics_http;

/*
 * Listens on addr: "HOST:PORT", "[V6ADDR]:PORT", ":PORT" or "PORT" (the last two on
 * 127.0.0.1: loopback unless an address is named). Port 0 takes a free port; the address
 * actually bound is metrics_http_addr(). Call after the signals are blocked, so the server's
 * thread inherits the mask. 0, -EINVAL for a bad address, or a negative errno.
 */
int metrics_http_start(const char *addr, struct metrics_http **out);

/* The bound address as "HOST:PORT". */
const char *metrics_http_addr(const struct metrics_http *m);

/* Loop thread: publishes a fresh stats snapshot when the last one is a second old. */
void metrics_http_tick(struct broker *b);

/* Stops the thread, closes the socket, frees m (NULL is fine). */
void metrics_http_stop(struct metrics_http *m);

#endif /* KVB_BROKER_METRICS_HTTP_H */
