/* SPDX-License-Identifier: MIT */
/*
 * sdnotify.h - the service manager's side channel: sd_notify datagrams (READY=1, STATUS=,
 * FDSTORE=1) on $NOTIFY_SOCKET, and the fds it passes back at start ($LISTEN_FDS). Written
 * here, without libsystemd (not a dependency). See sdnotify.c.
 */
#ifndef KVB_BROKER_SDNOTIFY_H
#define KVB_BROKER_SDNOTIFY_H

#include <stdint.h>

#include "keeper.h"

/* fd names of a pool in the store: the side table, then "kvbpool-arena-<i>" for arena i. */
#define SDN_NAME_META "kvbpool-meta"
#define SDN_NAME_ARENA "kvbpool-arena-"
/* [records] A client session's record (orphan.c), as a keeper keeps it: its region, ledger and
 * pidfd as "kvbsess-<tag>-<partition>-r", "-l", "-p". */
#define SDN_NAME_REC "kvbsess-"

/* Whether $NOTIFY_SOCKET names a service manager to talk to. */
int sdn_enabled(void);

/*
 * Whether the service manager keeps n fds for us: $NOTIFY_SOCKET set and $FDSTORE (what
 * systemd 254 and later set to FileDescriptorStoreMax=) at least n.
 */
int sdn_fdstore_ok(uint32_t n);

/* Sends one notify message (text, with n fds by SCM_RIGHTS). 0, -ENOENT without a manager. */
int sdn_send(const char *text, const int *fds, uint32_t n);

/* printf into a STATUS= line (and nothing else); errors are ignored. */
void sdn_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * Stores a pool in the fd store: fds[0] (side table) as SDN_NAME_META, fds[1 + i] as arena i.
 * 0 or the first error (what was stored then is removed again).
 */
int sdn_store_pool(const int *fds, uint32_t n);

/* [tenant-rebind] Arena a's fd in the store replaced by fd (FDSTOREREMOVE=1, then FDSTORE=1
 * under the same name). 0 or -errno. */
int sdn_swap_arena(uint32_t a, int fd);

/* FDSTOREREMOVE=1 of the side table and arenas [0, narenas): the pool is freed. */
void sdn_remove_pool(uint32_t narenas);

/*
 * The pool the service manager passed back ($LISTEN_PID, $LISTEN_FDS, $LISTEN_FDNAMES, fds from
 * 3), validated: the side table into fds[0], arena i into fds[1 + i]. Returns the fd count,
 * 0 when none was passed to us, or -EBADMSG when what was passed is not a well-formed pool (the
 * reason logged; its fds closed, and the names that look like ours removed from the store).
 * Fds of other names are closed and logged. Clears the LISTEN_* variables either way.
 */
int sdn_listen_pool(int *fds, uint32_t max);

/* [records] Stores a session's record (fds as keeper_rec_add takes them); 0 or -errno. */
int sdn_store_record(uint64_t tag, uint32_t part, const int *fds, uint32_t n);
/* [records] FDSTOREREMOVE=1 of each of its names. */
void sdn_remove_record(uint64_t tag, uint32_t part);
/*
 * [records] The records the last sdn_listen_pool() found, each to fn as keeper_rec_list
 * hands them (fn owns the fds; the fds after a missing one are closed). Returns how many.
 */
int sdn_records(keeper_rec_fn fn, void *arg);

#endif /* KVB_BROKER_SDNOTIFY_H */
