// SPDX-License-Identifier: MIT
/*
 * sdnotify.c - talking to systemd without libsystemd: the sd_notify datagram protocol and the
 * fds the manager passes back at start.
 *
 * Protocol (sd_notify(3), systemd.io/FILE_DESCRIPTOR_STORE): $NOTIFY_SOCKET is the path of a
 * datagram unix socket (a leading '@' names the abstract namespace); each notification is one
 * datagram of newline-separated KEY=VALUE lines, optionally with fds (SCM_RIGHTS). We send
 * READY=1 once the socket listens, STATUS= lines, STOPPING=1, and FDSTORE=1 + FDNAME=<name>
 * with one pool fd each (one name per fd: LISTEN_FDNAMES then tells which fd is what, whatever
 * order the manager keeps them in); a clean stop sends FDSTOREREMOVE=1 + FDNAME= for each. The
 * kernel adds our credentials, which the manager checks against NotifyAccess=.
 *
 * On the next start, the manager puts the stored fds at 3, 4, ... and sets LISTEN_PID (ours),
 * LISTEN_FDS (how many) and LISTEN_FDNAMES (their names, ':'-separated). sdn_listen_pool()
 * takes them only when all three agree and name exactly one side table and arenas 0..n-1; the
 * pool's content is then checked like a keeper's (pool_adopt, adopt.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "pool.h"
#include "proto.h"
#include "sdnotify.h"

#define SDN_FD0 3	    /* SD_LISTEN_FDS_START */
#define SDN_MAX_LISTEN 4096 /* more is not a manager's doing */

int sdn_enabled(void)
{
	const char *e = getenv("NOTIFY_SOCKET");

	return e && (e[0] == '/' || e[0] == '@') && e[1];
}

int sdn_fdstore_ok(uint32_t n)
{
	const char *e = getenv("FDSTORE");
	char *end;
	unsigned long v;

	if (!sdn_enabled() || !e || !*e)
		return 0;
	errno = 0;
	v = strtoul(e, &end, 10);
	return !errno && !*end && v >= n;
}

/* $NOTIFY_SOCKET as an address; its length into *len. */
static int notify_addr(struct sockaddr_un *sa, socklen_t *len)
{
	const char *e = getenv("NOTIFY_SOCKET");
	size_t l;

	if (!sdn_enabled())
		return -ENOENT;
	l = strlen(e);
	if (l >= sizeof(sa->sun_path))
		return -ENAMETOOLONG;
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path, e, l);
	if (e[0] == '@')
		sa->sun_path[0] = 0; /* abstract: the name is the bytes after the NUL, no end NUL */
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + l + (e[0] == '/'));
	return 0;
}

int sdn_send(const char *text, const int *fds, uint32_t n)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * (1 + POOL_MAX_ARENAS))];
		struct cmsghdr align;
	} cm;
	struct sockaddr_un sa;
	struct iovec iov = {(void *)(uintptr_t)text, strlen(text)};
	struct msghdr mh = {.msg_name = &sa, .msg_iov = &iov, .msg_iovlen = 1};
	int fd, err = notify_addr(&sa, &mh.msg_namelen);

	if (err)
		return err;
	if (n > 1 + POOL_MAX_ARENAS)
		return -EINVAL;
	if (n)
		kvb_msg_attach_fds(&mh, cm.b, fds, n);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* A full queue of a busy manager: wait for it rather than lose READY or an fd. */
	err = sendmsg(fd, &mh, MSG_NOSIGNAL) == (ssize_t)iov.iov_len ? 0 : -errno;
	close(fd);
	return err;
}

void sdn_status(const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	int l = snprintf(buf, sizeof(buf), "STATUS=");

	if (!sdn_enabled())
		return;
	va_start(ap, fmt);
	vsnprintf(buf + l, sizeof(buf) - (size_t)l, fmt, ap);
	va_end(ap);
	sdn_send(buf, NULL, 0);
}

static void fd_name(uint32_t i, char *out, size_t len)
{
	if (i == 0)
		snprintf(out, len, "%s", SDN_NAME_META);
	else
		snprintf(out, len, "%s%u", SDN_NAME_ARENA, i - 1);
}

int sdn_store_pool(const int *fds, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		char msg[64], name[32];
		int err;

		fd_name(i, name, sizeof(name));
		snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s", name);
		err = sdn_send(msg, &fds[i], 1);
		if (err) {
			sdn_remove_pool(i ? i - 1 : 0);
			return err;
		}
	}
	return 0;
}

/* [records] The store's name of part c ('r' region, 'l' ledger, 'p' pidfd) of record tag. */
static void rec_name(uint64_t tag, uint32_t part, char c, char *out, size_t len)
{
	snprintf(out, len, "%s%016llx-%u-%c", SDN_NAME_REC, (unsigned long long)tag, part, c);
}

static const char rec_parts[KEEPER_REC_FDS] = {'r', 'l', 'p'};

