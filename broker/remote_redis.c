// SPDX-License-Identifier: MIT
/*
 * remote_redis.c - the remote tier's Redis Cluster backend ([remote-seam], remote.h): hiredis's
 * async API on the broker's own event loop, plus the slot routing hiredis 0.14 lacks (cslot.c).
 *
 * Connections. One hiredis async context per cluster node (a master that owns slots; the
 * cluster runs without replicas, docs/operations.md). The adapter below registers its fd with
 * the loop (loop_add_events), readable always and writable only while hiredis has bytes to
 * send. Reads bypass hiredis's 16 KiB reads: up to RBUF_BYTES are read at once and fed to its
 * reader, so a 4 MiB page costs a few system calls, not hundreds of loop rounds. A GET's value
 * is not read through hiredis at all when its reply is next on the connection: the kernel
 * copies it straight into the page's slot (struct land: the one copy a fetch costs before the
 * client's), and a stand-in reply then pops hiredis's callback for it in order. Connecting
 * never blocks: seeds are resolved to addresses once, at start-up, and nodes learnt later are
 * addresses already.
 *
 * Routing. slot_node[] maps each of the 16384 slots to the node that owns it, from CLUSTER
 * SLOTS (asked of a seed at start, after every MOVED, and every REFRESH_EVERY seconds). A
 * request goes to its key's node; MOVED updates that slot and resends there, ASK resends once
 * after ASKING, at most MAX_REDIRECTS times. A publish keeps no copy of its request (its page
 * went straight into hiredis's output buffer): redirected, it is done with REMOTE_REDIRECTED
 * and where to (c->route), and the tier sends it once more from the page in RAM (rc_publish).
 * A server without cluster support owns every slot (a single Redis works too).
 *
 * Node states: CONNECTING -> UP on connect; any of refused, reset, or a request unanswered for
 * STALL_MIN or 4 timeouts with no sign of life meanwhile (a stopped or partitioned node: TCP
 * stays up; a node still draining a backlog of publishes is not one) -> DOWN, its context
 * freed (its requests fail at once: misses) and retried after a back-off that doubles from
 * BACKOFF_FIRST to BACKOFF_MAX. While DOWN, requests for its slots are refused without
 * waiting: a dead shard costs misses on its slots only, and nothing else waits for it. The
 * first failure is logged, then nothing until a reply proves it back (logged once more).
 * Loop thread only.
 */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/sds.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/uio.h>
#include <unistd.h>

#include "clock.h"
#include "cslot.h"
#include "list.h"
#include "log.h"
#include "loop.h"
#include "remote.h"

/*
 * Exported by libhiredis 0.14 (and 1.x) but not declared in its async.h: dispatches the replies
 * its reader holds. With redisReaderFeed it lets node_read read in large chunks.
 */
void redisProcessCallbacks(redisAsyncContext *ac);

#define RN_MAX 64		/* cluster nodes known */
#define MAX_REDIRECTS 3		/* MOVED/ASK hops of one request */
#define RBUF_BYTES (1u << 20)	/* bytes per read */
#define LAND_PIECE (256u << 10) /* page bytes per read landing in place (well inside L2) */
#define ROUTE_ASK (1u << 16)	/* remote_call.route: node index + 1, and this bit for ASK */
#define OBUF_KEEP (16u << 20)	/* output buffer kept between requests, at most */
#define READS_PER_EVENT 8	/* reads per readable event (a fair share of the loop) */
#define BACKOFF_FIRST 0.25	/* seconds from a node's failure to its first retry */
#define BACKOFF_MAX 8.0		/* the longest back-off */
#define STALL_MIN 1.0		/* seconds a request may wait for its reply, at least */
#define REFRESH_EVERY 10.0	/* seconds between two CLUSTER SLOTS while all is well */
#define REFRESH_GAP 0.5		/* ... and at least this far apart after redirections */

enum { RN_DOWN = 0, RN_CONNECTING = 1, RN_UP = 2 };

struct rcluster;

/*
 * A GET's reply read past hiredis, straight into the page's WRITING slot: "$<len>\r\n" and
 * the value header into pre[], the page into c->dst, then the closing "\r\n".
 */
struct land {
	struct remote_call *c; /* NULL: hiredis reads */
	char want[24];	       /* the bulk prefix a well-formed value has: "$<len>\r\n" */
	size_t want_len;
	char pre[24 + sizeof(struct remote_hdr)];
	size_t pre_len; /* of pre[] read */
	char tail[2];
	size_t tail_len;
};

