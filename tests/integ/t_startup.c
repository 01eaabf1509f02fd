// SPDX-License-Identifier: MIT
/*
 * t_startup.c - a broker answers only once its pool is ready. While one is starting (it holds
 * "<socket>.lock" but does not listen yet; simulated here by holding the lock ourselves, which
 * is exactly the broker's state during a long prefault), kvb_connect returns -EAGAIN at once and
 * kvb_strerror says the broker is starting, and a second broker on that socket refuses to run.
 * Once the lock is free a broker starts, and with no lock file and no socket a client gets
 * -ENOENT as before. A real start-up then logs every phase.
 */
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

int main(int argc, char **argv)
{
	char dir[] = "/tmp/kvbt-startup-XXXXXX", sock[108], lock[128], self[PATH_MAX];
	char cmd[PATH_MAX + 256], out[4096];
	struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
	struct harness_broker *b;
	struct kvb_opts o = {.name = "early"};
	kvb_client *c = NULL;
	FILE *p;
	size_t n;
	int fd, st;

	harness_init(argc, argv);
	snprintf(self, sizeof(self), "%s", argv[0]);
	CHECK(mkdtemp(dir) != NULL);
	snprintf(sock, sizeof(sock), "%s/sock", dir);
	snprintf(lock, sizeof(lock), "%s.lock", sock);
	o.socket_path = sock;

	CHECK_RC(kvb_connect(&o, &c), -ENOENT); /* nobody there */

	fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
	CHECK(fd >= 0);
	CHECK_EQ(fcntl(fd, F_OFD_SETLK, &fl), 0);
	CHECK_RC(kvb_connect(&o, &c), -EAGAIN);
	CHECKF(strstr(kvb_strerror(-EAGAIN), "starting") != NULL, "kvb_strerror(-EAGAIN): %s",
	       kvb_strerror(-EAGAIN));

	snprintf(cmd, sizeof(cmd), "%s/../bin/kvbrokerd --socket %s --pool 64M 2>&1", dirname(self),
		 sock);
	p = popen(cmd, "r");
	CHECK(p != NULL);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	st = pclose(p);
	CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 1 && strstr(out, "another kvbrokerd"),
	       "a broker while another one starts: status 0x%x, said:\n%s", st, out);
	CHECK_RC(kvb_connect(&o, &c), -EAGAIN); /* our lock is intact: it did not take it */
	close(fd);				/* the "starting broker" died */
	CHECK_RC(kvb_connect(&o, &c), -ENOENT);

	b = harness_broker_start("--pool", "64M", "--socket", sock);
	c = harness_connect(b, "late", 0);
	kvb_close(c);
	CHECK(harness_broker_log_has(b, "pool: reserved"));
	CHECK(harness_broker_log_has(b, "pool: prefaulted"));
	CHECK(harness_broker_log_has(b, "pool: pinned"));
	CHECK(harness_broker_log_has(b, "ready in"));
	harness_broker_stop(b);
	rmdir(dir);
	return H_PASS;
}
