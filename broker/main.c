// SPDX-License-Identifier: MIT
/*
 * main.c - kvbrokerd: flags, start-up in dependency order (pool, store, socket, loop) and a
 * clean shutdown on SIGTERM/SIGINT. Start-up refuses to run twice on the same pool (its flock)
 * or on a socket another broker answers on; a stale socket file from a crash is replaced.
 */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "broker.h"
#include "log.h"
#include "proto.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvbrokerd [options]\n"
		"\n"
		"The node-local KV-cache page broker. Runs in the foreground and logs to stderr.\n"
		"\n"
		"  --socket PATH          control socket (default $KVB_SOCKET, else\n"
		"                         $XDG_RUNTIME_DIR/kvbroker.sock, else "
		"/run/kvbroker/kvbroker.sock)\n"
		"  --pool SIZE            RAM pool size, K/M/G/T suffixes (default 1/16 of RAM,\n"
		"                         64M..4G)\n"
		"  --pool-name /NAME      POSIX shm name of the pool (default derived from the "
		"socket)\n"
		"  --slab SIZE            slab size; the largest page must fit (default\n"
		"                         pool/32 clamped to 8M..64M)\n"
		"  --high-watermark PCT   evict in the background above this pool use, down to\n"
		"                         the low watermark (default 100: with RAM as the only\n"
		"                         tier, pages are evicted on demand, coldest first, only\n"
		"                         when a PUT finds the pool full)\n"
		"  --low-watermark PCT    background eviction stops here (default 90)\n"
		"  --poll-us N            busy-poll the rings this long after the last op (default "
		"200)\n"
		"  --max-clients N        attached clients (default 1024)\n"
		"  --max-leases N         leases one client may hold (default 65536)\n"
		"  --arg-size SIZE        per-client argument area for batched ops (default 1M)\n"
		"  --max-buf-bytes SIZE   host memory one client may register (default: RAM size)\n"
		"  --max-sq-entries N     ring depth one client may ask for, a power of two;\n"
		"                         larger asks are clamped (default 4096)\n"
		"  --max-bufs N           registered buffers per client (default 256, at most "
		"256)\n"
		"  --max-ns N             namespaces one client may open (default 64, at most 64)\n"
		"  --max-inflight N       ops per client taken from its ring and not completed\n"
		"                         (default 4096)\n"
		"  --no-prefault          do not map the pool's pages at start-up (its memory is\n"
		"                         reserved either way; first PUTs then pay minor faults)\n"
		"  --group NAME           also admit clients of this group (default: same uid "
		"only)\n"
		"  --log-level LEVEL      debug, info, warn or error (default info)\n"
		"  --help                 this text\n"
		"\n"
		"Signals: SIGTERM or SIGINT drains and exits 0; SIGHUP is logged.\n");
}

/* "64M" -> bytes; -EINVAL on garbage or overflow. */
static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	int shift = 0;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'k':
	case 'K':
		shift = 10;
		end++;
		break;
	case 'm':
	case 'M':
		shift = 20;
		end++;
		break;
	case 'g':
	case 'G':
		shift = 30;
		end++;
		break;
	case 't':
	case 'T':
		shift = 40;
		end++;
		break;
	default:
		break;
	}
	if (*end == 'i' || *end == 'B' || *end == 'b')
		end++;
	if (*end == 'B')
		end++;
	if (*end || (shift && v > (UINT64_MAX >> shift)))
		return -EINVAL;
	*out = (uint64_t)v << shift;
	return 0;
}

static int parse_u32(const char *s, uint32_t *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v > UINT32_MAX)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

static uint64_t ram_bytes(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

	return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : (1ull << 30);
}

static uint64_t default_pool(void)
{
	uint64_t p = ram_bytes() / 16;

	if (p < (64ull << 20))
		p = 64ull << 20;
	if (p > (4ull << 30))
		p = 4ull << 30;
	return p;
}

