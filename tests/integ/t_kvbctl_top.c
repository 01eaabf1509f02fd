// SPDX-License-Identifier: MIT
/*
 * t_kvbctl_top.c - `kvbctl top` driven under a pseudo-terminal (forkpty): it draws the broker,
 * the pool bar and the attached client, keeps refreshing, survives a broker restart by
 * reconnecting (showing the new broker's pid), and quits with `q`, exit 0, terminal restored.
 */
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "harness.h"

#define PAGE (16u * 1024)

static char screen[1 << 20]; /* everything top wrote */
static size_t len;

/* Reads what top wrote for up to ms milliseconds, or until it hangs up. */
static void drain(int fd, int ms)
{
	uint64_t end = harness_now_ms() + (uint64_t)ms;

	while (harness_now_ms() < end) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		ssize_t n;

		if (poll(&p, 1, 20) != 1)
			continue;
		n = read(fd, screen + len, sizeof(screen) - len - 1);
		if (n <= 0)
			return;
		len += (size_t)n;
		screen[len] = '\0';
		if (len == sizeof(screen) - 1)
			len = 0; /* keep reading; a test looks at recent output only */
	}
}

/* Waits up to ms for text to appear in top's output at or after offset from. */
static int wait_for(int fd, const char *text, size_t from, int ms)
{
	uint64_t end = harness_now_ms() + (uint64_t)ms;

	while (harness_now_ms() < end) {
		if (from <= len && strstr(screen + from, text))
			return 1;
		drain(fd, 50);
	}
	return from <= len && strstr(screen + from, text);
}

int main(int argc, char **argv)
{
	struct winsize ws = {.ws_row = 40, .ws_col = 120};
	struct harness_broker *b, *b2;
	struct kvb_layout l;
	char kvbctl[PATH_MAX], pid[32], sock[sizeof(b->sock)];
	kvb_client *c;
	uint8_t *page;
	uint32_t ns;
	size_t pb, mark;
	pid_t child;
	int fd, st = 0;

	harness_init(argc, argv);
	harness_bin_path("kvbctl", kvbctl, sizeof(kvbctl));
	b = harness_broker_start("--pool", "64M");
	snprintf(sock, sizeof(sock), "%s", b->sock);
	c = harness_connect(b, "top-client", 0);
	harness_layout(&l, "top-model", KVB_LAYOUT_MLA, 16, 2, 0, 1, PAGE / 16);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	page = calloc(1, PAGE);
	CHECK(page != NULL);
	for (int i = 0; i < 3; i++)
		CHECK_RC(kvb_put(c, ns, harness_key(5, (uint64_t)i), page, PAGE), 0);

	child = forkpty(&fd, NULL, NULL, &ws);
	CHECK(child >= 0);
	if (child == 0) {
		setenv("TERM", "xterm", 1);
		execl(kvbctl, kvbctl, "--socket", sock, "top", "--interval", "0.2", (char *)NULL);
		_exit(127);
	}
	/* The first screen: the broker, the pool, the client and its namespace. */
	snprintf(pid, sizeof(pid), "%d", (int)b->pid);
	CHECKF(wait_for(fd, "top-client", 0, 5000) && wait_for(fd, "puts/s", 0, 2000) &&
		       wait_for(fd, pid, 0, 2000) && wait_for(fd, "ram", 0, 2000),
	       "top's first screen lacks the client, rates, broker pid or ram bar:\n%s", screen);
	/* A few refreshes: with the rates from two samples, the ops/s column fills in. */
	for (int i = 0; i < 5; i++)
		CHECK_RC(kvb_put(c, ns, harness_key(6, (uint64_t)i), page, PAGE), 0);
	drain(fd, 800);
	CHECKF(harness_broker_alive(b), "broker died under top");
	kvb_close(c);

	/* The broker restarts: top says it is reconnecting, then shows the new one. */
	mark = len;
	harness_broker_stop(b);
	CHECKF(wait_for(fd, "reconnecting", mark, 5000), "top did not say it is reconnecting:\n%s",
	       screen + mark);
	b2 = harness_broker_start("--socket", sock, "--pool", "64M");
	mark = len;
	snprintf(pid, sizeof(pid), "%d", (int)b2->pid);
	CHECKF(wait_for(fd, pid, mark, 5000), "top did not show the new broker (pid %s):\n%s", pid,
	       screen + mark);

	/* q quits, exit 0. */
	CHECK(write(fd, "q", 1) == 1);
	for (uint64_t end = harness_now_ms() + 3000; harness_now_ms() < end;) {
		drain(fd, 50);
		if (waitpid(child, &st, WNOHANG) == child) {
			child = 0;
			break;
		}
	}
	if (child) {
		kill(child, SIGKILL);
		waitpid(child, &st, 0);
		CHECKF(0, "top did not quit on q");
	}
	CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "top exit status 0x%x", st);
	close(fd);
	harness_broker_stop(b2);
	free(page);
	return H_PASS;
}
