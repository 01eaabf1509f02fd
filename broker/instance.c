// SPDX-License-Identifier: MIT
/*
 * instance.c - the broker's files beside its socket: the directory, the lock file that makes
 * one broker per socket, and the listening socket.
 *
 * The single-instance guarantee is an open-file-description lock (F_OFD_SETLK, F_WRLCK) on
 * "<socket>.lock", taken before anything else at start-up and held until exit.
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
 * A file can be removed under a running broker (a tmp cleaner, an operator): the lock then no
 * longer keeps a second broker out, which is why the pool's own guard is its keeper
 * (keeper.c [owner]), and why the broker makes its files again when they go (watch.c).
 *
 * Start-up thread, and the loop thread (watch.c) once the broker runs.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "instance.h"
#include "log.h"

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
	if (instance_is(path, fd, NULL)) /* not another broker's, made after ours was removed */
		unlink(path);
	close(fd);
}

int instance_dir(const char *socket_path, int has_group, gid_t group)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)], *slash;

	snprintf(dir, sizeof(dir), "%s", socket_path);
	slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return 0;
	*slash = '\0';
	if (mkdir(dir, 0750) == 0) {
		if (has_group && chown(dir, (uid_t)-1, group) < 0)
			log_warn("chown %s to group %u: %s", dir, (unsigned)group, strerror(errno));
		return 1;
	}
	return errno == EEXIST ? 0 : -errno;
}

void instance_dir_remove(const char *socket_path)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)], *slash;

	snprintf(dir, sizeof(dir), "%s", socket_path);
	slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return;
	*slash = '\0';
	rmdir(dir); /* leaves a directory that is not empty */
}

int instance_listen(const char *socket_path, int has_group, gid_t group)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd, err;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", socket_path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		close(fd);
		return -EADDRINUSE;
	}
	close(fd);
	unlink(socket_path); /* stale (ECONNREFUSED) or absent */
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(socket_path, 0660) < 0 ||
	    (has_group && chown(socket_path, (uid_t)-1, group) < 0) || listen(fd, 128) < 0) {
		err = -errno;
		close(fd);
		return err;
	}
	return fd;
}

int instance_is(const char *path, int fd, const struct stat *was)
{
	struct stat a, b;

	if (stat(path, &b) < 0)
		return 0;
	if (fd >= 0)
		return fstat(fd, &a) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
	return was->st_ino == b.st_ino && was->st_dev == b.st_dev;
}