/* The pool's shm name from the socket path, so two brokers never share one by accident. */
static void default_pool_name(const char *sock, char *out, size_t len)
{
	uint8_t h[32];

	EVP_Digest(sock, strlen(sock), h, NULL, EVP_sha256(), NULL);
	snprintf(out, len, "/kvbroker-%u-%02x%02x%02x%02x%02x%02x%02x%02x", (unsigned)geteuid(),
		 h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
}

static int parse_args(int argc, char **argv, struct config *c)
{
	enum {
		O_SOCKET = 256,
		O_POOL,
		O_POOL_NAME,
		O_SLAB,
		O_HIGH,
		O_LOW,
		O_POLL,
		O_MAXC,
		O_MAXL,
		O_ARG,
		O_GROUP,
		O_LOG,
		O_HELP,
		O_MAXBUF,
		O_NOPREFAULT,
		O_MAXSQ,
		O_MAXBUFS,
		O_MAXNS,
		O_MAXINFL
	};
	static const struct option opts[] = {
		{"socket", required_argument, NULL, O_SOCKET},
		{"pool", required_argument, NULL, O_POOL},
		{"pool-name", required_argument, NULL, O_POOL_NAME},
		{"slab", required_argument, NULL, O_SLAB},
		{"high-watermark", required_argument, NULL, O_HIGH},
		{"low-watermark", required_argument, NULL, O_LOW},
		{"poll-us", required_argument, NULL, O_POLL},
		{"max-clients", required_argument, NULL, O_MAXC},
		{"max-leases", required_argument, NULL, O_MAXL},
		{"arg-size", required_argument, NULL, O_ARG},
		{"group", required_argument, NULL, O_GROUP},
		{"log-level", required_argument, NULL, O_LOG},
		{"help", no_argument, NULL, O_HELP},
		{"max-buf-bytes", required_argument, NULL, O_MAXBUF},
		{"no-prefault", no_argument, NULL, O_NOPREFAULT},
		{"max-sq-entries", required_argument, NULL, O_MAXSQ},
		{"max-bufs", required_argument, NULL, O_MAXBUFS},
		{"max-ns", required_argument, NULL, O_MAXNS},
		{"max-inflight", required_argument, NULL, O_MAXINFL},
		{NULL, 0, NULL, 0},
	};
	uint32_t high = 100, low = 90;
	uint64_t v;
	int o, lvl;

	memset(c, 0, sizeof(*c));
	c->poll_us = 200;
	c->max_clients = 1024;
	c->max_leases = 65536;
	c->arg_size = 1u << 20;
	c->max_buf_bytes = ram_bytes();
	c->max_sq = KVB_SQ_MAX;
	c->max_bufs = SESSION_MAX_BUFS;
	c->max_ns = SESSION_MAX_NS;
	c->max_inflight = KVB_SQ_MAX;
	c->prefault = 1;
	if (kvb_default_socket(c->socket_path, sizeof(c->socket_path)))
		return -ENAMETOOLONG;
	while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (o) {
		case O_SOCKET:
			if (snprintf(c->socket_path, sizeof(c->socket_path), "%s", optarg) >=
			    (int)sizeof(c->socket_path)) {
				fprintf(stderr, "kvbrokerd: --socket: path too long\n");
				return -EINVAL;
			}
			break;
		case O_POOL:
			if (parse_size(optarg, &c->pool_bytes) || !c->pool_bytes)
				goto bad;
			break;
		case O_POOL_NAME:
			if (optarg[0] != '/' || strchr(optarg + 1, '/') ||
			    strlen(optarg) >= sizeof(c->pool_name) - 8)
				goto bad;
			snprintf(c->pool_name, sizeof(c->pool_name), "%s", optarg);
			break;
		case O_SLAB:
			if (parse_size(optarg, &c->slab_bytes) || c->slab_bytes < (1u << 20) ||
			    c->slab_bytes % STORE_SLOT_ALIGN)
				goto bad;
			break;
		case O_HIGH:
			if (parse_u32(optarg, &high) || !high || high > 100)
				goto bad;
			break;
		case O_LOW:
			if (parse_u32(optarg, &low) || !low || low > 100)
				goto bad;
			break;
		case O_POLL:
			if (parse_u32(optarg, &c->poll_us))
				goto bad;
			break;
		case O_MAXC:
			if (parse_u32(optarg, &c->max_clients) || !c->max_clients)
				goto bad;
			break;
		case O_MAXL:
			if (parse_u32(optarg, &c->max_leases))
				goto bad;
			break;
		case O_ARG:
			if (parse_size(optarg, &v) || v < 4096 || v > (64u << 20))
				goto bad;
			c->arg_size = (uint32_t)v;
			break;
		case O_GROUP: {
			struct group *g = getgrnam(optarg);

			if (!g) {
				fprintf(stderr, "kvbrokerd: --group: no group '%s'\n", optarg);
				return -EINVAL;
			}
			c->group = g->gr_gid;
			c->has_group = 1;
			break;
		}
		case O_MAXBUF:
			if (parse_size(optarg, &c->max_buf_bytes))
				goto bad;
			break;
		case O_NOPREFAULT:
			c->prefault = 0;
			break;
		case O_MAXSQ:
			if (parse_u32(optarg, &c->max_sq) || !kvb_is_pow2(c->max_sq) ||
			    c->max_sq < KVB_SQ_MIN || c->max_sq > KVB_SQ_MAX)
				goto bad;
			break;
		case O_MAXBUFS:
			if (parse_u32(optarg, &c->max_bufs) || !c->max_bufs ||
			    c->max_bufs > SESSION_MAX_BUFS)
				goto bad;
			break;
		case O_MAXNS:
			if (parse_u32(optarg, &c->max_ns) || !c->max_ns ||
			    c->max_ns > SESSION_MAX_NS)
				goto bad;
			break;
		case O_MAXINFL:
			if (parse_u32(optarg, &c->max_inflight) || !c->max_inflight)
				goto bad;
			break;
		case O_LOG:
			lvl = log_parse_level(optarg);
			if (lvl < 0)
				goto bad;
			log_min_level = lvl;
			break;
		case O_HELP:
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -EINVAL;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvbrokerd: unexpected argument '%s'\n", argv[optind]);
		return -EINVAL;
	}
	if (low > high) {
		fprintf(stderr, "kvbrokerd: --low-watermark above --high-watermark\n");
		return -EINVAL;
	}
	c->high_wm = high / 100.0;
	c->low_wm = low / 100.0;
	if (!c->pool_bytes)
		c->pool_bytes = default_pool();
	if (!c->slab_bytes) {
		v = c->pool_bytes / 32;
		v = v < (8u << 20) ? (8u << 20) : v > (64u << 20) ? (64u << 20) : v;
		c->slab_bytes = v & ~((1ull << 20) - 1);
	}
	if (c->slab_bytes > c->pool_bytes) {
		fprintf(stderr, "kvbrokerd: --slab larger than --pool\n");
		return -EINVAL;
	}
	if (!c->pool_name[0])
		default_pool_name(c->socket_path, c->pool_name, sizeof(c->pool_name));
	return 0;
bad:
	fprintf(stderr, "kvbrokerd: bad value '%s' for --%s\n", optarg, opts[o - O_SOCKET].name);
	return -EINVAL;
}

/*
 * Binds the control socket, replacing a stale file but never a live broker's socket. With
 * --group, the directory we create and the socket belong to that group, so its members (and
 * nobody else but us) can enter and connect; SO_PEERCRED is checked again at accept.
 */
static int listen_socket(const char *path, const struct config *c)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char dir[sizeof(sa.sun_path)], *slash;
	int fd, err;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = '\0';
		/* Only the broker's user (and group) may enter a directory we create. */
		if (mkdir(dir, 0750) == 0) {
			if (c->has_group && chown(dir, (uid_t)-1, c->group) < 0)
				log_warn("chown %s to group %u: %s", dir, (unsigned)c->group,
					 strerror(errno));
		} else if (errno != EEXIST) {
			return -errno;
		}
	}
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		close(fd);
		return -EADDRINUSE;
	}
	close(fd);
	unlink(path); /* stale (ECONNREFUSED) or absent */
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(path, 0660) < 0 ||
	    (c->has_group && chown(path, (uid_t)-1, c->group) < 0) || listen(fd, 128) < 0) {
		err = -errno;
		close(fd);
		return err;
	}
	return fd;
}

