/* SPDX-License-Identifier: MIT */
/*
 * log.h - the broker's log: one line per event on stderr, with a UTC timestamp and a level.
 * Called from the loop thread and copy workers alike; each line is one write(2), so lines from
 * different threads never interleave.
 */
#ifndef KVB_BROKER_LOG_H
#define KVB_BROKER_LOG_H

enum log_level { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };

extern int log_min_level;

/* "debug", "info", "warn", "error" -> level; -1 when unknown. */
int log_parse_level(const char *s);

void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_debug(...)                                                                             \
	do {                                                                                       \
		if (log_min_level <= LOG_DEBUG)                                                    \
			log_msg(LOG_DEBUG, __VA_ARGS__);                                           \
	} while (0)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

/* One line per kind per gap seconds (LOG_GAP); the next one says how many were not logged. */
struct log_throttle {
	double at;
	unsigned long long quiet;
};

/* 1 when a line of this kind may go now (*quiet: how many were held back), else 0. */
int log_throttle_ok(struct log_throttle *t, double gap, unsigned long long *quiet);

#define LOG_GAP 10.0 /* seconds between two refusal/expiry lines of one kind */

#define log_throttled(tt, fmt, ...)                                                                \
	do {                                                                                       \
		unsigned long long q_ = 0;                                                         \
		if (!log_throttle_ok((tt), LOG_GAP, &q_))                                          \
			break;                                                                     \
		if (q_)                                                                            \
			log_warn(fmt " (and %llu more in %.0f s, not logged)", __VA_ARGS__, q_,    \
				 LOG_GAP);                                                         \
		else                                                                               \
			log_warn(fmt, __VA_ARGS__);                                                \
	} while (0)

#endif /* KVB_BROKER_LOG_H */
