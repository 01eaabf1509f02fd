// SPDX-License-Identifier: MIT
/*
 * error.c - kvb_strerror(): what each errno means when this API returns it.
 *
 * The texts describe kvbroker's meaning of the code (-ENOSPC is "the pool is full of leased
 * pages", not "no space left on device"), which is what an engine's log line needs. Static
 * strings only: safe from any thread, no locale, no allocation.
 */
#include <errno.h>

#include "kvbroker.h"

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
		return "too many clients attached to the broker";
	case ENFILE:
		return "too many open files in the system";
	case ETIMEDOUT:
		return "timed out";
	case EOPNOTSUPP:
		return "not supported (control-only client, GPU memory CUDA cannot export, or a "
		       "broker too old for the call)";
	case ENODEV:
		return "no GPU copies: no CUDA driver or device here, the broker has GPU copies "
		       "off, "
		       "or the device is not one the broker sees";
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
