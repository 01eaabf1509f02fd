/* SPDX-License-Identifier: MIT */
/*
 * instance.h - the broker's files: its socket's directory, the lock file "<socket>.lock" (one
 * broker per socket) and the listening socket. See instance.c.
 */
#ifndef KVB_BROKER_INSTANCE_H
#define KVB_BROKER_INSTANCE_H

#include <sys/stat.h>
#include <sys/types.h>

/*
 * Takes the write lock on "<socket>.lock" (created 0640 if absent) and writes our pid into it.
 * Returns the fd, to keep open for the broker's life, or -EBUSY when a live broker holds it
 * (*owner gets its pid, 0 unknown), or another negative errno.
 */
int instance_lock(const char *socket_path, pid_t *owner);

/* Removes the lock file and closes fd (clean exit only). */
void instance_unlock(const char *socket_path, int fd);

/*
 * Creates the socket's directory when missing, before the lock file and the socket go in it:
 * only the broker's user (and with has_group, group) may enter a directory we create. 1 when it
 * made it, 0 when it was there, or -errno.
 */
int instance_dir(const char *socket_path, int has_group, gid_t group);

/* A failed start leaves no directory it made: removes it when empty. */
void instance_dir_remove(const char *socket_path);

/*
 * Binds and listens on the control socket, replacing a stale file but never a live broker's
 * socket (-EADDRINUSE). With has_group, the socket belongs to that group, so its members (and
 * nobody else but us) can connect; SO_PEERCRED is checked again at accept. The fd or -errno.
 */
int instance_listen(const char *socket_path, int has_group, gid_t group);

/* Whether path names the file open as fd (fd >= 0) or the file was describes (fd < 0). */
int instance_is(const char *path, int fd, const struct stat *was);

#endif /* KVB_BROKER_INSTANCE_H */
