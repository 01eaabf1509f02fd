// SPDX-License-Identifier: MIT
/*
 * t_fdstore.c - the RAM pool survives a SIGKILL of the broker in systemd's fd store (the pool
 * kept across restarts; broker/sdnotify.c, main.c [fdstore]).
 *
 * There is no systemd here, so the test plays its side of the protocol (sd_notify(3),
 * systemd.io/FILE_DESCRIPTOR_STORE): a datagram unix socket with SO_PASSCRED as NOTIFY_SOCKET
 * (a path, and an abstract '@' name), a thread that receives every notification with its fds
 * and the sender's credentials, and a store of named fds that FDSTORE=1 adds to (duplicates by
 * inode dropped) and FDSTOREREMOVE=1 removes from, by FDNAME; a message from any pid but the
 * broker's is a failure (NotifyAccess=main). A start passes the store back the way systemd
 * does: in the forked child, the fds dup2'd to 3.., LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID
 * (the child's own pid), then exec. Checked:
 *   - a cold start under a manager with $FDSTORE sends READY=1 + STATUS= and stores the side
 *     table and every arena by name; no keeper process is spawned (no <socket>.keep);
 *   - kill -9 under load from 4 processes, restart with the stored fds: every page committed
 *     before the kill is served byte-exact, the one in flight byte-exact or not at all, no
 *     keeper, and the store is unchanged (every other broker copies on worker threads, which
 *     compute the pages' crc32c themselves: copy.h [crc-worker]);
 *   - a clean stop sends STOPPING=1 and FDSTOREREMOVE=1 for every fd: the store is empty;
 *   - hostile or mismatched LISTEN_* (name count, a name twice, a foreign "kvbpool-" name, the
 *     side table and an arena swapped, another process's LISTEN_PID): a clear log line, a cold
 *     start (the page put before the kill is gone), and a new pool in the store;
 *   - $NOTIFY_SOCKET without $FDSTORE (no FileDescriptorStoreMax=): a keeper keeps the pool.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "reliab.h"

#define PAGE (64u * 1024)
#define NCLI 4
#define PER_CLI 100
#define MAXST 256
#define MAXEV 512

/* ---- the service manager's side ---- */

struct stored {
	char name[256];
	int fd;
};

struct event {
	pid_t pid;
	char text[300];
	int nfds;
};

static struct mgr {
	pthread_mutex_t mu;
	pthread_t th;
	int sock[2]; /* a path, an abstract name */
	char addr[2][108];
	struct stored st[MAXST];
	int nst;
	struct event ev[MAXEV];
	int nev;
	int stop;
} M = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The value of KEY= in a notification, or NULL. */
static const char *field(const char *text, const char *key, char *out, size_t len)
{
	size_t kl = strlen(key);

	for (const char *p = text; p && *p;) {
		const char *e = strchr(p, '\n');
		size_t l = e ? (size_t)(e - p) : strlen(p);

		if (l > kl && !memcmp(p, key, kl) && p[kl] == '=') {
			snprintf(out, len, "%.*s", (int)(l - kl - 1), p + kl + 1);
			return out;
		}
		p = e ? e + 1 : NULL;
	}
	return NULL;
}

static int same_file(int a, int b)
{
	struct stat x, y;

	return fstat(a, &x) == 0 && fstat(b, &y) == 0 && x.st_dev == y.st_dev &&
	       x.st_ino == y.st_ino;
}

