// SPDX-License-Identifier: MIT
/*
 * fuzz_ctl.c - libFuzzer target over the control channel: a sequence of datagrams (with or
 * without a memfd attached) sent on a real SOCK_SEQPACKET socketpair to the broker's own
 * ctl_on_msg(), which validates, dispatches (HELLO, NS_OPEN with and without the ABI 1.2
 * identity, BUF_REG, BUF_REG_FD, BUF_UNREG, VIEW_CREATE, VIEW_CREATE2, VIEW_DESTROY, STATS whole
 * and paged, DROP) and replies.
 *
 * A victim ring client is attached beside the fuzzed session, so that DROP can end a real
 * session (its rings, buffers and views): session ids are per-run numbers an input cannot
 * know, so a DROP whose id is 0 (never a session's) names the victim.
 *
 * Input: records of [u8 flags][u16 len][len bytes of datagram]; flags bit 0 attaches a memfd
 * whose size follows as a u32 before the datagram (clamped to 1 MiB), bits 1-3 seal it
 * against shrink, grow, write; bit 4 attaches a second fd (never allowed).
 *
 * Oracles beyond ASan/UBSan: every reply is a well-formed reply datagram (kvb_msg_check) that
 * echoes the request's type and seq; every fd a reply carries obeys rule 2 of docs/design.md
 * (the ring region memfd sealed against shrink, grow and further sealing; pool fds read-only);
 * and when the session ends nothing it held is left and no fd leaked (fuzz_session_end).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_broker.h"
#include "proto.h"

static uint8_t rbuf[KVB_STATS_MAX];

static int make_memfd(uint32_t size, unsigned seals)
{
	int fd = memfd_create("fuzz-buf", MFD_CLOEXEC | MFD_ALLOW_SEALING), s = 0;

	if (fd < 0)
		fuzz_fail("memfd_create");
	if (ftruncate(fd, size > (1u << 20) ? (1u << 20) : size) < 0)
		fuzz_fail("ftruncate");
	s |= seals & 1 ? F_SEAL_SHRINK : 0;
	s |= seals & 2 ? F_SEAL_GROW : 0;
	s |= seals & 4 ? F_SEAL_WRITE : 0;
	if (s && fcntl(fd, F_ADD_SEALS, s) < 0)
		fuzz_fail("F_ADD_SEALS");
	return fd;
}

static void send_dgram(int sock, const uint8_t *p, size_t len, const int *fds, int nfds)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * 2)];
		struct cmsghdr align;
	} cm;
	struct iovec iov = {(void *)(uintptr_t)p, len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

	if (nfds) {
		struct cmsghdr *c;

		mh.msg_control = cm.b;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	/* A zero-length datagram is how SEQPACKET says nothing; the broker reads it as a hang-up. */
	sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static void check_fds(const struct kvb_msg_hdr *h, const int *fds, int nfds)
{
	for (int i = 0; i < nfds; i++) {
		int seals = fcntl(fds[i], F_GET_SEALS), fl = fcntl(fds[i], F_GETFL);

		if (h->type != KVB_MSG_HELLO)
			fuzz_fail("fds with a reply other than HELLO");
		if (i == 0) {
			int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

			if (seals < 0 || (seals & want) != want)
				fuzz_fail("ring region memfd not sealed");
		} else if (i >= 3 && (fl < 0 || (fl & O_ACCMODE) != O_RDONLY)) {
			fuzz_fail("pool fd not read-only");
		}
	}
}

/* Reads every reply waiting and checks it. */
static void drain(int peer, const struct kvb_msg_hdr *req)
{
	for (;;) {
		union {
			char b[CMSG_SPACE(sizeof(int) * KVB_MAX_FDS)];
			struct cmsghdr align;
		} cm;
		struct iovec iov = {rbuf, sizeof(rbuf)};
		struct msghdr mh = {.msg_iov = &iov,
				    .msg_iovlen = 1,
				    .msg_control = cm.b,
				    .msg_controllen = sizeof(cm.b)};
		int fds[KVB_MAX_FDS], nfds = 0;
		struct kvb_msg_hdr h;
		ssize_t n = recvmsg(peer, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

		if (n <= 0)
			return;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

			for (size_t i = 0; i < k && nfds < (int)KVB_MAX_FDS; i++)
				memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
		}
		if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC) || kvb_msg_check(rbuf, (size_t)n))
			fuzz_fail("malformed reply");
		memcpy(&h, rbuf, sizeof(h));
		if (!(h.flags & KVB_MSGF_REPLY) || !req || h.type != req->type || h.seq != req->seq)
			fuzz_fail("reply does not echo its request");
		check_fds(&h, fds, nfds);
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_broker *fb = fuzz_broker();
	struct session *victim = fuzz_session_ring(fb, 8, 0);
	int peer, alive = 1;
	struct session *s = fuzz_session_sock(fb, &peer);
	uint8_t dgram[KVB_MSG_MAX];
	size_t pos = 0;

	while (alive && pos + 3 <= size) {
		uint8_t flags = data[pos];
		size_t len = (size_t)data[pos + 1] | (size_t)data[pos + 2] << 8;
		struct kvb_msg_hdr req = {0}, *reqp = NULL;
		int fds[2], nfds = 0;
		uint32_t fsize = 0;

		pos += 3;
		if (flags & 1) {
			if (pos + 4 > size)
				break;
			memcpy(&fsize, data + pos, 4);
			pos += 4;
			fds[nfds++] = make_memfd(fsize, flags >> 1);
		}
		if (flags & 0x10)
			fds[nfds++] = dup(2);
		if (len > size - pos)
			len = size - pos;
		if (len > sizeof(dgram))
			len = sizeof(dgram);
		memcpy(dgram, data + pos, len);
		if (len >= sizeof(req)) {
			memcpy(&req, dgram, sizeof(req));
			reqp = &req;
		}
		if (reqp && req.type == KVB_MSG_DROP && len >= sizeof(req) + sizeof(uint32_t) &&
		    !memcmp(dgram + sizeof(req), "\0\0\0\0", 4))
			memcpy(dgram + sizeof(req), &victim->id, sizeof(uint32_t));
		send_dgram(peer, dgram, len, fds, nfds);
		pos += len;
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		if (ctl_on_msg(&fb->b, s) < 0)
			alive = 0;
		drain(peer, reqp);
	}
	close(peer);
	if (!victim->dead)
		session_destroy(&fb->b, victim, NULL);
	fuzz_session_end(fb, s, alive);
	return 0;
}
