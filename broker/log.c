// SPDX-License-Identifier: MIT
/*
 * log.c - formatted log lines on stderr. A line is formatted into a stack buffer and written
 * with a single write(2) so concurrent threads never interleave; a line too long is truncated.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"

int log_min_level = LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

int log_parse_level(const char *s)
{
	for (int i = 0; i < 4; i++)
		if (!strcmp(s, level_names[i]))
			return i;
	return -1;
}

void log_msg(int level, const char *fmt, ...)
{
	char line[1024];
	struct timespec ts;
	struct tm tm;
	va_list ap;
	size_t n;
	int k;

	if (level < log_min_level)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
	k = snprintf(line + n, sizeof(line) - n, ".%06ldZ %-5s kvbrokerd[%d]: ", ts.tv_nsec / 1000,
		     level_names[level & 3], (int)getpid());
	n += k > 0 ? (size_t)k : 0;
	va_start(ap, fmt);
	k = vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
	va_end(ap);
	n = k < 0 ? n : (n + (size_t)k < sizeof(line) - 1 ? n + (size_t)k : sizeof(line) - 2);
	line[n++] = '\n';
	/* Nothing sensible to do when stderr is gone. */
	if (write(STDERR_FILENO, line, n) < 0)
		return;
}

int log_throttle_ok(struct log_throttle *t, double gap, unsigned long long *quiet)
{
	double now = clock_now();

	if (t->at && now - t->at < gap) {
		t->quiet++;
		return 0;
	}
	*quiet = t->quiet;
	t->quiet = 0;
	t->at = now;
	return 1;
}
