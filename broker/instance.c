// SPDX-License-Identifier: MIT
/*
 * instance.c - the single-instance guarantee: an open-file-description lock (F_OFD_SETLK,
 * F_WRLCK) on "<socket>.lock", taken before anything else at start-up and held until exit.
 *
 * The kernel drops the lock when the broker dies, however it dies, so a broker killed with
 * SIGKILL never blocks its successor: the next one takes the lock, replaces the stale socket
 * file and starts. A memfd pool leaves nothing else behind. While one broker holds the lock a
 * second one refuses to start, even before the first one listens (its pool may take seconds to
 * prefault); and clients that find the socket missing or refusing test the lock (F_OFD_GETLK,
 * which takes nothing) to tell "starting" (-EAGAIN) from "no broker".
 *
 * A clean exit unlinks the file while still holding the lock. A successor that opened the old
 * file just before would then lock an unlinked inode, so after locking we check that the path
 * still names the file we locked, and retry if not.
 *
 * Start-up thread only.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "instance.h"

static void lock_path(const char *socket_path, char *out, size_t len)
{
	snprintf(out, len, "%s.lock", socket_path);
}

int instance_lock(const char *socket_path, pid_t *owner)
{
	char path[256];
	struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
	struct stat a, b;
	int fd, err;

	*owner = 0;
	lock_path(socket_path, path, sizeof(path));
	for (int tries = 0; tries < 8; tries++) {
		fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0640);
		if (fd < 0)
			return -errno;
		if (fcntl(fd, F_OFD_SETLK, &fl) < 0) {
			char buf[16] = {0};

			err = errno == EAGAIN || errno == EACCES ? -EBUSY : -errno;
			/* OFD locks have no owner pid: the holder wrote it into the file. */
			if (pread(fd, buf, sizeof(buf) - 1, 0) > 0 && sscanf(buf, "%d", owner) != 1)
				*owner = 0;
			close(fd);
			return err;
		}
		if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino &&
		    a.st_dev == b.st_dev) {
			if (ftruncate(fd, 0) == 0)
				dprintf(fd, "%d\n", (int)getpid());
			return fd;
		}
		close(fd); /* unlinked under us by an exiting broker: lock the new file */
	}
	return -EBUSY;
}

void instance_unlock(const char *socket_path, int fd)
{
	char path[256];

	if (fd < 0)
		return;
	lock_path(socket_path, path, sizeof(path));
	unlink(path);
	close(fd);
}