struct rnode {
	struct rcluster *rc;
	char host[CSLOT_HOST_MAX];
	uint16_t port;
	uint8_t seed;
	int state;
	redisAsyncContext *ac;
	struct loop_fd lfd;
	int fd;
	uint32_t ev;	   /* epoll events registered, 0: not registered */
	size_t woff;	   /* bytes of hiredis's obuf already written (node_write) */
	struct list calls; /* sent here, oldest first (replies come in order) */
	uint32_t slots;	   /* owned, from the last CLUSTER SLOTS */
	double since;	   /* the connect started */
	double moved;	   /* the node last proved it takes or sends bytes (node_waited) */
	uint8_t wfull;	   /* the socket refused bytes: one it takes later was drained */
	double retry_at, backoff;
	int down_logged;
	uint64_t errors, failures;
	const char *why; /* the last failure */
	struct land land;
};

struct rcluster {
	struct remote *r;
	struct loop *l;
	double timeout, stall;
	struct rnode nodes[RN_MAX];
	uint32_t nnodes;
	uint8_t slot_node[CSLOT_COUNT]; /* node index + 1; 0: no owner known */
	uint8_t have_map;
	uint8_t refreshing;
	double refresh_at;
	struct remote_health h;
	uint8_t *rbuf;
	uint8_t no_land; /* $KVB_TEST_REMOTE_COPY=1: every value through hiredis (t_remote) */
};

/* ---- the loop adapter (hiredis's ev hooks) ---- */

static void ev_set(struct rnode *n, uint32_t bit, int on)
{
	uint32_t ev = on ? n->ev | bit : n->ev & ~bit;

	if (ev == n->ev || !n->ac)
		return;
	if (!n->ev)
		loop_add_events(n->rc->l, n->fd, &n->lfd, ev);
	else if (!ev)
		loop_del(n->rc->l, n->fd);
	else
		loop_mod(n->rc->l, n->fd, &n->lfd, ev);
	n->ev = ev;
}

static void ev_add_read(void *p)
{
	ev_set(p, EPOLLIN, 1);
}

static void ev_del_read(void *p)
{
	ev_set(p, EPOLLIN, 0);
}

static void ev_add_write(void *p)
{
	ev_set(p, EPOLLOUT, 1);
}

static void ev_del_write(void *p)
{
	ev_set(p, EPOLLOUT, 0);
}

static void ev_cleanup(void *p)
{
	struct rnode *n = p;

	if (n->ev)
		loop_del(n->rc->l, n->fd);
	n->ev = 0;
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv);
static void node_drop(struct rnode *n, const char *why);

/* Bytes to hiredis's reader, its replies dispatched. 0, or -1 when it failed the connection. */
static int feed(redisAsyncContext *ac, const void *p, size_t len)
{
	if (redisReaderFeed(ac->c.reader, p, len) != REDIS_OK) {
		redisAsyncHandleRead(ac); /* lets it fail the connection */
		return -1;
	}
	redisProcessCallbacks(ac);
	return 0;
}

/*
 * Whether the next reply on n is a fetch's that can land in place: hiredis's next callback is
 * that fetch, and its reader holds nothing (between two replies). The reader's fields are
 * hiredis 0.14's public read.h; ridx 0 with type -1 is the state it leaves once it looked
 * for a reply in an empty buffer.
 */
static struct remote_call *land_next(const struct rnode *n)
{
	const redisAsyncContext *ac = n->ac;
	const redisReader *rd = ac->c.reader;
	struct remote_call *c;

	if (n->rc->no_land || !ac->replies.head || ac->replies.head->fn != on_reply)
		return NULL;
	c = ac->replies.head->privdata;
	if (c->kind != RC_FETCH || !c->dst || c->landed || rd->pos != rd->len || rd->err ||
	    !(rd->ridx == -1 || (rd->ridx == 0 && rd->rstack[0].type == -1)))
		return NULL;
	return c;
}

static void land_start(struct land *ld, struct remote_call *c)
{
	memset(ld, 0, sizeof(*ld));
	ld->c = c;
	ld->want_len = (size_t)snprintf(ld->want, sizeof(ld->want), "$%llu\r\n",
					(unsigned long long)(c->page_bytes + sizeof(c->vhdr)));
}

/*
 * One read for the landing on n: the prefix and value header (exactly their bytes: nothing of
 * a following reply), then the page into its slot with the closing CRLF (readv). A reply of
 * another shape (nil, an error, a redirection, a value of another length) goes to hiredis
 * with what was read of it. Returns the read's result (> 0 bytes read, else as read(2)).
 */
