// SPDX-License-Identifier: MIT
/*
 * error.c - kvb_strerror(): what each errno means when this API returns it; and
 * kvb_connect_error(): what a failed kvb_connect() means to the person who must fix it.
 *
 * The texts describe kvbroker's meaning of the code (-ENOSPC is "the pool is full of leased
 * pages", not "no space left on device"), which is what an engine's log line needs. Static
 * strings only: safe from any thread, no locale, no allocation.
 *
 * A failed connect is the error users meet first, and the errno alone misleads: -EACCES said
 * "start a broker" to a user whom the socket's group shut out of a running one. So
 * kvb_connect_error() names the socket, and for a permission refused it finds what refused:
 * the first directory above the socket this process may not search (the broker makes its own
 * 0750, group --group), else the socket (0660), and names its owner, group and mode, who is in
 * the group, and the fix: join the group and log in again, log in again when the user was
 * added after this login, or restart a group-less broker with --group. Reentrant lookups
 * (getpwuid_r, getgrgid_r) keep it thread-safe; it never touches the socket.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "api.h"

const char *kvb_strerror(int err)
{
	if (err < 0)
		err = -err;
	switch (err) {
	case 0:
		return "success";
	case EINVAL:
		return "invalid argument (malformed request, length, flag or reserved field)";
	case ENOENT:
		return "not stored (or no broker socket at that path)";
	case ENOSPC:
		return "pool full: nothing can be evicted";
	case EFAULT:
		return "buffer range outside the registered buffer";
	case EBADF:
		return "unknown buffer, view, lease or namespace for this client (or a host fd "
		       "not open O_RDWR, or O_APPEND, given with KVB_BUF_FDCOPY)";
	case EDQUOT:
		return "too many leases held by this client";
	case ECONNRESET:
		return "broker connection lost";
	case ECONNREFUSED:
		return "no broker listening on the socket";
	case EACCES:
		return "refused by the broker's credential check (or socket permissions)";
	case EPERM:
		return "host fd not sealed with F_SEAL_SHRINK (pass KVB_BUF_SEAL to seal it, or "
		       "KVB_BUF_FDCOPY to have the broker copy with pread/pwrite: a memfd made "
		       "without MFD_ALLOW_SEALING, or a /dev/shm file, cannot be sealed)";
	case EMEDIUMTYPE:
		return "host fd is not a tmpfs file (memfd or /dev/shm); disk files and hugetlbfs "
		       "are refused";
	case EPROTO:
		return "protocol error (ABI version mismatch or malformed message from the broker)";
	case EBADMSG:
		return "page checksum mismatch";
	case EIO:
		return "I/O error in the broker's disk tier";
	case ENOMEM:
		return "out of memory (or over the broker's --max-buf-bytes)";
	case E2BIG:
		return "page larger than the broker accepts";
	case EMFILE:
		return "too many namespaces, buffers or views";
	case EUSERS:
		return "too many clients attached to the broker (--max-clients; --max-control for "
		       "control connections), or with --tenants every partition bound to a tenant "
		       "in use (the broker's log says which)";
	case ENFILE:
		return "too many open files in the system";
	case ETIMEDOUT:
		return "timed out";
	case ESHUTDOWN:
		return "the client was closed (kvb_close) while this call waited";
	case EOPNOTSUPP:
		return "not supported (control-only client, GPU memory CUDA cannot export, or a "
		       "broker too old for the call)";
	case ENODEV:
		return "no GPU copies: no CUDA driver or device here, the broker has GPU copies "
		       "off, "
		       "or the device is not one the broker sees (kvb_connect: no PCI device with "
		       "that gpu_busid on the broker's machine)";
	case EBUSY:
		return "resource busy (still in use by a view or an operation)";
	case EEXIST:
		return "already exists";
	case EAGAIN:
		return "try again: the broker is starting (its pool is not ready yet), or the ring "
		       "is full";
	case EMSGSIZE:
		return "message too large for the control socket";
	case ENAMETOOLONG:
		return "socket path too long";
	case ENOTCONN:
	case EPIPE:
		return "not connected to the broker";
	case ERANGE:
		return "value out of range";
	default:
		return "unknown error";
	}
}

/* The name of uid, else "uid N". */
static const char *user_name(uid_t uid, char *out, size_t len)
{
	char buf[4096];
	struct passwd pw, *r = NULL;

	if (getpwuid_r(uid, &pw, buf, sizeof(buf), &r) || !r)
		snprintf(out, len, "uid %u", (unsigned)uid);
	else
		snprintf(out, len, "%s", r->pw_name);
	return out;
}

/* The name of gid, else "gid N". */
static const char *group_name(gid_t gid, char *out, size_t len)
{
	char buf[16384];
	struct group gr, *r = NULL;

	if (getgrgid_r(gid, &gr, buf, sizeof(buf), &r) || !r)
		snprintf(out, len, "gid %u", (unsigned)gid);
	else
		snprintf(out, len, "%s", r->gr_name);
	return out;
}

/* Does the group database list user as a member of gid (supplementary, or primary)? */
static int listed_in(gid_t gid, uid_t uid, const char *user)
{
	char buf[16384];
	struct group gr, *r = NULL;
	struct passwd pw, *p = NULL;

	if (!getpwuid_r(uid, &pw, buf, sizeof(buf), &p) && p && p->pw_gid == gid)
		return 1;
	if (getgrgid_r(gid, &gr, buf, sizeof(buf), &r) || !r)
		return 0;
	for (char **m = r->gr_mem; *m; m++)
		if (!strcmp(*m, user))
			return 1;
	return 0;
}