/* What systemd does with one message (under M.mu). */
static void mgr_apply(const char *text, int *fds, int n, pid_t pid)
{
	char name[256], v[16];
	struct event *e = &M.ev[M.nev < MAXEV ? M.nev++ : MAXEV - 1];

	e->pid = pid;
	e->nfds = n;
	{
		size_t l = strnlen(text, sizeof(e->text) - 1);

		memcpy(e->text, text, l);
		e->text[l] = 0;
	}
	if (!field(text, "FDNAME", name, sizeof(name)))
		snprintf(name, sizeof(name), "stored");
	if (field(text, "FDSTORE", v, sizeof(v)) && !strcmp(v, "1")) {
		for (int i = 0; i < n; i++) {
			int dup = 0;

			for (int j = 0; j < M.nst && !dup; j++)
				dup = same_file(M.st[j].fd, fds[i]);
			if (dup || M.nst == MAXST) {
				close(fds[i]);
				continue;
			}
			snprintf(M.st[M.nst].name, sizeof(M.st[0].name), "%s", name);
			M.st[M.nst++].fd = fds[i];
		}
		return;
	}
	for (int i = 0; i < n; i++)
		close(fds[i]); /* fds without FDSTORE=1 are closed */
	if (field(text, "FDSTOREREMOVE", v, sizeof(v)) && !strcmp(v, "1"))
		for (int j = 0; j < M.nst;) {
			if (strcmp(M.st[j].name, name)) {
				j++;
				continue;
			}
			close(M.st[j].fd);
			M.st[j] = M.st[--M.nst];
		}
}

static void mgr_recv(int s)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * 200) + CMSG_SPACE(sizeof(struct ucred))];
		struct cmsghdr align;
	} cm;
	char text[4096];
	struct iovec iov = {text, sizeof(text) - 1};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cm.b,
			    .msg_controllen = sizeof(cm)};
	int fds[200], n = 0;
	pid_t pid = 0;
	ssize_t r = recvmsg(s, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);

	if (r < 0)
		return;
	text[r] = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

			for (size_t i = 0; i < k && n < 200; i++)
				memcpy(&fds[n++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
		} else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
			struct ucred uc;

			memcpy(&uc, CMSG_DATA(c), sizeof(uc));
			pid = uc.pid;
		}
	}
	pthread_mutex_lock(&M.mu);
	mgr_apply(text, fds, n, pid);
	pthread_mutex_unlock(&M.mu);
}

/* The manager's loop: notifications are taken at once, as systemd's queue is short (10). */
static void *mgr_thread(void *arg)
{
	(void)arg;
	while (!__atomic_load_n(&M.stop, __ATOMIC_RELAXED)) {
		struct pollfd p[2] = {{M.sock[0], POLLIN, 0}, {M.sock[1], POLLIN, 0}};

		if (poll(p, 2, 20) <= 0)
			continue;
		for (int i = 0; i < 2; i++)
			if (p[i].revents & POLLIN)
				mgr_recv(M.sock[i]);
	}
	return NULL;
}

static void mgr_open(const char *dir)
{
	for (int i = 0; i < 2; i++) {
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		socklen_t len;
		int one = 1;

		M.sock[i] = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		CHECK(M.sock[i] >= 0);
		CHECK_OK(setsockopt(M.sock[i], SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)));
		if (i == 0) {
			snprintf(M.addr[0], sizeof(M.addr[0]), "%s/notify", dir);
			snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", M.addr[0]);
			len = sizeof(sa);
		} else {
			snprintf(M.addr[1], sizeof(M.addr[1]), "@kvbt-fdstore-%d", (int)getpid());
			memcpy(sa.sun_path + 1, M.addr[1] + 1, strlen(M.addr[1]) - 1);
			len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
					  strlen(M.addr[1]));
		}
		CHECKF(bind(M.sock[i], (struct sockaddr *)&sa, len) == 0, "bind %s: %s", M.addr[i],
		       strerror(errno));
	}
	CHECK_OK(pthread_create(&M.th, NULL, mgr_thread, NULL));
}

static void mgr_close(void)
{
	__atomic_store_n(&M.stop, 1, __ATOMIC_RELAXED);
	pthread_join(M.th, NULL);
	for (int i = 0; i < 2; i++)
		close(M.sock[i]);
	unlink(M.addr[0]);
	for (int j = 0; j < M.nst; j++)
		close(M.st[j].fd);
	M.nst = 0;
}

/* Index of the first event at or after from whose text has what, waiting up to ms; -1. */
static int ev_wait(int from, const char *what, int ms)
{
	uint64_t end = harness_now_ms() + (uint64_t)ms;

	for (;;) {
		int hit = -1;

		pthread_mutex_lock(&M.mu);
		for (int i = from; i < M.nev && hit < 0; i++)
			if (strstr(M.ev[i].text, what))
				hit = i;
		pthread_mutex_unlock(&M.mu);
		if (hit >= 0 || harness_now_ms() >= end)
			return hit;
		rel_sleep_ms(5);
	}
}