static ssize_t land_read(struct rnode *n)
{
	struct land *ld = &n->land;
	struct remote_call *c = ld->c;
	redisAsyncContext *ac = n->ac;
	size_t plen = ld->want_len + sizeof(c->vhdr);
	ssize_t k;

	if (ld->pre_len < plen) {
		k = read(ac->c.fd, ld->pre + ld->pre_len, plen - ld->pre_len);
		if (k <= 0)
			return k;
		ld->pre_len += (size_t)k;
		if (memcmp(ld->pre, ld->want,
			   ld->pre_len < ld->want_len ? ld->pre_len : ld->want_len)) {
			ld->c = NULL; /* not a value of this page's length: hiredis parses it */
			return feed(ac, ld->pre, ld->pre_len) ? -2 : k;
		}
		/*
		 * The header first: one that does not name this page settles the call (a miss)
		 * and the page is read and dropped below (!c->dst), landing nowhere.
		 */
		if (ld->pre_len == plen) {
			memcpy(&c->vhdr, ld->pre + ld->want_len, sizeof(c->vhdr));
			remote_call_header(c);
		}
		return k;
	}
	if (!c->dst) {
		/* Settled meanwhile (deadline): the slot is gone; the rest is read and dropped. */
		size_t left = c->page_bytes - c->got + 2 - ld->tail_len;

		k = read(ac->c.fd, n->rc->rbuf, left < RBUF_BYTES ? left : RBUF_BYTES);
		if (k <= 0)
			return k;
		if ((size_t)k <= c->page_bytes - c->got) {
			c->got += (size_t)k;
		} else {
			ld->tail_len += (size_t)k - (c->page_bytes - c->got);
			c->got = c->page_bytes;
		}
		memcpy(ld->tail, "\r\n", 2);
	} else {
		/*
		 * At most LAND_PIECE of the page a read: what the tier then does with the piece
		 * (its crc, the GET's copy) finds it in the cache. The CRLF only with the last.
		 */
		size_t left = c->page_bytes - c->got;
		struct iovec iov[2] = {{c->dst + c->got, left < LAND_PIECE ? left : LAND_PIECE},
				       {ld->tail + ld->tail_len, 2 - ld->tail_len}};
		size_t body;

		k = readv(ac->c.fd, iov, left <= LAND_PIECE ? 2 : 1);
		if (k <= 0)
			return k;
		body = (size_t)k < iov[0].iov_len ? (size_t)k : iov[0].iov_len;
		if (body)
			remote_call_landed(c, body);
		ld->tail_len += (size_t)k - body;
	}
	if (ld->tail_len < 2)
		return k;
	ld->c = NULL;
	if (memcmp(ld->tail, "\r\n", 2)) {
		node_drop(n, "protocol error"); /* out of step with the stream: start again */
		return -2;
	}
	/* Done: a one-byte stand-in reply pops hiredis's callback for it, in order (on_reply). */
	c->landed = 1;
	return feed(ac, "+\r\n", 3) ? -2 : k;
}

/*
 * Readable: a fetch's value lands in place (land_read); anything else is read in whole chunks
 * into hiredis's reader and its replies dispatched; EOF and errors go to hiredis.
 */
static void node_read(struct rnode *n)
{
	redisAsyncContext *ac = n->ac;

	if (!(ac->c.flags & REDIS_CONNECTED)) {
		redisAsyncHandleRead(ac);
		return;
	}
	/* A fair share of the loop: READS_PER_EVENT whole chunks' worth of bytes, or of reads. */
	for (size_t i = 0, got = 0;
	     i < 8 * READS_PER_EVENT && got < READS_PER_EVENT * RBUF_BYTES && n->ac == ac; i++) {
		struct remote_call *c;
		ssize_t k;

		if (!n->land.c && (c = land_next(n)))
			land_start(&n->land, c);
		if (n->land.c) {
			k = land_read(n);
			if (k == -2)
				return; /* hiredis failed the connection */
		} else {
			k = read(ac->c.fd, n->rc->rbuf, RBUF_BYTES);
			if (k > 0 && feed(ac, n->rc->rbuf, (size_t)k))
				return;
			if (k > 0 && (size_t)k < RBUF_BYTES)
				return;
		}
		if (k > 0) {
			got += (size_t)k;
			n->moved = clock_now();
			continue;
		}
		if (k < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		redisAsyncHandleRead(ac); /* EOF or an error: hiredis tears it down */
		return;
	}
}

/*
 * Writable: hiredis's own write (redisBufferWrite) moves what is left of its buffer to the
 * front after every partial write, so a few 4 MiB SETs queued behind a socket that takes a
 * few hundred KiB at a time moved hundreds of MiB and held the loop (and the replies) for
 * many milliseconds. Here an offset advances instead, and the buffer is dropped once all of it
 * is written: every byte is touched once.
 */
static void node_write(struct rnode *n)
{
	redisAsyncContext *ac = n->ac;
	redisContext *c = &ac->c;

	if (!(c->flags & REDIS_CONNECTED)) {
		redisAsyncHandleWrite(ac); /* completes the connect, then writes as hiredis does */
		return;
	}
	while (n->woff < sdslen(c->obuf)) {
		ssize_t k = write(c->fd, c->obuf + n->woff, sdslen(c->obuf) - n->woff);

		if (k > 0) {
			n->woff += (size_t)k;
			if (n->wfull)
				n->moved = clock_now(); /* the peer acknowledged what filled it */
			n->wfull = 0;
			continue;
		}
		if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
			n->wfull = errno == EAGAIN;
			return;
		}
		/* An error: hiredis sees it with what is left, and tears the connection down. */
		sdsrange(c->obuf, (int)n->woff, -1);
		n->woff = 0;
		redisAsyncHandleWrite(ac);
		return;
	}
	/* Kept for the next request (a page-sized buffer freed each time is an mmap), unless big. */
	if (sdsAllocSize(c->obuf) > OBUF_KEEP) {
		sdsfree(c->obuf);
		c->obuf = sdsempty();
	} else {
		sdsclear(c->obuf);
	}
	n->woff = 0;
	ev_del_write(n);
}