/* Does this process have gid (effective or supplementary)? */
static int has_group(gid_t gid)
{
	gid_t g[256];
	int n = getgroups(256, g);

	if (getegid() == gid)
		return 1;
	for (int i = 0; i < n; i++)
		if (g[i] == gid)
			return 1;
	return 0;
}

/*
 * What refuses this process on the way to path: the first directory, from the top down, it may
 * not search, else path itself when it may not write it (connecting needs both). 1 and its
 * name in out, or 0 when nothing does (a security module, or it changed meanwhile).
 */
static int refuser(const char *path, char *out, size_t len)
{
	char p[PATH_MAX];

	snprintf(p, sizeof(p), "%s", path);
	for (char *slash = strchr(p + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
		*slash = '\0';
		if (faccessat(AT_FDCWD, p, X_OK, AT_EACCESS) < 0 && errno == EACCES) {
			snprintf(out, len, "%s", p);
			return 1;
		}
		*slash = '/';
	}
	if (faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) < 0 && errno == EACCES) {
		snprintf(out, len, "%s", path);
		return 1;
	}
	return 0;
}

/* -EACCES / -EPERM: who the broker admits, and how to be one of them. */
static void denied(int err, const char *path, char *buf, size_t len)
{
	char what[PATH_MAX], owner[64], group[64], me[64];
	uid_t uid = geteuid();
	struct stat st;
	int n;

	if (!refuser(path, what, sizeof(what)) || stat(what, &st) < 0) {
		snprintf(buf, len,
			 "permission denied at %s (%s): no file mode refuses this process, so a "
			 "security module (SELinux, AppArmor) or an ACL does: see its audit log",
			 path, err == EPERM ? "EPERM" : "EACCES");
		return;
	}
	user_name(st.st_uid, owner, sizeof(owner));
	group_name(st.st_gid, group, sizeof(group));
	user_name(uid, me, sizeof(me));
	n = snprintf(buf, len,
		     "permission denied at %s: a broker is running there, but %s (owner %s, "
		     "group %s, mode %04o) admits only uid %u (%s) and group %s",
		     path, what, owner, group, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid,
		     owner, group);
	if (n < 0 || (size_t)n >= len)
		return;
	buf += n;
	len -= (size_t)n;
	if (!(st.st_mode & (S_ISDIR(st.st_mode) ? S_IXGRP : S_IWGRP)))
		snprintf(buf, len,
			 "; its mode gives the group nothing: run as %s, or have its owner "
			 "grant the group access (chmod g+%s %s)",
			 owner, S_ISDIR(st.st_mode) ? "x" : "w", what);
	else if (st.st_gid == 0)
		snprintf(buf, len,
			 ", so it was started without --group: run as %s, or restart it with "
			 "--group GROUP (kvbrokerd --group GROUP --socket %s) and join GROUP "
			 "(usermod -aG GROUP %s, then log in again)",
			 owner, path, strncmp(me, "uid ", 4) ? me : "USER");
	else if (has_group(st.st_gid))
		snprintf(buf, len,
			 "; this process has group %s, so an ACL or a security module refuses it "
			 "(getfacl %s)",
			 group, what);
	else if (listed_in(st.st_gid, uid, me))
		snprintf(buf, len,
			 "; %s was added to %s after this login: log in again (or run: newgrp %s)",
			 me, group, group);
	else
		snprintf(buf, len,
			 ", and %s is not in %s: to join, usermod -aG %s %s (as root), then log in "
			 "again",
			 me, group, group, strncmp(me, "uid ", 4) ? me : "USER");
}

const char *kvb_connect_error(int err, const char *socket_path, char *buf, size_t len)
{
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];

	if (!buf || !len)
		return buf;
	if (err < 0)
		err = -err;
	if (kvb_socket_path(socket_path, path, sizeof(path)) < 0) {
		snprintf(buf, len, "socket path longer than %zu bytes: %s%s", sizeof(path) - 1,
			 socket_path ? "" : "$KVB_SOCKET=",
			 socket_path ? socket_path : getenv("KVB_SOCKET"));
		return buf;
	}
	switch (err) {
	case ENOENT:
		snprintf(buf, len,
			 "no broker at %s (no socket there): start one with: kvbrokerd --socket "
			 "%s, or point $KVB_SOCKET at the socket of the broker that runs",
			 path, path);
		break;
	case ECONNREFUSED:
		snprintf(buf, len,
			 "no broker at %s (a socket file nobody listens on: a broker that died): "
			 "start one with: kvbrokerd --socket %s",
			 path, path);
		break;
	case EACCES:
	case EPERM:
		denied(err, path, buf, len);
		break;
	case EAGAIN:
		snprintf(buf, len,
			 "the broker at %s is starting (its pool is not ready yet): try again in a "
			 "moment",
			 path);
		break;
	case ECONNRESET:
		snprintf(buf, len,
			 "the broker at %s hung up: it admits only its own uid and --group (its "
			 "log names who it refused), or it is stopping",
			 path);
		break;
	case EPROTO:
		snprintf(buf, len,
			 "the broker at %s speaks another protocol version: use the programs and "
			 "library of its own version (kvbrokerd --version)",
			 path);
		break;
	default:
		snprintf(buf, len, "the broker at %s: %s", path, kvb_strerror(-err));
		break;
	}
	return buf;
}
