// SPDX-License-Identifier: MIT
/*
 * reliab.c - helpers of the reliability tests; see reliab.h.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "reliab.h"

enum rel_scale rel_scale(void)
{
	const char *s = getenv("KVB_SCALE");

	if (s && !strcmp(s, "small"))
		return REL_SMALL;
	if (s && !strcmp(s, "full"))
		return REL_FULL;
	return REL_TEST;
}

const char *rel_scale_name(void)
{
	static const char *const n[] = {"small", "test", "full"};

	return n[rel_scale()];
}

long rel_pick(long small, long test, long full)
{
	switch (rel_scale()) {
	case REL_SMALL:
		return small;
	case REL_FULL:
		return full;
	default:
		return test;
	}
}

unsigned rel_soak_seconds(unsigned dflt)
{
	const char *s = getenv("KVB_SOAK_SECONDS");

	return s && *s ? (unsigned)strtoul(s, NULL, 10) : dflt;
}

void rel_figure(const char *fmt, ...)
{
	char line[1024], exe[2048], path[2100];
	const char *name = "?";
	char *slash;
	va_list ap;
	FILE *f;
	ssize_t n;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	exe[n > 0 ? n : 0] = 0;
	slash = strrchr(exe, '/');
	if (slash) {
		*slash = 0;
		name = slash + 1;
	}
	printf("# FIGURE %s [%s]: %s\n", name, rel_scale_name(), line);
	fflush(stdout);
	if (!slash)
		return;
	snprintf(path, sizeof(path), "%s/logs/figures.txt", exe);
	f = fopen(path, "ae");
	if (f) {
		fprintf(f, "%s [%s]: %s\n", name, rel_scale_name(), line);
		fclose(f);
	}
}

int rel_fd_count(pid_t pid, char *list, size_t len)
{
	char dir[64], p[384], t[256];
	DIR *d;
	struct dirent *e;
	int n = 0;
	size_t off = 0;

	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	d = opendir(dir);
	if (!d)
		return -1;
	if (list && len)
		list[0] = 0;
	while ((e = readdir(d))) {
		ssize_t k;

		if (e->d_name[0] == '.')
			continue;
		n++;
		if (!list)
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		k = readlink(p, t, sizeof(t) - 1);
		t[k > 0 ? k : 0] = 0;
		if (off < len)
			off += (size_t)snprintf(list + off, len - off, "  %s -> %s\n", e->d_name,
						t);
	}
	closedir(d);
	return n;
}

long rel_status_kb(pid_t pid, const char *field)
{
	char p[64], line[256];
	size_t n = strlen(field);
	FILE *f;
	long kb = -1;

	snprintf(p, sizeof(p), "/proc/%d/status", (int)pid);
	f = fopen(p, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, n) && line[n] == ':' &&
		    sscanf(line + n + 1, "%ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

int rel_shm_count(const char *text)
{
	DIR *d = opendir("/dev/shm");
	struct dirent *e;
	int n = 0;

	if (!d)
		return 0;
	while ((e = readdir(d)))
		n += strstr(e->d_name, text) != NULL;
	closedir(d);
	return n;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double rel_pct(double *v, size_t n, double p)
{
	size_t i;

	if (!n)
		return 0;
	qsort(v, n, sizeof(*v), cmp_d);
	i = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
	return v[i < n ? i : n - 1];
}

void rel_deadline(unsigned secs)
{
	alarm(secs);
}

void rel_sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

uint64_t rel_kill(pid_t pid)
{
	uint64_t t = harness_now_ns();

	if (pid > 1 && pid != getpid()) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	return t;
}