static void on_node_fd(void *arg)
{
	struct rnode *n = arg;
	uint32_t rev = n->rc->l->revents;

	if (n->ac && (rev & (EPOLLIN | EPOLLHUP | EPOLLERR)))
		node_read(n);
	if (n->ac && (rev & EPOLLOUT))
		node_write(n);
}

/* ---- node states ---- */

static const char *node_name(const struct rnode *n)
{
	static char buf[CSLOT_HOST_MAX + 8];

	snprintf(buf, sizeof(buf), "%s:%u", n->host, n->port);
	return buf;
}

static void node_failed(struct rnode *n, const char *why)
{
	struct rcluster *rc = n->rc;

	n->state = RN_DOWN;
	n->failures++;
	n->why = why;
	n->backoff = n->backoff ? n->backoff * 2 : BACKOFF_FIRST;
	if (n->backoff > BACKOFF_MAX)
		n->backoff = BACKOFF_MAX;
	n->retry_at = clock_now() + n->backoff;
	rc->h.backoffs++;
	if (!n->down_logged) {
		log_warn("remote: node %s unreachable (%s): its slots are misses, retried with "
			 "back-off up to %.0f s",
			 node_name(n), why, BACKOFF_MAX);
		n->down_logged = 1;
	}
}

/* Fails n and every request on it (their callbacks run now: misses); retried after back-off. */
static void node_drop(struct rnode *n, const char *why)
{
	node_failed(n, why);
	redisAsyncFree(n->ac);
	n->ac = NULL;
}

/* A reply came: the node works. */
static void node_ok(struct rnode *n)
{
	if (n->down_logged) {
		log_info("remote: node %s is back after %llu failed attempt(s)", node_name(n),
			 (unsigned long long)n->failures);
		n->rc->h.recoveries++;
		n->down_logged = 0;
	}
	n->backoff = 0;
	n->failures = 0;
	if (n->ac && n->state != RN_UP) {
		log_debug("remote: node %s up", node_name(n));
		n->state = RN_UP;
	}
}

static void on_ping(redisAsyncContext *ac, void *reply, void *priv)
{
	(void)priv;
	if (reply)
		node_ok(ac->data);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
	struct rnode *n = ac->data;

	log_debug("remote: node %s connect: %d", node_name(n), status);
	if (status == REDIS_OK) {
		/* UP only once something answers: a stopped server's kernel still accepts. */
		/* Keep the reader's buffer: a page-sized one freed after every reply is an mmap. */
		ac->c.reader->maxbuf = 0;
		return;
	}
	n->ac = NULL; /* hiredis frees it after this callback (ev_cleanup unregisters) */
	node_failed(n, "connect failed");
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
	struct rnode *n = ac->data;

	(void)status;
	n->ac = NULL;
	if (n->state != RN_DOWN)
		node_failed(n, ac->err ? "connection lost" : "disconnected");
}

static void refresh_send(struct rcluster *rc, struct rnode *n);