static int ev_count(void)
{
	int n;

	pthread_mutex_lock(&M.mu);
	n = M.nev;
	pthread_mutex_unlock(&M.mu);
	return n;
}

/* NotifyAccess=main: every message from event from on came from pid. */
static void ev_check_pid(int from, pid_t pid)
{
	pthread_mutex_lock(&M.mu);
	for (int i = from; i < M.nev; i++)
		CHECKF(M.ev[i].pid == pid, "notification \"%s\" from pid %d, the broker is %d",
		       M.ev[i].text, (int)M.ev[i].pid, (int)pid);
	pthread_mutex_unlock(&M.mu);
}

/* The pool's fds in the store (the sessions' records, "kvbsess-*", are not counted). */
static int store_count(void)
{
	int n = 0;

	pthread_mutex_lock(&M.mu);
	for (int i = 0; i < M.nst; i++)
		n += strncmp(M.st[i].name, "kvbsess-", 8) != 0;
	pthread_mutex_unlock(&M.mu);
	return n;
}

/* ---- starting a broker the way systemd does ---- */

enum hostile { H_NONE, H_COUNT, H_TWICE, H_FOREIGN, H_SWAP, H_PID };

static struct start {
	int pass;	  /* pass the store as LISTEN_FDS */
	int fdstore;	  /* set $FDSTORE */
	int abstract;	  /* NOTIFY_SOCKET is the '@' name */
	enum hostile bad; /* what to get wrong */
	int workers;	  /* copies on worker threads (their crc32c too: copy.h [crc-worker]) */
	int fds[MAXST];	  /* the store, ordered as passed */
	int n;
	char names[MAXST * 40];
} S;

/* In the broker's child: only async-signal-safe calls (the manager thread may hold locks). */
static void preexec(void *arg)
{
	int tmp[MAXST];
	pid_t pid = getpid();
	char digits[16], *pv = getenv("LISTEN_PID"); /* getenv only reads environ */
	int nd = 0;

	(void)arg;
	for (int i = 0; i < S.n; i++) /* above every target, so that no dup2 closes a source */
		tmp[i] = fcntl(S.fds[i], F_DUPFD_CLOEXEC, 200);
	for (int i = 0; i < S.n; i++)
		if (tmp[i] < 0 || dup2(tmp[i], 3 + i) < 0)
			_exit(126);
	if (!pv)
		return;
	if (S.bad == H_PID)
		pid = 1;
	do
		digits[nd++] = (char)('0' + pid % 10);
	while ((pid /= 10) && nd < 15);
	for (int i = 0; i < nd; i++) /* the parent's placeholder is 15 digits long */
		pv[i] = digits[nd - 1 - i];
	pv[nd] = 0;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(((const struct stored *)a)->name, ((const struct stored *)b)->name);
}

/* Starts a broker on sock as systemd would, per S (the store passed back when S.pass). */
static struct harness_broker *sd_start(const char *sock)
{
	const char *args[] = {"--socket", sock, "--pool", "64M", "--slab", "8M", NULL, NULL, NULL};
	const char *const *argp = *sock ? args : args + 2; /* "": a new socket */
	struct stored st[MAXST];
	struct harness_broker *b;
	char num[16];
	size_t off = 0;

