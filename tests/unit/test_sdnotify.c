// SPDX-License-Identifier: MIT
/*
 * test_sdnotify.c - [tenant-rebind] an arena's fd swapped in systemd's fd store: on a datagram
 * socket standing in for $NOTIFY_SOCKET, sdn_swap_arena sends FDSTOREREMOVE=1 of the arena's
 * name first (no fd), then FDSTORE=1 under the same name with the new file (the same inode),
 * in that order; without a manager it says -ENOENT and sends nothing.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "sdnotify.h"

/* One datagram into text (NUL-terminated), its fd (or -1) into *fd. */
static void recv_one(int s, char *text, size_t len, int *fd)
{
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} cm;
	struct iovec iov = {text, len - 1};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cm.b,
			    .msg_controllen = sizeof(cm)};
	ssize_t n = recvmsg(s, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);

	assert_true(n > 0);
	text[n] = '\0';
	*fd = -1;
	if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
		memcpy(fd, CMSG_DATA(c), sizeof(int));
}

static void test_sdn_swap_arena(void **state)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char text[256];
	struct stat a, b;
	int s, fd, got;

	(void)state;
	unsetenv("NOTIFY_SOCKET");
	fd = memfd_create("kvb-test-swap", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(sdn_swap_arena(3, fd), -ENOENT);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "/tmp/kvb-test-notify-%d", (int)getpid());
	unlink(sa.sun_path);
	s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(s >= 0);
	assert_int_equal(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
	setenv("NOTIFY_SOCKET", sa.sun_path, 1);
	assert_int_equal(sdn_swap_arena(3, fd), 0);
	recv_one(s, text, sizeof(text), &got);
	assert_string_equal(text, "FDSTOREREMOVE=1\nFDNAME=" SDN_NAME_ARENA "3");
	assert_int_equal(got, -1);
	recv_one(s, text, sizeof(text), &got);
	assert_string_equal(text, "FDSTORE=1\nFDNAME=" SDN_NAME_ARENA "3");
	assert_true(got >= 0);
	assert_int_equal(fstat(fd, &a), 0);
	assert_int_equal(fstat(got, &b), 0);
	assert_true(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
	assert_int_equal(recv(s, text, sizeof(text), MSG_DONTWAIT), -1); /* nothing more */
	unsetenv("NOTIFY_SOCKET");
	close(got);
	close(fd);
	close(s);
	unlink(sa.sun_path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sdn_swap_arena),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