static int node_connect(struct rnode *n)
{
	redisAsyncContext *ac = redisAsyncConnect(n->host, n->port);

	if (!ac || ac->err) {
		if (ac)
			redisAsyncFree(ac);
		node_failed(n, "connect refused");
		return -EHOSTUNREACH;
	}
	ac->data = n;
	ac->ev.data = n;
	ac->ev.addRead = ev_add_read;
	ac->ev.delRead = ev_del_read;
	ac->ev.addWrite = ev_add_write;
	ac->ev.delWrite = ev_del_write;
	ac->ev.cleanup = ev_cleanup;
	n->ac = ac;
	n->fd = ac->c.fd;
	n->ev = 0;
	n->woff = 0;
	n->wfull = 0;
	n->moved = 0;
	n->land.c = NULL;
	n->lfd = (struct loop_fd){.fn = on_node_fd, .arg = n};
	redisAsyncSetConnectCallback(ac, on_connect);
	redisAsyncSetDisconnectCallback(ac, on_disconnect);
	n->state = RN_CONNECTING;
	n->since = clock_now();
	log_debug("remote: connecting to %s", node_name(n));
	ev_add_read(n);
	/*
	 * The first command arms the write event that completes the connect: always one, even
	 * when a refresh is already in flight elsewhere (else the connect would never finish).
	 */
	redisAsyncCommand(ac, on_ping, NULL, "PING");
	if (!n->rc->have_map || n->rc->refresh_at <= n->since)
		refresh_send(n->rc, n);
	return 0;
}

/* The node at host:port, added (and connected) when new; NULL when the table is full. */
static struct rnode *node_get(struct rcluster *rc, const char *host, uint16_t port, int connect)
{
	struct rnode *n;

	for (uint32_t i = 0; i < rc->nnodes; i++)
		if (rc->nodes[i].port == port && !strcmp(rc->nodes[i].host, host))
			return &rc->nodes[i];
	if (rc->nnodes == RN_MAX)
		return NULL;
	n = &rc->nodes[rc->nnodes++];
	memset(n, 0, sizeof(*n));
	n->rc = rc;
	snprintf(n->host, sizeof(n->host), "%s", host);
	n->port = port;
	list_init(&n->calls);
	if (connect)
		node_connect(n);
	return n;
}

/* ---- the slot map ---- */

static void on_range(void *arg, uint16_t first, uint16_t last, const char *host, uint16_t port)
{
	struct rnode *from = arg;
	struct rcluster *rc = from->rc;
	struct rnode *n = node_get(rc, host[0] ? host : from->host, port, 0);

	if (!n)
		return;
	for (uint32_t s = first; s <= last; s++)
		rc->slot_node[s] = (uint8_t)(n - rc->nodes + 1);
}

static void map_recount(struct rcluster *rc)
{
	for (uint32_t i = 0; i < rc->nnodes; i++)
		rc->nodes[i].slots = 0;
	for (uint32_t s = 0; s < CSLOT_COUNT; s++)
		if (rc->slot_node[s])
			rc->nodes[rc->slot_node[s] - 1].slots++;
}

static int map_covered(const struct rcluster *rc)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < rc->nnodes; i++)
		n += rc->nodes[i].slots;
	return n == CSLOT_COUNT;
}

static void on_slots(redisAsyncContext *ac, void *reply, void *priv)
{
	struct rnode *n = ac->data;
	struct rcluster *rc = priv;
	const redisReply *r = reply;
	int got;

	rc->refreshing = 0;
	if (!r)
		return;
	node_ok(n);
	if (r->type == REDIS_REPLY_ERROR && strstr(r->str, "cluster support disabled")) {
		/* A plain Redis: it owns every slot. */
		memset(rc->slot_node, (int)(n - rc->nodes + 1), sizeof(rc->slot_node));
		got = 1;
	} else {
		memset(rc->slot_node, 0, sizeof(rc->slot_node));
		got = cslot_walk_slots(r, on_range, n);
		if (got < 0)
			log_warn("remote: node %s: CLUSTER SLOTS reply malformed", node_name(n));
	}
	map_recount(rc);
	rc->have_map = got > 0;
	rc->h.refreshes++;
	/*
	 * A node that just joined may not know every owner yet (gossip): a map with holes is
	 * asked again soon, not in REFRESH_EVERY.
	 */
	rc->refresh_at = clock_now() + (map_covered(rc) ? REFRESH_EVERY : REFRESH_GAP);
	/* Nodes that own slots and are not connected yet start connecting now. */
	for (uint32_t i = 0; i < rc->nnodes; i++)
		if (rc->nodes[i].slots && !rc->nodes[i].ac && rc->nodes[i].state == RN_DOWN &&
		    clock_now() >= rc->nodes[i].retry_at)
			node_connect(&rc->nodes[i]);
}

static void refresh_send(struct rcluster *rc, struct rnode *n)
{
	if (!n->ac || rc->refreshing)
		return;
	if (redisAsyncCommand(n->ac, on_slots, rc, "CLUSTER SLOTS") == REDIS_OK)
		rc->refreshing = 1;
}

/* ---- requests ---- */

/*
 * A node gets requests once it answered, or while it connects for the first time (hiredis
 * queues them): one that failed before is not trusted again until it replied.
 */
