// SPDX-License-Identifier: MIT
/*
 * ctl.c - the client's side of the control socket: one request, one reply, file descriptors
 * both ways, and kvb_stats_json() on top of it.
 *
 * The socket is SOCK_SEQPACKET, so every message is one datagram and a reply is read whole or
 * not at all. Each request carries a fresh seq; a reply whose seq is not the one we wait for is
 * a late answer to a request that timed out, and is dropped with its fds closed. Replies are
 * sized with recv(MSG_PEEK|MSG_TRUNC) first because a STATS reply may be far larger than any
 * other (KVB_STATS_MAX) and a fixed buffer would either waste 1 MiB per call or truncate.
 *
 * Every fd the kernel installs for us is either handed to the caller in struct kvbc_reply or
 * closed here, on every path: a broker that sends a malformed reply must not leak descriptors
 * into the engine. Sends use MSG_NOSIGNAL so a dead broker is -ECONNRESET, never SIGPIPE.
 *
 * Called with the client lock held; the socket has exactly one reader and one writer.
 */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define REPLY_HDR (sizeof(struct kvb_msg_hdr) + sizeof(struct kvb_msg_reply))
#define REPLY_MAX (REPLY_HDR + (KVB_STATS_MAX > KVB_MSG_MAX ? KVB_STATS_MAX : KVB_MSG_MAX))