int sdn_store_record(uint64_t tag, uint32_t part, const int *fds, uint32_t n)
{
	for (uint32_t i = 0; i < n && i < KEEPER_REC_FDS; i++) {
		char msg[96], name[64];
		int err;

		rec_name(tag, part, rec_parts[i], name, sizeof(name));
		snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s", name);
		err = sdn_send(msg, &fds[i], 1);
		if (err) {
			sdn_remove_record(tag, part);
			return err;
		}
	}
	return 0;
}

static void remove_name(const char *name);

void sdn_remove_record(uint64_t tag, uint32_t part)
{
	char name[64];

	for (uint32_t i = 0; i < KEEPER_REC_FDS; i++) {
		rec_name(tag, part, rec_parts[i], name, sizeof(name));
		remove_name(name);
	}
}

/* [records] The records passed back by the last sdn_listen_pool, until sdn_records takes them. */
static struct sdn_rec {
	uint64_t tag;
	uint32_t part;
	int fds[KEEPER_REC_FDS];
} * recs;
static uint32_t nrecs;

/* A "kvbsess-" name: its fd joins its record; 0, or -1 when the name is not well formed. */
static int rec_take(const char *s, size_t len, int fd)
{
	char buf[64], c;
	unsigned long long tag;
	unsigned part;
	uint32_t i, k;
	int used;

	if (len >= sizeof(buf))
		return -1;
	memcpy(buf, s, len);
	buf[len] = 0;
	if (sscanf(buf, SDN_NAME_REC "%16llx-%u-%c%n", &tag, &part, &c, &used) != 3 ||
	    (size_t)used != len || part >= POOL_MAX_PARTS || !memchr(rec_parts, c, KEEPER_REC_FDS))
		return -1;
	k = (uint32_t)((const char *)memchr(rec_parts, c, KEEPER_REC_FDS) - rec_parts);
	for (i = 0; i < nrecs && (recs[i].tag != tag || recs[i].part != part); i++)
		;
	if (i == nrecs) {
		struct sdn_rec *r = realloc(recs, (nrecs + 1) * sizeof(*r));

		if (!r)
			return -1;
		recs = r;
		recs[nrecs++] = (struct sdn_rec){.tag = tag, .part = part, .fds = {-1, -1, -1}};
	}
	if (recs[i].fds[k] >= 0)
		return -1; /* given twice */
	recs[i].fds[k] = fd;
	return 0;
}

int sdn_records(keeper_rec_fn fn, void *arg)
{
	uint32_t n = nrecs;

	for (uint32_t i = 0; i < nrecs; i++) {
		int fds[KEEPER_REC_FDS];
		uint32_t k = 0;

		/* The record's fds in keeper order, up to the first missing one. */
		while (k < KEEPER_REC_FDS && recs[i].fds[k] >= 0) {
			fds[k] = recs[i].fds[k];
			k++;
		}
		for (uint32_t j = k; j < KEEPER_REC_FDS; j++)
			if (recs[i].fds[j] >= 0)
				close(recs[i].fds[j]);
		fn(arg, recs[i].tag, recs[i].part, fds, k);
	}
	free(recs);
	recs = NULL;
	nrecs = 0;
	return (int)n;
}

static void remove_name(const char *name)
{
	char msg[300];

	snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", name);
	sdn_send(msg, NULL, 0);
}

int sdn_swap_arena(uint32_t a, int fd)
{
	char name[64], msg[128];

	/* The store keeps every fd sent under a name, even twice: the old one goes first. A crash
	 * between the two leaves the pool without arena a, which the next start refuses whole
	 * (sdn_listen_pool): a pool lost, never an arena of the wrong file. */
	fd_name(1 + a, name, sizeof(name));
	remove_name(name);
	snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s", name);
	return sdn_send(msg, &fd, 1);
}

void sdn_remove_pool(uint32_t narenas)
{
	char name[32];

	for (uint32_t i = 0; i <= narenas; i++) {
		fd_name(i, name, sizeof(name));
		remove_name(name);
	}
}

/* A decimal number without sign, spaces or excess; -1 when it is not one or is above max. */
static long parse_num(const char *s, size_t len, long max)
{
	long v = 0;

	if (!len || len > 9 || (s[0] == '0' && len > 1))
		return -1;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	return v <= max ? v : -1;
}

/* Which pool fd a name is: 0 the side table, 1 + i arena i; -1 not ours, -2 ours but bad. */
static long name_slot(const char *s, size_t len)
{
	size_t pl = strlen(SDN_NAME_ARENA);
	long i;

	if (len == strlen(SDN_NAME_META) && !memcmp(s, SDN_NAME_META, len))
		return 0;
	if (len < 8 || memcmp(s, "kvbpool-", 8))
		return -1;
	if (len <= pl || memcmp(s, SDN_NAME_ARENA, pl))
		return -2;
	i = parse_num(s + pl, len - pl, POOL_MAX_ARENAS - 1);
	return i < 0 ? -2 : i + 1;
}