static int usable(const struct rnode *n)
{
	return n && n->ac && (n->state == RN_UP || (n->state == RN_CONNECTING && !n->failures));
}

static int send_on(struct rnode *n, struct remote_call *c, int asking)
{
	if (!usable(n))
		return -EHOSTUNREACH;
	if (asking && redisAsyncCommand(n->ac, NULL, NULL, "ASKING") != REDIS_OK)
		return -EIO;
	if (redisAsyncFormattedCommand(n->ac, on_reply, c, c->cmd, c->cmdlen) != REDIS_OK)
		return -EIO;
	c->sent = clock_now();
	list_add_tail(&n->calls, &c->blink);
	return 0;
}

static struct rnode *node_of(struct rcluster *rc, const struct remote_call *c)
{
	uint8_t i = rc->slot_node[cslot_of(c->key, c->klen)];

	return i ? &rc->nodes[i - 1] : NULL;
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv)
{
	struct rnode *n = ac->data;
	struct rcluster *rc = n->rc;
	struct remote_call *c = priv;
	const redisReply *r = reply;
	struct cslot_redirect rd;

	list_del(&c->blink);
	if (!r) {
		n->errors++;
		remote_call_done(c, -ECONNRESET, NULL, 0);
		return;
	}
	node_ok(n);
	if (c->landed) {
		/* The stand-in for a value that landed in the slot (land_read). */
		remote_call_done(c, 1, NULL, sizeof(c->vhdr) + c->page_bytes);
		return;
	}
	switch (r->type) {
	case REDIS_REPLY_STRING:
		remote_call_done(c, 1, r->str, r->len);
		return;
	case REDIS_REPLY_NIL:
		remote_call_done(c, 0, NULL, 0);
		return;
	case REDIS_REPLY_INTEGER:
		remote_call_done(c, r->integer > 0, NULL, 0);
		return;
	case REDIS_REPLY_STATUS:
		remote_call_done(c, 1, NULL, 0);
		return;
	case REDIS_REPLY_ERROR:
		break;
	default:
		remote_call_done(c, -EPROTO, NULL, 0);
		return;
	}
	if (!cslot_parse_redirect(r->str, r->len, &rd) && c->redirects < MAX_REDIRECTS) {
		struct rnode *to = node_get(rc, rd.host[0] ? rd.host : n->host, rd.port, 1);

		rc->h.redirects++;
		c->redirects++;
		if (to && !rd.ask) {
			rc->slot_node[rd.slot] = (uint8_t)(to - rc->nodes + 1);
			/* The map is stale: ask again soon, not for every key that moved. */
			if (rc->refresh_at > clock_now() + REFRESH_GAP)
				rc->refresh_at = clock_now() + REFRESH_GAP;
		}
		if (to && c->cmd && !send_on(to, c, rd.ask))
			return;
		if (to && c->kind == RC_PUBLISH && !c->cmd) {
			/* No copy of the value kept: the tier sends it once more, to there. */
			c->route = (uint32_t)(to - rc->nodes + 1) | (rd.ask ? ROUTE_ASK : 0);
			remote_call_done(c, REMOTE_REDIRECTED, NULL, 0);
			return;
		}
		remote_call_done(c, c->cmd ? -EHOSTUNREACH : -EAGAIN, NULL, 0);
		return;
	}
	n->errors++;
	rc->h.errors++;
	/* CLUSTERDOWN, TRYAGAIN, OOM...: this key misses now. */
	remote_call_done(c, !strncmp(r->str, "OOM", 3) ? -ENOSPC : -EAGAIN, NULL, 0);
}

/* RESP: "*argc\r\n" then "$len\r\n<bytes>\r\n" per argument. */
static char *resp_put(char *p, const void *a, size_t alen)
{
	p += sprintf(p, "$%zu\r\n", alen);
	memcpy(p, a, alen);
	memcpy(p + alen, "\r\n", 2);
	return p + alen + 2;
}

/*
 * verb and c's key into c->cmd; with vlen, the head of "verb key <value> NX" up to the value's
 * bytes (rc_publish adds them).
 */
static int format_cmd(struct remote_call *c, const char *verb, size_t vlen)
{
	char *p = malloc(96 + c->klen);

	if (!p)
		return -ENOMEM;
	c->cmd = p;
	p += sprintf(p, "*%d\r\n", vlen ? 4 : 2);
	p = resp_put(p, verb, strlen(verb));
	p = resp_put(p, c->key, c->klen);
	if (vlen)
		p += sprintf(p, "$%zu\r\n", vlen);
	c->cmdlen = (size_t)(p - c->cmd);
	return 0;
}