void kvbc_close_fds(const int *fds, int n)
{
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

int kvbc_reply_body(const struct kvbc_reply *r, void *dst, size_t len)
{
	if (r->body_len < len)
		return -EPROTO;
	memcpy(dst, r->body, len);
	return 0;
}

void kvbc_reply_free(struct kvbc_reply *r)
{
	kvbc_close_fds(r->fds, r->nfds);
	r->nfds = 0;
	free(r->msg);
	r->msg = NULL;
	r->body = NULL;
	r->body_len = 0;
}

/* The socket failed in a way that means the broker is gone: remember it for every later call. */
static int conn_lost(struct kvb_client *c)
{
	kvbc_lost(c, -ECONNRESET);
	return -ECONNRESET;
}

static int send_req(struct kvb_client *c, uint16_t type, const void *body, size_t body_len,
		    int send_fd)
{
	struct kvb_msg_hdr h = {
		.magic = KVB_MSG_MAGIC,
		.type = type,
		.len = (uint32_t)(sizeof(h) + body_len),
		.seq = c->seq,
	};
	struct iovec iov[2] = {
		{.iov_base = &h, .iov_len = sizeof(h)},
		{.iov_base = (void *)(uintptr_t)body, .iov_len = body_len},
	};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct msghdr msg = {.msg_iov = iov, .msg_iovlen = body_len ? 2 : 1};
	ssize_t n;

	if (sizeof(h) + body_len > KVB_MSG_MAX)
		return -EMSGSIZE;
	if (send_fd >= 0)
		kvb_msg_attach_fds(&msg, ctl.buf, &send_fd, 1);
	do
		n = sendmsg(c->sock, &msg, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		if (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN)
			return conn_lost(c);
		return kvbc_errno();
	}
	return 0;
}

/*
 * Receives one datagram into r (malloc'd, fds taken). Returns its length, -ETIMEDOUT when
 * nothing came by deadline, -ECONNRESET on hang-up, -EPROTO when it cannot be a reply.
 */
static int recv_one(struct kvb_client *c, int64_t deadline, struct kvbc_reply *r)
{
	union {
		char buf[CMSG_SPACE(KVB_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct pollfd pfd = {.fd = c->sock, .events = POLLIN};
	struct iovec iov;
	struct msghdr msg;
	char probe;
	ssize_t n, got;
	uint32_t nfds;
	int err;

	for (;;) {
		int64_t left = deadline - (int64_t)(clock_ns() / 1000000);
		int rc;

		if (left < 0)
			left = 0;
		rc = poll(&pfd, 1, (int)left);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0)
			return kvbc_errno();
		if (rc == 0)
			return -ETIMEDOUT;
		n = recv(c->sock, &probe, 1, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		break;
	}
	if (n == 0)
		return conn_lost(c); /* EOF: the broker closed the socket */
	if (n < 0)
		return errno == ECONNRESET ? conn_lost(c) : kvbc_errno();
	if ((size_t)n > REPLY_MAX || (size_t)n < REPLY_HDR) {
		/* Consume it without a control buffer: the kernel closes any fds it carried. */
		(void)recv(c->sock, &probe, 1, MSG_DONTWAIT);
		return -EPROTO;
	}
	r->msg = malloc((size_t)n);
	if (!r->msg) {
		(void)recv(c->sock, &probe, 1, MSG_DONTWAIT);
		return -ENOMEM;
	}
	iov.iov_base = r->msg;
	iov.iov_len = (size_t)n;
	memset(&msg, 0, sizeof(msg));
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = ctl.buf;
	msg.msg_controllen = sizeof(ctl.buf);
	do
		got = recvmsg(c->sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	while (got < 0 && errno == EINTR);
	if (got <= 0) {
		err = got == 0 ? conn_lost(c) : kvbc_errno();
		goto err_free;
	}
	err = kvb_msg_take_fds(&msg, r->fds, KVB_MAX_FDS, &nfds);
	if (err)
		goto err_free;
	r->nfds = (int)nfds;
	return (int)got;

err_free:
	free(r->msg);
	r->msg = NULL;
	return err;
}

/*
 * One control round trip. Sends type + body (+ send_fd when >= 0) and waits for the reply with
 * the same seq. Returns the broker's res (>= 0) with r filled (the caller frees it with
 * kvbc_reply_free()), or a negative errno (the broker's, or the transport's) with r empty.
 */
int kvbc_ctl(struct kvb_client *c, uint16_t type, const void *body, size_t body_len, int send_fd,
	     struct kvbc_reply *r)
{
	int64_t deadline = (int64_t)(clock_ns() / 1000000) + KVBC_CTL_TIMEOUT_MS;
	struct kvb_msg_reply rep;
	struct kvb_msg_hdr h;
	int err, len;

	memset(r, 0, sizeof(*r));
	if (c->fatal)
		return c->fatal;
	/*
	 * [release-post] The broker answers control requests as they come, apart from the
	 * rings: RELEASEs we posted without waiting complete first, so that this request sees
	 * their leases gone (a stats request right after kvb_release(), a buffer unregistered).
	 */
	err = kvbc_wait_discards_locked(c, KVBC_CTL_TIMEOUT_MS);
	if (err)
		return err;
	c->seq++;
	err = send_req(c, type, body, body_len, send_fd);
	if (err)
		return err;
	for (;;) {
		len = recv_one(c, deadline, r);
		if (len < 0)
			return len;
		if (kvb_msg_check(r->msg, (size_t)len)) {
			err = -EPROTO;
			goto err_free;
		}
		memcpy(&h, r->msg, sizeof(h));
		if ((h.flags & KVB_MSGF_REPLY) && h.seq == c->seq)
			break;
		/* A late reply to a request that timed out, or nothing we asked for: drop it. */
		kvbc_reply_free(r);
	}
	if (h.type != type) {
		err = -EPROTO;
		goto err_free;
	}
	memcpy(&rep, (const char *)r->msg + sizeof(h), sizeof(rep));
	if (rep.res < 0) {
		err = rep.res;
		goto err_free;
	}
	r->res = rep.res;
	r->body = (const char *)r->msg + REPLY_HDR;
	r->body_len = (size_t)len - REPLY_HDR;
	return rep.res;

err_free:
	kvbc_reply_free(r);
	return err;
}

/*
 * Paged STATS (ABI 1.3, wire.h): pages of one snapshot until its length, which the first
 * reply states. A document that grew meanwhile cannot: later pages come from the same one.
 */
static int stats_paged(kvb_client *c, char **json)
{
	struct kvb_msg_stats_page m = {0};
	struct kvbc_reply r;
	size_t total = 0;
	char *s = NULL;
	int err;

	do {
		err = kvbc_ctl(c, KVB_MSG_STATS, &m, sizeof(m), -1, &r);
		if (err < 0)
			goto err_free;
		if (r.res <= 0 || (m.offset && (size_t)r.res != total) ||
		    m.offset + r.body_len > (size_t)r.res ||
		    (!r.body_len && m.offset < (size_t)r.res)) {
			err = r.res < 0 ? r.res : -EPROTO;
			kvbc_reply_free(&r);
			goto err_free;
		}
		if (!s) {
			total = (size_t)r.res;
			s = malloc(total + 1);
			if (!s) {
				kvbc_reply_free(&r);
				return -ENOMEM;
			}
		}
		memcpy(s + m.offset, r.body, r.body_len);
		m.offset += r.body_len;
		kvbc_reply_free(&r);
	} while (m.offset < total);
	s[total] = '\0';
	*json = s;
	return 0;
err_free:
	free(s);
	return err;
}

int kvb_stats_json(kvb_client *c, char **json)
{
	struct kvbc_reply r;
	char *s;
	int err;

	if (!json)
		return -EINVAL;
	err = kvbc_enter_ctl(c);
	if (err)
		return err;
	if (c->broker_minor >= 3) {
		err = stats_paged(c, json);
		goto out;
	}
	err = kvbc_ctl(c, KVB_MSG_STATS, NULL, 0, -1, &r);
	if (err < 0)
		goto out;
	s = malloc(r.body_len + 1);
	if (!s) {
		err = -ENOMEM;
		goto out_free;
	}
	if (r.body_len)
		memcpy(s, r.body, r.body_len);
	s[r.body_len] = '\0';
	*json = s;
	err = 0;
out_free:
	kvbc_reply_free(&r);
out:
	kvbc_leave(c);
	return err;
}

/* NS_LIMIT and TENANT_SHARE carry the same fields: a name, then bytes or a percentage. */
static_assert(sizeof(struct kvb_msg_tenant_share) == sizeof(struct kvb_msg_ns_limit) &&
		      offsetof(struct kvb_msg_tenant_share, bytes) ==
			      offsetof(struct kvb_msg_ns_limit, bytes) &&
		      offsetof(struct kvb_msg_tenant_share, percent) ==
			      offsetof(struct kvb_msg_ns_limit, percent),
	      "one layout for both");

/* Sends type (a broker of ABI minor min_minor or later) for name: its bytes or percent. */
static int ctl_named_amount(kvb_client *c, uint16_t type, uint32_t min_minor, const char *name,
			    uint64_t bytes, uint32_t percent)
{
	struct kvb_msg_ns_limit m = {.bytes = bytes, .percent = percent};
	struct kvbc_reply r;
	size_t n = name ? strlen(name) : 0;
	int err;

	if (!n || n >= sizeof(m.model) || (bytes && percent) || percent > 100)
		return -EINVAL;
	memcpy(m.model, name, n);
	err = kvbc_enter_ctl(c);
	if (err)
		return err;
	err = c->broker_minor >= min_minor ? kvbc_ctl(c, type, &m, sizeof(m), -1, &r) : -EOPNOTSUPP;
	if (err >= 0) {
		err = r.res;
		kvbc_reply_free(&r);
	}
	kvbc_leave(c);
	return err;
}

int kvb_tenant_share(kvb_client *c, const char *tenant, uint64_t bytes, uint32_t percent)
{
	return ctl_named_amount(c, KVB_MSG_TENANT_SHARE, 8, tenant, bytes, percent);
}

int kvb_ns_limit(kvb_client *c, const char *model, uint64_t bytes, uint32_t percent)
{
	return ctl_named_amount(c, KVB_MSG_NS_LIMIT, 7, model, bytes, percent);
}

int kvb_drop_client(kvb_client *c, uint32_t client_id)
{
	struct kvb_msg_id m = {client_id, 0};
	struct kvbc_reply r;
	int err;

	err = kvbc_enter_ctl(c);
	if (err)
		return err;
	err = c->broker_minor >= 3 ? kvbc_ctl(c, KVB_MSG_DROP, &m, sizeof(m), -1, &r) : -EOPNOTSUPP;
	if (err >= 0) {
		err = r.res;
		kvbc_reply_free(&r);
	}
	kvbc_leave(c);
	return err;
}