	if (S.workers) {
		args[6] = "--copy-inline";
		args[7] = "0";
	}
	setenv("NOTIFY_SOCKET", M.addr[S.abstract], 1);
	if (S.fdstore)
		setenv("FDSTORE", "4096", 1); /* the unit's FileDescriptorStoreMax= */
	else
		unsetenv("FDSTORE");
	S.n = 0;
	S.names[0] = 0;
	if (S.pass) {
		pthread_mutex_lock(&M.mu);
		memcpy(st, M.st, sizeof(st));
		S.n = M.nst;
		pthread_mutex_unlock(&M.mu);
		/* Another order than the broker stored them in (the side table last): names,
		 * not positions, count. */
		qsort(st, (size_t)S.n, sizeof(st[0]), name_cmp);
		if (S.bad == H_SWAP && S.n >= 2) { /* the side table's name and arena 0's */
			char t[sizeof(st[0].name)];

			memcpy(t, st[S.n - 1].name, sizeof(t));
			memcpy(st[S.n - 1].name, st[0].name, sizeof(t));
			memcpy(st[0].name, t, sizeof(t));
		}
		for (int j = 0; j < S.n; j++) {
			const char *nm = st[j].name;

			S.fds[j] = st[j].fd;
			if (S.bad == H_TWICE)
				nm = "kvbpool-meta";
			if (S.bad == H_FOREIGN && j == 0)
				nm = "kvbpool-arena-../../etc";
			if (S.bad == H_COUNT && j == S.n - 1)
				break;
			off += (size_t)snprintf(S.names + off, sizeof(S.names) - off, "%s%s",
						j ? ":" : "", nm);
		}
		snprintf(num, sizeof(num), "%d", S.n);
		setenv("LISTEN_FDS", num, 1);
		setenv("LISTEN_FDNAMES", S.names, 1);
		setenv("LISTEN_PID", "000000000000000", 1); /* the child writes its pid here */
	}
	harness_broker_preexec = preexec;
	b = harness_broker_startv(argp);
	harness_broker_preexec = NULL;
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	unsetenv("NOTIFY_SOCKET");
	unsetenv("FDSTORE");
	return b;
}

/* ---- load and checks ---- */

struct shared {
	char sock[108];
	_Atomic uint32_t done[NCLI]; /* PUTs returned: keys [0, done) are committed */
	_Atomic uint32_t total;
	_Atomic uint32_t ready;
	_Atomic int stop;
	uint64_t seed;
};

static struct shared *sh;

