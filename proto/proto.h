/* SPDX-License-Identifier: MIT */
/*
 * proto.h - checks and geometry both sides share: region layout, message and layout validation,
 * the static shape of an SQE. Everything here is pure: no I/O, no allocation, safe on any thread.
 * Inputs are untrusted bytes; nothing here may assert on them.
 */
#ifndef KVB_PROTO_PROTO_H
#define KVB_PROTO_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "wire.h"

/*
 * Fills *h with the geometry of a ring region for sq_entries (a power of two in
 * KVB_SQ_MIN..KVB_SQ_MAX) and an argument area of arg_size bytes (rounded up to 4 KiB).
 * Returns the region size in bytes, or -EINVAL.
 */
int64_t kvb_region_layout(uint32_t sq_entries, uint32_t arg_size, struct kvb_region_hdr *h);

/* [notes] Where the note ring of a region with KVB_FEAT_NOTES starts (wire.h). */
static inline uint64_t kvb_region_notes_off(const struct kvb_region_hdr *h)
{
	return (uint64_t)h->arg_off + h->arg_size;
}

/* [hazard] Where the hazard table of a region with KVB_FEAT_HAZARDS starts (wire.h). */
static inline uint64_t kvb_region_hz_off(const struct kvb_region_hdr *h)
{
	return kvb_region_notes_off(h) + KVB_NOTES_BYTES;
}

/* Client side: does a region header received from the broker describe a sane region of
 * region_size bytes? 0 or -EPROTO. */
int kvb_region_check(const struct kvb_region_hdr *h, uint64_t region_size);

/* A received datagram of len bytes: header sane, type known, len matches? 0, -EPROTO. */
int kvb_msg_check(const void *buf, size_t len);

/* Minimum body length of each request type (after the header); -1 for unknown types. */
int64_t kvb_msg_body_min(uint16_t type);

/*
 * Validates a layout: strings terminated and non-empty, kind known, counts in range, reserved
 * words zero, page size within KVB_MAX_PAGE_BYTES. On success returns 0 and the page size in
 * *page_bytes; otherwise -EINVAL (or -E2BIG for an oversized page).
 */
int kvb_layout_check(const struct kvb_layout *l, uint64_t *page_bytes);

/* Total layers of a layout (sum over components); the number of view parts it needs. */
uint32_t kvb_layout_parts(const struct kvb_layout *l);

/*
 * Validates an identity against its (checked) layout: flags and reserved words zero, dtypes
 * known and only for existing components, page_format well-formed, ranks below sizes (a size
 * of 0 means 1). 0 or -EINVAL.
 */
int kvb_ident_check(const struct kvb_layout *l, const struct kvb_ns_ident *id);

/* *out = *id (NULL: the default identity) with sizes of 0 made 1. */
void kvb_ident_norm(const struct kvb_ns_ident *id, struct kvb_ns_ident *out);

/* Is id (NULL allowed) the default identity, ignoring dp (which is not identity)? */
int kvb_ident_is_default(const struct kvb_ns_ident *id);

/*
 * Static shape of an SQE copied out of the ring: opcode known, flags known and allowed for the
 * opcode, reserved fields zero, layer range and batch fields consistent with arg_size.
 * Returns 0 or -EINVAL. Broker state (ns, buf, view, lease) is checked by the broker.
 */
int kvb_sqe_check(const struct kvb_sqe *sqe, uint32_t arg_size);

/*
 * Attaches n fds to mh as one SCM_RIGHTS message (none: nothing) in cbuf, which must hold
 * CMSG_SPACE(n * sizeof(int)) bytes aligned for struct cmsghdr (a union with one).
 */
void kvb_msg_attach_fds(struct msghdr *mh, void *cbuf, const int *fds, uint32_t n);

/*
 * The other half of kvb_msg_attach_fds(), for a message recvmsg() filled: moves every
 * SCM_RIGHTS fd of mh into fds[0..max) and sets *n to how many. Returns 0, or -EPROTO when
 * any was lost (more than max came, or the kernel truncated the data or the control part,
 * MSG_TRUNC / MSG_CTRUNC): then every fd received is closed and *n is 0, so no caller can
 * leak one or act on part of a message. The one receive loop of the broker, its keeper and
 * the library.
 */
int kvb_msg_take_fds(struct msghdr *mh, int *fds, uint32_t max, uint32_t *n);

/*
 * The control socket path when none is given: $KVB_SOCKET when set and not empty, else
 * KVB_SOCKET_DEFAULT (/run/kvbroker/kvbroker.sock); the one rule of kvbrokerd and the library
 * (kvb_socket_path in include/kvbroker.h). Returns 0, or -ENAMETOOLONG when it does not fit
 * buf or a sockaddr_un.
 */
int kvb_default_socket(char *buf, size_t len);

/* Is x a power of two (x > 0)? */
static inline int kvb_is_pow2(uint64_t x)
{
	return x && !(x & (x - 1));
}

#endif /* KVB_PROTO_PROTO_H */