static int submit(void *be, struct remote_call *c, const char *verb)
{
	struct rcluster *rc = be;
	struct rnode *n = node_of(rc, c);
	int err;

	if (!usable(n))
		return -EHOSTUNREACH;
	err = format_cmd(c, verb, 0);
	if (!err)
		err = send_on(n, c, 0);
	return err;
}

static int rc_lookup(void *be, struct remote_call *c)
{
	return submit(be, c, "EXISTS");
}

static int rc_fetch(void *be, struct remote_call *c)
{
	return submit(be, c, "GET");
}

/*
 * SET key <hdr + page> NX, the page copied once, straight into hiredis's output buffer (no
 * request of our own in between): room for all of it is made first, so nothing fails half-way
 * through the command. No copy of the request is kept, so a publish redirected (MOVED, ASK:
 * the slot moved or is moving) is done with REMOTE_REDIRECTED and c->route, the node it was
 * sent to; the tier then publishes the page once more with that route (c->resend), which goes
 * there (after ASKING for an ASK) whatever the slot map says.
 */
static int rc_publish(void *be, struct remote_call *c, const struct remote_hdr *h, const void *page,
		      size_t len)
{
	static const char tail[] = "\r\n$2\r\nNX\r\n";
	struct rcluster *rc = be;
	struct rnode *n = node_of(rc, c);
	uint32_t to = c->route & (ROUTE_ASK - 1);
	int ask = c->resend && (c->route & ROUTE_ASK);
	redisContext *ctx;
	sds ob;
	int err;

	if (c->resend && to >= 1 && to <= rc->nnodes)
		n = &rc->nodes[to - 1];
	if (!usable(n))
		return -EHOSTUNREACH;
	err = format_cmd(c, "SET", sizeof(*h) + len);
	if (err)
		return err;
	ctx = &n->ac->c;
	/* 32: an ASKING before it ("*1\r\n$6\r\nASKING\r\n") */
	ob = sdsMakeRoomFor(ctx->obuf, 32 + c->cmdlen + sizeof(*h) + len + sizeof(tail) - 1);
	if (!ob)
		return -ENOMEM;
	ctx->obuf = ob;
	err = send_on(n, c, ask); /* the head; the rest fits the room made */
	if (err)
		return err;
	ob = sdscatlen(ctx->obuf, h, sizeof(*h));
	ob = sdscatlen(ob, page, len);
	ctx->obuf = sdscatlen(ob, tail, sizeof(tail) - 1);
	free(c->cmd);
	c->cmd = NULL;
	return 0;
}

/* ---- upkeep ---- */

/*
 * Since when n's oldest request has waited with no sign of life: its sending, or the last
 * bytes read, or the last write into a socket that had been full (the peer drained it),
 * whichever came later. Requests queued behind a few hundred MiB of publishes wait long for
 * their replies while the node works; a stopped or partitioned node sends nothing and drains
 * nothing (writes into a socket with room prove nothing: the kernel takes them either way).
 */
static double node_waited(const struct rnode *n)
{
	double sent = list_entry(n->calls.next, struct remote_call, blink)->sent;

	return sent > n->moved ? sent : n->moved;
}

static uint32_t rc_poll(void *be, double now)
{
	struct rcluster *rc = be;
	uint32_t work = 0;
	int asked = 0;

	for (uint32_t i = 0; i < rc->nnodes; i++) {
		struct rnode *n = &rc->nodes[i];

		if (n->ac) {
			const char *why = NULL;

			if (n->state == RN_CONNECTING && now - n->since > rc->stall)
				why = "connect timed out";
			else if (!list_empty(&n->calls) && now - node_waited(n) > rc->stall)
				why = "requests unanswered (stopped or partitioned)";
			if (why) {
				node_drop(n, why);
				work++;
			}
			continue;
		}
		/* Nodes that own slots (or seeds, while no map is known) come back after back-off. */
		if ((n->slots || (n->seed && !rc->have_map)) && now >= n->retry_at) {
			node_connect(n);
			work++;
		}
	}
	if (now >= rc->refresh_at && !rc->refreshing) {
		for (uint32_t i = 0; i < rc->nnodes && !asked; i++) {
			struct rnode *n = &rc->nodes[i];

			if (n->ac && n->state == RN_UP) {
				refresh_send(rc, n);
				asked = 1;
			}
		}
		if (asked)
			rc->refresh_at = now + REFRESH_EVERY;
	}
	return work;
}

static void rc_health(void *be, struct remote_health *h)
{
	struct rcluster *rc = be;

	*h = rc->h;
	h->shards = h->reachable = 0;
	for (uint32_t i = 0; i < rc->nnodes; i++) {
		if (!rc->nodes[i].slots)
			continue;
		h->shards++;
		h->reachable += rc->nodes[i].state == RN_UP && rc->nodes[i].ac;
	}
}

