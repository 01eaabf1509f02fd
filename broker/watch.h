/* SPDX-License-Identifier: MIT */
/*
 * watch.h - the broker's watch over what it relies on but does not hold in its own memory: the
 * keeper of its pool and the files beside its socket. See watch.c.
 */
#ifndef KVB_BROKER_WATCH_H
#define KVB_BROKER_WATCH_H

struct broker;

/* Once the loop exists and the socket listens: the keeper's connection joins the loop. */
void watch_start(struct broker *b);

/* From the loop's tick; looks at most once a second. */
void watch_tick(struct broker *b, double now);

/* Whether the pool survives a crash of this broker now (a keeper or systemd holds it). */
int watch_restart_safe(const struct broker *b);

#endif /* KVB_BROKER_WATCH_H */
