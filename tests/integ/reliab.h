/* SPDX-License-Identifier: MIT */
/*
 * reliab.h - helpers of the reliability tests (t_rel_*, docs/reliability.md): how big a run
 * is, what a process holds (/proc fds, RSS), latency percentiles, and the figures each test
 * reports.
 *
 * Size: $KVB_SCALE is "small" (the sanitizer suites), "test" (make test, the default) or "full"
 * (make soak); the soak runs $KVB_SOAK_SECONDS. Figures: a test reports each measured figure
 * with rel_figure(), which prints "# FIGURE test: text" and appends the line to
 * logs/figures.txt next to the test logs, where docs/reliability.md's numbers come from.
 */
#ifndef KVB_TESTS_RELIAB_H
#define KVB_TESTS_RELIAB_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "harness.h"

enum rel_scale { REL_SMALL = 0, REL_TEST = 1, REL_FULL = 2 };

enum rel_scale rel_scale(void);
const char *rel_scale_name(void);
/* The value for the current scale. */
long rel_pick(long small, long test, long full);
/* Soak seconds: $KVB_SOAK_SECONDS, else dflt. */
unsigned rel_soak_seconds(unsigned dflt);

/* Prints "# FIGURE <test>: <text>" and appends it to logs/figures.txt. */
void rel_figure(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Open fds of pid (-1 on error); with list, also "fd -> target" lines into list (len bytes). */
int rel_fd_count(pid_t pid, char *list, size_t len);
/* A "<field>: N kB" line of /proc/<pid>/status (VmRSS, RssAnon), in KiB; -1 on error. */
long rel_status_kb(pid_t pid, const char *field);
/* Names under /dev/shm that contain text. */
int rel_shm_count(const char *text);

/* p-th percentile (0..100) of n values (sorts them in place); 0 when n == 0. */
double rel_pct(double *v, size_t n, double p);

/* Extends the harness's deadline alarm to secs from now (for long soaks). */
void rel_deadline(unsigned secs);

/* Millisecond sleep. */
void rel_sleep_ms(unsigned ms);

/* Sends SIGKILL to pid and reaps it; returns the CLOCK_MONOTONIC ns of the kill. */
uint64_t rel_kill(pid_t pid);

#endif /* KVB_TESTS_RELIAB_H */