static void rc_json(void *be, cJSON *o)
{
	struct rcluster *rc = be;
	cJSON *a = cJSON_AddArrayToObject(o, "nodes");

	for (uint32_t i = 0; i < rc->nnodes; i++) {
		const struct rnode *n = &rc->nodes[i];
		cJSON *e = cJSON_CreateObject();
		static const char *st[] = {"down", "connecting", "up"};

		cJSON_AddStringToObject(e, "addr", node_name(n));
		cJSON_AddStringToObject(e, "state", st[n->state]);
		cJSON_AddNumberToObject(e, "slots", n->slots);
		cJSON_AddNumberToObject(e, "errors", (double)n->errors);
		cJSON_AddNumberToObject(e, "backoff_s", n->state == RN_DOWN ? n->backoff : 0);
		if (n->why)
			cJSON_AddStringToObject(e, "last_failure", n->why);
		cJSON_AddItemToArray(a, e);
	}
}

/* ---- life ---- */

/* "host:port" (an address or a name resolved now, once) into a seed node. */
static int add_seed(struct rcluster *rc, const char *s, size_t len)
{
	char item[CSLOT_HOST_MAX + 16], addr[INET6_ADDRSTRLEN];
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
	char *colon;
	unsigned long port;
	struct rnode *n;

	if (len >= 8 && !memcmp(s, "redis://", 8)) {
		s += 8;
		len -= 8;
	}
	if (!len || len >= sizeof(item))
		return -EINVAL;
	memcpy(item, s, len);
	item[len] = 0;
	colon = strrchr(item, ':');
	if (!colon || !colon[1])
		return -EINVAL;
	*colon = 0;
	port = strtoul(colon + 1, NULL, 10);
	if (!port || port > 65535 || !item[0])
		return -EINVAL;
	if (getaddrinfo(item, NULL, &hints, &ai) || !ai)
		return -EHOSTUNREACH;
	if (ai->ai_family == AF_INET)
		inet_ntop(AF_INET, &((struct sockaddr_in *)(void *)ai->ai_addr)->sin_addr, addr,
			  sizeof(addr));
	else
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)(void *)ai->ai_addr)->sin6_addr, addr,
			  sizeof(addr));
	freeaddrinfo(ai);
	n = node_get(rc, addr, (uint16_t)port, 0);
	if (!n)
		return -E2BIG;
	n->seed = 1;
	return 0;
}

static int rc_open(struct remote *r, const struct remote_cfg *cfg, struct loop *l, void **be)
{
	struct rcluster *rc = calloc(1, sizeof(*rc));
	const char *s = cfg->url;
	int err = 0;

	if (!rc)
		return -ENOMEM;
	rc->r = r;
	rc->l = l;
	rc->timeout = cfg->timeout;
	rc->stall = 4 * cfg->timeout > STALL_MIN ? 4 * cfg->timeout : STALL_MIN;
	rc->no_land = getenv("KVB_TEST_REMOTE_COPY") &&
		      !strcmp(getenv("KVB_TEST_REMOTE_COPY"), "1");
	rc->rbuf = malloc(RBUF_BYTES);
	if (!rc->rbuf) {
		free(rc);
		return -ENOMEM;
	}
	while (*s && !err) {
		size_t len = strcspn(s, ",");

		err = add_seed(rc, s, len);
		s += len + (s[len] == ',');
	}
	if (!err && !rc->nnodes)
		err = -EINVAL;
	if (err) {
		free(rc->rbuf);
		free(rc);
		return err;
	}
	/* Every seed is connected; the first to answer CLUSTER SLOTS gives the map. */
	for (uint32_t i = 0; i < rc->nnodes; i++)
		node_connect(&rc->nodes[i]);
	*be = rc;
	return 0;
}

static void rc_close(void *be)
{
	struct rcluster *rc = be;

	for (uint32_t i = 0; i < rc->nnodes; i++) {
		struct rnode *n = &rc->nodes[i];

		if (n->ac) {
			n->state = RN_DOWN;
			redisAsyncFree(n->ac); /* callbacks run with no reply: done, cancelled */
			n->ac = NULL;
		}
	}
	free(rc->rbuf);
	free(rc);
}

const struct remote_backend remote_redis_backend = {
	.name = "redis-cluster",
	.open = rc_open,
	.close = rc_close,
	.lookup = rc_lookup,
	.fetch = rc_fetch,
	.publish = rc_publish,
	.health = rc_health,
	.poll = rc_poll,
	.json = rc_json,
};
