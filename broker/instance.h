/* SPDX-License-Identifier: MIT */
/*
 * instance.h - one broker per socket: the lock file "<socket>.lock". See instance.c.
 */
#ifndef KVB_BROKER_INSTANCE_H
#define KVB_BROKER_INSTANCE_H

#include <sys/types.h>

/*
 * Takes the write lock on "<socket>.lock" (created 0640 if absent) and writes our pid into it.
 * Returns the fd, to keep open for the broker's life, or -EBUSY when a live broker holds it
 * (*owner gets its pid, 0 unknown), or another negative errno.
 */
int instance_lock(const char *socket_path, pid_t *owner);

/* Removes the lock file and closes fd (clean exit only). */
void instance_unlock(const char *socket_path, int fd);

#endif /* KVB_BROKER_INSTANCE_H */