static void layout(struct kvb_layout *l)
{
	harness_layout(l, "fdstore", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
}

static int loader(int idx, void *arg)
{
	struct kvb_opts o = {.socket_path = sh->sock, .flags = KVB_CONNECT_NO_RECONNECT};
	uint8_t *page = malloc(PAGE);
	struct kvb_layout l;
	kvb_client *c;
	uint32_t ns;

	(void)arg;
	layout(&l);
	if (!page || kvb_connect(&o, &c) || kvb_ns_open(c, &l, &ns, NULL)) {
		free(page);
		return 1;
	}
	sh->ready++;
	while (sh->ready < NCLI && !sh->stop)
		rel_sleep_ms(1);
	for (uint32_t i = 0; i < PER_CLI && !sh->stop; i++) {
		kvb_key k = harness_key(sh->seed + (uint64_t)idx, i);

		harness_fill(page, PAGE, &k, sh->seed);
		if (kvb_put(c, ns, k, page, PAGE) < 0)
			break; /* the broker is gone */
		sh->done[idx] = i + 1;
		sh->total++;
	}
	while (!sh->stop)
		rel_sleep_ms(1);
	kvb_close(c);
	free(page);
	return 0;
}

static void no_keeper(const char *sock)
{
	char keep[120];
	struct stat st;

	snprintf(keep, sizeof(keep), "%s.keep", sock);
	CHECK_EQ(harness_keepers(sock), 0);
	CHECKF(stat(keep, &st) < 0, "%s exists: a keeper was spawned", keep);
}

/* Every committed page byte-exact; the one in flight byte-exact or absent. */
static void verify(const struct harness_broker *b, uint32_t *committed)
{
	uint8_t *page = malloc(PAGE);
	kvb_client *c = harness_connect(b, "verify", 0);
	struct kvb_layout l;
	uint32_t ns;

	CHECK(page != NULL);
	layout(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	*committed = 0;
	for (int idx = 0; idx < NCLI; idx++) {
		uint32_t done = sh->done[idx];

		for (uint32_t i = 0; i <= done && i < PER_CLI; i++) {
			kvb_key k = harness_key(sh->seed + (uint64_t)idx, i);
			int rc = kvb_get(c, ns, k, page, PAGE);

			if (i < done)
				CHECKF(rc == (int)PAGE, "client %d key %u committed: get %d (%s)",
				       idx, i, rc, harness_strerror(rc));
			else
				CHECKF(rc == (int)PAGE || rc == -ENOENT, "in flight: get %d", rc);
			if (rc == (int)PAGE)
				CHECK_OK(harness_verify(page, PAGE, &k, sh->seed, "adopted page"));
			*committed += i < done;
		}
	}
	kvb_close(c);
	free(page);
}

/* kill -9 of b under load from NCLI processes; returns when they are gone. */
static void kill_under_load(struct harness_broker *b, int cyc)
{
	pid_t cli[NCLI];
	int status[NCLI];
	uint64_t end = harness_now_ms() + 10000;

	sh->seed = 5000 + (uint64_t)cyc * 16;
	sh->stop = 0;
	sh->total = 0;
	sh->ready = 0;
	for (int i = 0; i < NCLI; i++)
		sh->done[i] = 0;
	for (int i = 0; i < NCLI; i++)
		cli[i] = harness_fork(loader, i, NULL);
	while (sh->total < (uint32_t)(NCLI * PER_CLI / 3 + cyc * 37 % (NCLI * PER_CLI / 3)) &&
	       harness_now_ms() < end)
		rel_sleep_ms(1);
	rel_kill(b->pid);
	b->pid = 0;
	sh->stop = 1;
	CHECK_EQ(harness_wait(cli, NCLI, 5000, status), 0);
}

#define NHOLD 16

/* [records] A client that leases NHOLD pages from the broker, then reads them when told. */
static int lease_holder(int idx, void *arg)
{
	struct kvb_opts o = {.socket_path = sh->sock};
	struct kvb_lease l[NHOLD];
	struct kvb_layout lay;
	uint8_t *page = malloc(PAGE);
	kvb_client *c;
	uint32_t ns;
	int bad = 0;

	(void)idx;
	(void)arg;
	setenv("KVB_CLIENT_DIR", "0", 1); /* the broker's leases: its ledger */
	layout(&lay);
	if (!page || kvb_connect(&o, &c) || kvb_ns_open(c, &lay, &ns, NULL))
		return 1;
	for (int i = 0; i < NHOLD; i++) {
		kvb_key k = harness_key(7777, (uint64_t)i);

		harness_fill(page, PAGE, &k, 7777);
		if (kvb_put(c, ns, k, page, PAGE) < 0 || kvb_acquire(c, ns, k, &l[i]) < 0)
			return 2;
	}
	sh->stop = 1; /* leased */
	while (sh->stop == 1)
		rel_sleep_ms(1);
	for (int i = 0; i < NHOLD; i++) {
		kvb_key k = harness_key(7777, (uint64_t)i);

		bad += harness_verify(l[i].data, PAGE, &k, 7777, "lease") != 0;
	}
	return bad ? 3 : 0;
}

/* [records] Leases held across a crash with the pool in the store: the next broker holds
 * their pages while the pool is filled over four times; exit 0 when every lease read right. */
static struct harness_broker *leases_across(struct harness_broker *b)
{
	pid_t h;
	int st;
	uint8_t *page = malloc(PAGE);
	struct kvb_opts o = {.socket_path = sh->sock};
	struct kvb_layout lay;
	kvb_client *c;
	uint32_t ns;

	CHECK(page != NULL);
	sh->stop = 0;
	h = harness_fork(lease_holder, 0, NULL);
	while (sh->stop != 1)
		rel_sleep_ms(1);
	rel_kill(b->pid);
	b->pid = 0;
	S = (struct start){.pass = 1, .fdstore = 1};
	b = sd_start(sh->sock);
	CHECK(harness_broker_log_has(b, "1 client(s) of the previous broker live on"));
	layout(&lay);
	CHECK_OK(kvb_connect(&o, &c));
	CHECK_OK(kvb_ns_open(c, &lay, &ns, NULL));
	CHECK_EQ(harness_stat(c, "pool.orphan_pins"), NHOLD);
	for (uint64_t i = 0; i < 4 * 1024; i++) { /* 256 MiB through a 64 MiB pool */
		kvb_key k = harness_key(8888, i);

		harness_fill(page, PAGE, &k, 8888);
		CHECK(kvb_put(c, ns, k, page, PAGE) >= 0);
	}
	sh->stop = 2;
	CHECK_EQ(harness_wait(&h, 1, 10000, &st), 0);
	CHECK_EQ(harness_stat_wait(c, "pool.orphans", 0, 5000), 0);
	kvb_close(c);
	free(page);
	rel_figure("%d leases held across a SIGKILL with the pool and the session records in the "
		   "fd store: intact through a fill of four pools",
		   NHOLD);
	return b;
}

/* The store holds exactly one side table and narenas arenas, by name (and sessions' records). */
static void store_is_pool(int narenas)
{
	int meta = 0, arenas = 0, recs = 0;

	pthread_mutex_lock(&M.mu);
	for (int j = 0; j < M.nst; j++) {
		meta += !strcmp(M.st[j].name, "kvbpool-meta");
		arenas += !strncmp(M.st[j].name, "kvbpool-arena-", 14);
		recs += !strncmp(M.st[j].name, "kvbsess-", 8);
	}
	CHECKF(meta == 1 && arenas == narenas && M.nst == 1 + narenas + recs,
	       "store: %d fds, %d side tables, %d arenas (want 1 and %d)", M.nst, meta, arenas,
	       narenas);
	pthread_mutex_unlock(&M.mu);
}

/* A clean stop: STOPPING=1 and FDSTOREREMOVE=1 of every fd; the store empties. */
static void clean_stop(struct harness_broker *b)
{
	int from = ev_count();
	pid_t pid = b->pid;

	harness_broker_stop(b);
	CHECKF(ev_wait(from, "STOPPING=1", 2000) >= 0, "no STOPPING=1");
	for (int i = 0; i < 200 && store_count(); i++)
		rel_sleep_ms(10);
	CHECKF(store_count() == 0, "%d fds left in the store after a clean stop", store_count());
	CHECK(ev_wait(from, "FDSTOREREMOVE=1", 0) >= 0);
	ev_check_pid(from, pid);
}

/* Puts one page the next start must not serve (it starts cold). */
static kvb_key put_marker(const struct harness_broker *b, uint64_t seed)
{
	uint8_t *page = malloc(PAGE);
	kvb_client *c = harness_connect(b, "marker", 0);
	kvb_key k = harness_key(seed, 1);
	struct kvb_layout l;
	uint32_t ns;

	CHECK(page != NULL);
	layout(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	harness_fill(page, PAGE, &k, seed);
	CHECK_OK(kvb_put(c, ns, k, page, PAGE));
	kvb_close(c);
	free(page);
	return k;
}

static int has_page(const struct harness_broker *b, kvb_key k)
{
	kvb_client *c = harness_connect(b, "probe", 0);
	struct kvb_layout l;
	size_t hits = 9;
	uint32_t ns;

	layout(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	CHECK_OK(kvb_lookup(c, ns, &k, 1, &hits));
	kvb_close(c);
	return hits == 1;
}

int main(int argc, char **argv)
{
	static const struct {
		enum hostile bad;
		const char *log;
	} hostile[] = {
		{H_COUNT, "LISTEN_FDNAMES has"},   {H_TWICE, "is given twice"},
		{H_FOREIGN, "is not a pool fd's"}, {H_SWAP, "cannot be adopted"},
		{H_PID, "is not this process"},
	};
	int cycles = (int)rel_pick(1, 3, 20), narenas, from;
	uint64_t committed_all = 0;
	struct harness_broker *b;
	char dir[] = "/tmp/kvbt-fdstore-XXXXXX";

	harness_init(argc, argv);
	rel_deadline((unsigned)cycles * 8 + 90);
	sh = harness_shared(sizeof(*sh));
	CHECK(mkdtemp(dir) != NULL);
	mgr_open(dir);

	/* A cold start under a manager with a store: READY=1, the pool stored, no keeper. */
	S = (struct start){.fdstore = 1};
	from = ev_count();
	b = sd_start("");
	snprintf(sh->sock, sizeof(sh->sock), "%s", b->sock);
	CHECKF(ev_wait(from, "READY=1", 5000) >= 0, "no READY=1 from the broker");
	CHECK(ev_wait(from, "STATUS=serving", 0) >= 0);
	CHECK(ev_wait(from, "systemd's fd store", 0) >= 0);
	ev_check_pid(from, b->pid);
	narenas = store_count() - 1;
	CHECKF(narenas >= 1, "the broker stored %d fds", narenas + 1);
	store_is_pool(narenas);
	no_keeper(sh->sock);
	CHECK(harness_broker_log_has(b, "pool kept in systemd's fd store"));

	/* kill -9 under load; the next broker gets the store as LISTEN_FDS ('@' socket). */
	for (int cyc = 0; cyc < cycles; cyc++) {
		uint32_t committed;

		kill_under_load(b, cyc);
		/* Odd cycles copy on workers, which checksum what they wrote: the adopter checks
		 * those crcs against the bytes. */
		S = (struct start){.pass = 1, .fdstore = 1, .abstract = 1, .workers = cyc & 1};
		from = ev_count();
		b = sd_start(sh->sock);
		CHECKF(ev_wait(from, "READY=1", 5000) >= 0, "cycle %d: no READY=1", cyc);
		CHECKF(ev_wait(from, "(adopted)", 0) >= 0, "cycle %d: STATUS does not say adopted",
		       cyc);
		CHECKF(harness_broker_log_has(b, "from systemd's fd store"),
		       "cycle %d: no adoption from the fd store logged", cyc);
		no_keeper(sh->sock);
		store_is_pool(narenas);
		verify(b, &committed);
		CHECKF(committed > 0, "cycle %d: nothing committed before the kill", cyc);
		committed_all += committed;
		ev_check_pid(from, b->pid);
	}
	rel_figure("%d SIGKILL+restart cycles under load from %d processes with the pool in a "
		   "(test-played) systemd fd store: %llu of %llu committed pages served "
		   "byte-exact, no keeper",
		   cycles, NCLI, (unsigned long long)committed_all,
		   (unsigned long long)committed_all);
	b = leases_across(b);
	clean_stop(b);

	/* Hostile or mismatched LISTEN_*: a clear log line, a cold start, a new pool stored. */
	S = (struct start){.fdstore = 1};
	b = sd_start(sh->sock);
	for (size_t h = 0; h < sizeof(hostile) / sizeof(hostile[0]); h++) {
		kvb_key k = put_marker(b, 900 + h);

		CHECK(has_page(b, k));
		rel_kill(b->pid);
		b->pid = 0;
		store_is_pool(narenas);
		S = (struct start){
			.pass = 1, .fdstore = 1, .abstract = (int)(h & 1), .bad = hostile[h].bad};
		from = ev_count();
		b = sd_start(sh->sock);
		CHECKF(ev_wait(from, "READY=1", 5000) >= 0, "hostile %zu: no READY=1", h);
		CHECKF(harness_broker_log_has(b, hostile[h].log), "hostile %zu: no \"%s\" logged",
		       h, hostile[h].log);
		CHECKF(!harness_broker_log_has(b, "adopt: "), "hostile %zu: adopted", h);
		CHECKF(!has_page(b, k), "hostile %zu: the old pool's page is served", h);
		no_keeper(sh->sock);
		ev_check_pid(from, b->pid);
		if (hostile[h].bad != H_PID) /* the old names were removed, the new pool stored */
			store_is_pool(narenas);
	}
	/* H_PID left the old pool in the store next to the new one: a stop removes both. */
	clean_stop(b);

	/* $NOTIFY_SOCKET but no $FDSTORE (FileDescriptorStoreMax= unset): a keeper keeps it. */
	S = (struct start){.fdstore = 0};
	from = ev_count();
	b = sd_start(sh->sock);
	CHECKF(ev_wait(from, "READY=1", 5000) >= 0, "no READY=1 without $FDSTORE");
	CHECK(ev_wait(from, "a keeper process", 0) >= 0);
	CHECK_EQ(harness_keepers(sh->sock), 1);
	CHECK_EQ(store_count(), 0);
	harness_broker_stop(b);
	for (int i = 0; i < 200 && harness_keepers(sh->sock); i++)
		rel_sleep_ms(10);
	CHECK_EQ(harness_keepers(sh->sock), 0);
	mgr_close();
	rmdir(dir);
	return H_PASS;
}