/* Removes from the store every name of names (n of them) that looks like one of ours. */
static void remove_ours(const char *names, long n)
{
	const char *p = names;

	for (long i = 0; i < n && p; i++) {
		const char *e = strchr(p, ':');
		size_t len = e ? (size_t)(e - p) : strlen(p);

		if (len >= 8 && len < 256 && !memcmp(p, "kvbpool-", 8)) {
			char name[256];

			memcpy(name, p, len);
			name[len] = 0;
			remove_name(name);
		}
		p = e ? e + 1 : NULL;
	}
}

int sdn_listen_pool(int *fds, uint32_t max)
{
	const char *spid = getenv("LISTEN_PID"), *sn = getenv("LISTEN_FDS"),
		   *names = getenv("LISTEN_FDNAMES"), *p;
	long pid, n, nn = 0, top = 0;
	int err = 0, got = 0;
	char why[160] = "";

	if (!spid || !sn)
		return 0;
	pid = parse_num(spid, strlen(spid), 0x7fffffff);
	n = parse_num(sn, strlen(sn), SDN_MAX_LISTEN);
	if (pid != (long)getpid()) {
		/* Meant for another process (ours was inherited): the fds are not ours to touch. */
		log_warn("LISTEN_PID=%s is not this process (%d): LISTEN_FDS=%s ignored", spid,
			 (int)getpid(), sn);
		goto out;
	}
	if (n < 0) {
		log_warn("LISTEN_FDS=%s is not a count: ignored", sn);
		goto out;
	}
	for (uint32_t i = 0; i < max; i++)
		fds[i] = -1;
	if (!names) {
		snprintf(why, sizeof(why), "no LISTEN_FDNAMES (systemd before 227?)");
		err = -EBADMSG;
	}
	/* Count the names first: a list that disagrees with LISTEN_FDS names nothing for sure. */
	for (p = names; p && *p; p++)
		nn += *p == ':';
	if (names)
		nn += *names != 0 || n == 1;
	if (!err && nn != n) {
		snprintf(why, sizeof(why), "LISTEN_FDNAMES has %ld name(s) for LISTEN_FDS=%ld", nn,
			 n);
		err = -EBADMSG;
	}
	p = names;
	for (long i = 0; i < n; i++) {
		int fd = SDN_FD0 + (int)i;
		const char *e = p ? strchr(p, ':') : NULL;
		size_t len = !p ? 0 : e ? (size_t)(e - p) : strlen(p);
		long slot = err ? -1 : name_slot(p, len);

		if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
			if (!err)
				snprintf(why, sizeof(why), "fd %d (%.*s) is not open", fd,
					 (int)(len > 64 ? 64 : len), p);
			err = -EBADMSG;
		} else if (slot == -2 || (slot >= 0 && ((uint32_t)slot >= max || fds[slot] >= 0))) {
			snprintf(why, sizeof(why), "fd %d: name \"%.*s\" is %s", fd,
				 (int)(len > 64 ? 64 : len), p,
				 slot >= 0 ? "given twice" : "not a pool fd's");
			err = -EBADMSG;
			close(fd);
		} else if (slot >= 0) {
			fds[slot] = fd;
			got++;
			top = slot + 1 > top ? slot + 1 : top;
		} else if (p && len > strlen(SDN_NAME_REC) &&
			   !memcmp(p, SDN_NAME_REC, strlen(SDN_NAME_REC))) {
			if (rec_take(p, len, fd)) { /* [records] a client session's, for orphan.c */
				log_warn("LISTEN_FDS: fd %d (\"%.*s\") is not a session record: "
					 "closed",
					 fd, (int)(len > 64 ? 64 : len), p);
				close(fd);
			}
		} else {
			if (!err)
				log_warn("LISTEN_FDS: fd %d (\"%.*s\") is not a pool fd: closed",
					 fd, (int)(len > 64 ? 64 : len), p ? p : "");
			close(fd);
		}
		p = e ? e + 1 : NULL;
	}
	if (!err && got && (top != got || fds[0] < 0)) {
		snprintf(why, sizeof(why), "%d pool fd(s) but %s", got,
			 fds[0] < 0 ? "no " SDN_NAME_META : "the arena numbers have gaps");
		err = -EBADMSG;
	}
	if (err) {
		log_warn("the fds systemd passed (LISTEN_FDS=%ld, LISTEN_FDNAMES=%.200s) are not a "
			 "pool: %s: removing them from the store, starting with a new pool",
			 n, names ? names : "(none)", why);
		for (uint32_t i = 0; i < max; i++)
			if (fds[i] >= 0)
				close(fds[i]);
		/* Ours by every name we would have used, then by any odd "kvbpool-" one. */
		sdn_remove_pool((uint32_t)(n < (long)POOL_MAX_ARENAS ? n : (long)POOL_MAX_ARENAS));
		if (names)
			remove_ours(names, nn);
	}
out:
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	return err ? err : got;
}
