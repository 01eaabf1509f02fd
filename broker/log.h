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

#endif /* KVB_BROKER_LOG_H */