static int epoll_add(int epfd, int fd, uint64_t data)
{
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = data};

	return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

/*
 * A ring client costs 4 fds (socket, pidfd, two doorbells), any connection 2: with the usual
 * soft limit of 1024, some 250 clients would attach whatever --max-clients says, and the rest
 * would be refused. Raise the soft limit to what --max-clients needs, up to the hard limit, and
 * say so when even that is short (t_rel_overload: fd_limit).
 */
static void raise_nofile(uint32_t max_clients)
{
	rlim_t want = ((rlim_t)max_clients + CONN_SPARE) * 4 + 64;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= want)
		return;
	rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur < want)
		log_warn("fd limit %llu: fewer than --max-clients %u clients can attach (raise "
			 "the hard limit, ulimit -Hn)",
			 (unsigned long long)rl.rlim_cur, max_clients);
}

static int setup_signals(void)
{
	sigset_t set;

	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
		return -errno;
	return signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
}

int main(int argc, char **argv)
{
	static struct broker b;
	struct list *pos, *tmp;
	int err;

	if (parse_args(argc, argv, &b.cfg))
		return 2;
	list_init(&b.sessions);
	list_init(&b.graveyard);
	b.listen_fd = b.epfd = b.sigfd = -1;
	b.start_time = now_sec();
	/*
	 * Not dumpable: processes of our uid can then neither ptrace us nor reopen our fds through
	 * /proc/<pid>/fd, which would hand them a writable pool.
	 */
	prctl(PR_SET_DUMPABLE, 0);
	raise_nofile(b.cfg.max_clients);
	b.spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

	err = pool_open(&b.pool, b.cfg.pool_name, b.cfg.pool_bytes, 1);
	if (err) {
		log_error("pool %s (%llu bytes): %s%s", b.cfg.pool_name,
			  (unsigned long long)b.cfg.pool_bytes, strerror(-err),
			  err == -EBUSY	   ? ": another kvbrokerd owns it"
			  : err == -ENOSPC ? ": /dev/shm cannot hold the pool (see df /dev/shm)"
					   : "");
		return 1;
	}
	if (b.cfg.prefault) {
		double t0 = now_sec();

		pool_prefault(&b.pool);
		log_info("pool: prefaulted %llu MiB in %.2f s",
			 (unsigned long long)(b.pool.total >> 20), now_sec() - t0);
	}
	err = store_init(&b.store, &b.pool, b.cfg.slab_bytes, b.cfg.high_wm, b.cfg.low_wm);
	if (err) {
		log_error("store: %s", strerror(-err));
		goto out_pool;
	}
	b.copy = copy_host_create();
	b.sigfd = setup_signals();
	b.epfd = epoll_create1(EPOLL_CLOEXEC);
	if (!b.copy || b.sigfd < 0 || b.epfd < 0) {
		log_error("start-up: out of resources");
		err = -ENOMEM;
		goto out_store;
	}
	b.listen_fd = listen_socket(b.cfg.socket_path, &b.cfg);
	if (b.listen_fd < 0) {
		err = b.listen_fd;
		log_error("socket %s: %s%s", b.cfg.socket_path, strerror(-err),
			  err == -EADDRINUSE ? ": another kvbrokerd answers there" : "");
		goto out_store;
	}
	if (epoll_add(b.epfd, b.listen_fd, LOOP_LISTEN) ||
	    epoll_add(b.epfd, b.sigfd, LOOP_SIGNAL)) {
		err = -errno;
		goto out_sock;
	}
	log_info("kvbrokerd %d.%d.%d ready: socket %s, pool %s %llu MiB in %u slabs of %llu MiB, "
		 "copy engine %s, poll %u us",
		 KVB_VERSION_MAJOR, KVB_VERSION_MINOR, KVB_VERSION_PATCH, b.cfg.socket_path,
		 b.cfg.pool_name, (unsigned long long)(b.pool.total >> 20), b.store.nslabs,
		 (unsigned long long)(b.cfg.slab_bytes >> 20), b.copy->name, b.cfg.poll_us);
	err = loop_run(&b);
	list_for_each_safe (pos, tmp, &b.sessions)
		session_destroy(&b, list_entry(pos, struct session, link), NULL);
	session_reap(&b);
	log_info("stopped: %llu puts, %llu gets, %llu dedup, %llu evictions",
		 (unsigned long long)b.ctr.puts, (unsigned long long)b.ctr.gets,
		 (unsigned long long)b.ctr.dedup, (unsigned long long)b.store.st.evictions);
out_sock:
	close(b.listen_fd);
	unlink(b.cfg.socket_path);
out_store:
	if (b.epfd >= 0)
		close(b.epfd);
	if (b.sigfd >= 0)
		close(b.sigfd);
	if (b.copy)
		b.copy->destroy(b.copy);
	if (b.spare_fd >= 0)
		close(b.spare_fd);
	ns_table_fini(&b.nst);
	store_fini(&b.store);
out_pool:
	pool_close(&b.pool);
	return err ? 1 : 0;
}
