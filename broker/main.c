// SPDX-License-Identifier: MIT
/*
 * main.c - kvbrokerd: flags, start-up in dependency order (lock, pool, store, socket, loop) and
 * a clean shutdown on SIGTERM/SIGINT. Start-up refuses to run twice on the same socket (the
 * lock file, instance.c) or on a socket another broker answers on, and a new pool larger than
 * the machine can give it (pool_fits, memcap.c); a stale socket file from a crash is replaced.
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
#include <time.h>
#include <unistd.h>

#include "broker.h"
#include "cli.h"
#include "instance.h"
#include "keeper.h"
#include "watch.h"
#include "orphan.h"
#include "sdnotify.h"
#include "copy_cuda.h"
#include "log.h"
#include "memcap.h"
#include "plan.h"
#include "parse.h"
#include "size.h"
#include "proto.h"
#include "metrics_http.h"
#include "text.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvbrokerd [options]\n"
		"\n"
		"The node-local KV-cache page broker. Runs in the foreground and logs to stderr.\n"
		"\n"
		"  --socket PATH          control socket (default $KVB_SOCKET, else\n"
		"                         " KVB_SOCKET_DEFAULT ", whoever runs it: clients\n"
		"                         look there by the same rule; its directory is made\n"
		"                         0750, group --group, if missing)\n"
		"  --pool SIZE            RAM pool size, K/M/G/T suffixes (default 1/16 of RAM,\n"
		"                         64M..4G). A new pool larger than the machine can give\n"
		"                         the broker (MemAvailable, its memory cgroup, RLIMIT_AS,\n"
		"                         less a headroom; hugetlb pages apart) is refused before\n"
		"                         any memory is touched (docs/operations.md)\n"
		"  --pool-overcommit      start with such a pool anyway, with a warning (memory\n"
		"                         that something else frees first, swap on purpose)\n"
		"  --pool-name /NAME      name of the pool's memfds, shown in /proc/PID/maps\n"
		"                         (default derived from the socket)\n"
		"  --numa MODE            auto (one arena per NUMA node with memory, sized in\n"
		"                         proportion), off, interleave, or a node list: 0,1 or\n"
		"                         0:64G,1:32G (sizes replace --pool) (default auto)\n"
		"  --hugepages MODE       auto, 2M, 1G, off or collapse: hugetlb pages when\n"
		"                         enough are free, else transparent huge pages where\n"
		"                         shmem allows them, else 4 KiB pages (default auto);\n"
		"                         collapse: no hugetlb, 4 KiB pages made into 2 MiB ones\n"
		"                         at the prefault (Linux 6.1; about 1 s more per GiB)\n"
		"  --slab SIZE            slab size; the largest page must fit (default\n"
		"                         pool/32 clamped to 8M..64M)\n"
		"  --high-watermark PCT   evict in the background above this pool use, down to\n"
		"                         the low watermark (default 100: with RAM as the only\n"
		"                         tier, pages are evicted on demand, coldest first, only\n"
		"                         when a PUT finds the pool full; 90 with --disk, so that\n"
		"                         demotion runs ahead of demand)\n"
		"  --low-watermark PCT    background eviction stops here (default 90; 80 with\n"
		"                         --disk)\n"
		"  --disk PATH[,PATH...]  NVMe tier: cold pages are demoted to these files or "
		"block\n"
		"                         devices (O_DIRECT, io_uring), pages striped across "
		"them;\n"
		"                         an existing cache of the same geometry is adopted (warm\n"
		"                         restart)\n"
		"  --disk-size SIZE       bytes of disk cache in all, split across the paths\n"
		"                         (required with --disk; block devices: at most their "
		"size)\n"
		"  --disk-qd N            page I/Os in flight (default 64)\n"
		"  --disk-sqpoll          io_uring SQPOLL: a kernel thread submits (costs a CPU)\n"
		"  --remote URL           share pages across nodes through a Redis Cluster:\n"
		"                         redis://HOST:PORT[,HOST:PORT...] (seed nodes)\n"
		"  --remote-prefix P      prefix of every key there (default \"kvb:\")\n"
		"  --remote-timeout MS    deadline of a remote lookup or fetch (default 200)\n"
		"  --remote-inflight SIZE value bytes on the wire at most (default 256M)\n"
		"  --remote-publish WHEN  put (publish each page a PUT stores, default), reuse (at "
		"its\n"
		"                         first GET or ACQUIRE hit here), evict (as it leaves RAM) "
		"or never\n"
		"  --poll-us N            busy-poll the rings this long after the last op (default "
		"200)\n"
		"  --metrics-listen ADDR  serve Prometheus metrics at http://ADDR/metrics; ADDR "
		"is\n"
		"                         HOST:PORT or PORT (loopback), e.g. 127.0.0.1:9464\n"
		"  --max-clients N        attached clients (default 1024)\n"
		"  --max-control N        control-only connections such as kvbctl, apart from\n"
		"                         --max-clients (default 64)\n"
		"  --control-idle SECS    close control connections silent this long (default\n"
		"                         120; 0: never)\n"
		"  --max-leases N         leases one client may hold (default 65536)\n"
		"  --max-lease-bytes SIZE|N%%\n"
		"                         page bytes one client may hold leased (default 12%%\n"
		"                         of its tenant's pool): -EDQUOT past it\n"
		"  --max-pinned PCT       leases of all clients pin at most this much of a pool\n"
		"                         (partition), so a PUT always finds room (default 50):\n"
		"                         -EBUSY past it\n"
		"  --lease-lifetime SECS  a client holding a lease longer is disconnected\n"
		"                         (default 600; 0: never)\n"
		"  --tenants none|uid|gid isolate clients by uid or primary gid: own namespaces,\n"
		"                         own pool partition (memfds), own eviction (default "
		"none)\n"
		"  --tenant ID=RAM[,DISK] a tenant's (user or group, name or number) share of\n"
		"                         the pool and of the --disk tier, each SIZE or N%%\n"
		"                         (default disk share: in proportion to RAM); repeatable\n"
		"  --tenant-share RAM[,DISK]\n"
		"                         the share of each tenant not listed (default: the rest\n"
		"                         of the pool in 4 shares), taken at its first attach\n"
		"  --ns-limit MODEL=SIZE|N%%\n"
		"                         cap each namespace of a model (its layout's model\n"
		"                         name) at SIZE of RAM or N%% of its tenant's pool; over\n"
		"                         it, it evicts its own pages first; repeatable (16)\n"
		"  --arg-size SIZE        per-client argument area for batched ops (default 1M)\n"
		"  --max-buf-bytes SIZE   host memory one client may register (default: a quarter\n"
		"                         of RAM, at most 64G)\n"
		"  --max-sq-entries N     ring depth one client may ask for, a power of two;\n"
		"                         larger asks are clamped (default 4096)\n"
		"  --max-bufs N           registered buffers per client (default 256, at most "
		"256)\n"
		"  --max-ns N             namespaces one client may open (default 64, at most 64)\n"
		"  --max-inflight N       ops per client taken from its ring and not completed\n"
		"                         (default 4096)\n"
		"  --no-prefault          do not fault the pool in at start-up (in parallel, per\n"
		"                         node); its memory is reserved either way, and first\n"
		"                         PUTs then pay the page faults\n"
		"  --no-directory         keep no pool directory: every kvb_get() of a client "
		"asks\n"
		"                         the broker (a round trip) instead of finding the page\n"
		"                         itself (docs/design.md [dir])\n"
		"  --group NAME           also admit clients of this group (default: same uid "
		"only)\n"
		"  --copy-threads N       host copy worker threads (default: CPUs / 2, 2..4)\n"
		"  --copy-inline SIZE     host copies up to SIZE run on the loop thread, larger\n"
		"                         ones on the workers (default 4M; 0: every copy on a\n"
		"                         worker)\n"
		"  --copy-delay-us N      testing: each worker copy sleeps N us first\n"
		"  --copy-fail-every N    testing: every N-th worker copy fails with EIO\n"
		"  --no-gpu               do not load CUDA (GPU buffers are then refused)\n"
		"  --gpu-path auto|copy|kernel\n"
		"                         how GPU pages move: measured per page shape (auto,\n"
		"                         default), cuMemcpyAsync per part, or the gather/scatter\n"
		"                         kernel\n"
		"  --no-pool-keep         let the RAM pool die with the broker. By default it\n"
		"                         outlives a crash: a small keeper process\n"
		"                         (\"kvbrokerd --keeper\", socket <socket>.keep) holds "
		"its\n"
		"                         memfds, and the next kvbrokerd on the same socket\n"
		"                         adopts it and serves its pages again (after checking\n"
		"                         every page's crc32c; pages being written when the\n"
		"                         broker died are dropped). A kept pool is read-only to\n"
		"                         clients by file mode instead of F_SEAL_FUTURE_WRITE:\n"
		"                         see docs/operations.md. A clean exit frees the pool.\n"
		"                         Under systemd with FileDescriptorStoreMax= ($FDSTORE\n"
		"                         set, systemd >= 254) the unit's fd store holds the\n"
		"                         pool instead of a keeper (FDSTORE=1, names kvbpool-*),\n"
		"                         and fds systemd passes back (LISTEN_FDS) are adopted\n"
		"  --free-pool            free the pool a dead broker on --socket left with its\n"
		"                         keeper, without starting a broker, and exit (also:\n"
		"                         rm <socket>.keep, or kill the keeper; under systemd:\n"
		"                         systemctl clean --what=fdstore kvbrokerd)\n"
		"  --takeover             planned hand-over (an upgrade, new flags): when a\n"
		"                         broker runs on --socket, send it SIGUSR2 and take its\n"
		"                         place: it stops taking work, lets its copies finish,\n"
		"                         and exits leaving its pool to the keeper; this broker\n"
		"                         then adopts the pool and listens. Clients reconnect\n"
		"                         by themselves (include/kvbroker.h)\n"
		"  --log-level LEVEL      debug, info, warn or error (default info)\n"
		"  --version              print the version (the library's, kvbctl's and the\n"
		"                         Python package's are the same) and exit\n"
		"  --help                 this text\n"
		"\n"
		"Signals: SIGTERM or SIGINT drains and exits 0 (freeing the pool); SIGUSR2 hands\n"
		"the pool over (exits 0 keeping it for the next broker); SIGHUP is logged.\n"
		"The broker listens only once its pool is ready; meanwhile \"<socket>.lock\"\n"
		"is held, and clients get -EAGAIN (starting).\n");
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

/*
 * Host copy workers: half the CPUs (the loop and the clients need the rest), 2..4. At least two
 * even on two CPUs: a page of 2 MiB or more copies in two parts side by side, and eight TP
 * ranks loading one MLA page are never queued on a single thread (copy_host.c, fan-out).
 */
static uint32_t default_copy_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN) / 2;

	return n < 2 ? 2 : n > 4 ? 4 : (uint32_t)n;
}

/* The pool memfds' name from the socket path: /proc/PID/maps tells whose pool it is. */
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
		O_METRICS,
		O_MAXC,
		O_MAXL,
		O_ARG,
		O_GROUP,
		O_LOG,
		O_HELP,
		O_MAXBUF,
		O_NOPREFAULT,
		O_NODIR,
		O_NUMA,
		O_HUGEPAGES,
		O_DISK,
		O_DISK_SIZE,
		O_DISK_QD,
		O_DISK_SQPOLL,
		O_COPY_THREADS,
		O_COPY_INLINE,
		O_COPY_DELAY,
		O_NO_GPU,
		O_GPU_PATH,
		O_COPY_FAIL,
		O_MAXSQ,
		O_MAXBUFS,
		O_MAXNS,
		O_MAXINFL,
		O_MAXCTL,
		O_CTLIDLE,
		O_TENANTS,
		O_TENANT,
		O_TENANT_SHARE,
		O_NS_LIMIT,
		O_MAXLB,
		O_MAXPIN,
		O_LEASE_LIFE,
		O_NO_KEEP,
		O_FREE_POOL,
		O_TAKEOVER,
		O_REMOTE,
		O_REMOTE_PREFIX,
		O_REMOTE_TIMEOUT,
		O_REMOTE_INFLIGHT,
		O_REMOTE_PUBLISH,
		O_POOL_OVERCOMMIT,
		O_VERSION
	};
	static const struct option opts[] = {
		{"socket", required_argument, NULL, O_SOCKET},
		{"pool", required_argument, NULL, O_POOL},
		{"pool-name", required_argument, NULL, O_POOL_NAME},
		{"slab", required_argument, NULL, O_SLAB},
		{"high-watermark", required_argument, NULL, O_HIGH},
		{"low-watermark", required_argument, NULL, O_LOW},
		{"poll-us", required_argument, NULL, O_POLL},
		{"metrics-listen", required_argument, NULL, O_METRICS},
		{"max-clients", required_argument, NULL, O_MAXC},
		{"max-leases", required_argument, NULL, O_MAXL},
		{"arg-size", required_argument, NULL, O_ARG},
		{"group", required_argument, NULL, O_GROUP},
		{"log-level", required_argument, NULL, O_LOG},
		{"help", no_argument, NULL, O_HELP},
		{"max-buf-bytes", required_argument, NULL, O_MAXBUF},
		{"no-prefault", no_argument, NULL, O_NOPREFAULT},
		{"no-directory", no_argument, NULL, O_NODIR},
		{"numa", required_argument, NULL, O_NUMA},
		{"hugepages", required_argument, NULL, O_HUGEPAGES},
		{"disk", required_argument, NULL, O_DISK},
		{"disk-size", required_argument, NULL, O_DISK_SIZE},
		{"disk-qd", required_argument, NULL, O_DISK_QD},
		{"disk-sqpoll", no_argument, NULL, O_DISK_SQPOLL},
		{"copy-threads", required_argument, NULL, O_COPY_THREADS},
		{"copy-inline", required_argument, NULL, O_COPY_INLINE},
		{"copy-delay-us", required_argument, NULL, O_COPY_DELAY},
		{"no-gpu", no_argument, NULL, O_NO_GPU},
		{"gpu-path", required_argument, NULL, O_GPU_PATH},
		{"copy-fail-every", required_argument, NULL, O_COPY_FAIL},
		{"max-sq-entries", required_argument, NULL, O_MAXSQ},
		{"max-bufs", required_argument, NULL, O_MAXBUFS},
		{"max-ns", required_argument, NULL, O_MAXNS},
		{"max-inflight", required_argument, NULL, O_MAXINFL},
		{"max-control", required_argument, NULL, O_MAXCTL},
		{"control-idle", required_argument, NULL, O_CTLIDLE},
		{"tenants", required_argument, NULL, O_TENANTS},
		{"tenant", required_argument, NULL, O_TENANT},
		{"tenant-share", required_argument, NULL, O_TENANT_SHARE},
		{"ns-limit", required_argument, NULL, O_NS_LIMIT},
		{"max-lease-bytes", required_argument, NULL, O_MAXLB},
		{"max-pinned", required_argument, NULL, O_MAXPIN},
		{"lease-lifetime", required_argument, NULL, O_LEASE_LIFE},
		{"no-pool-keep", no_argument, NULL, O_NO_KEEP},
		{"free-pool", no_argument, NULL, O_FREE_POOL},
		{"takeover", no_argument, NULL, O_TAKEOVER},
		{"remote", required_argument, NULL, O_REMOTE},
		{"remote-prefix", required_argument, NULL, O_REMOTE_PREFIX},
		{"remote-timeout", required_argument, NULL, O_REMOTE_TIMEOUT},
		{"remote-inflight", required_argument, NULL, O_REMOTE_INFLIGHT},
		{"remote-publish", required_argument, NULL, O_REMOTE_PUBLISH},
		{"pool-overcommit", no_argument, NULL, O_POOL_OVERCOMMIT},
		{"version", no_argument, NULL, O_VERSION},
		{NULL, 0, NULL, 0},
	};
	uint32_t high = 0, low = 0; /* 0: the default, which depends on --disk */
	uint64_t v;
	int o, lvl;

	memset(c, 0, sizeof(*c));
	c->poll_us = 200;
	c->max_clients = 1024;
	c->max_control = 64;
	c->control_idle = 120;
	c->max_leases = 65536;
	c->max_lease_frac = 0.125; /* a client pins at most an eighth of its tenant's pool */
	c->max_pinned = 0.5;	   /* leases pin at most half of a partition: PUTs find room */
	c->lease_lifetime = 600;
	c->arg_size = 1u << 20;
	/* Registered buffers are mapped, not charged to us (the client faults its own in:
	 * kvb_buf_alloc_host), but each is address space and page tables here: a quarter of
	 * the machine per client, at most 64 GiB, unless the operator says otherwise. */
	c->max_buf_bytes = ram_bytes() / 4 < (64ull << 30) ? ram_bytes() / 4 : (64ull << 30);
	c->max_sq = KVB_SQ_MAX;
	c->max_bufs = SESSION_MAX_BUFS;
	c->max_ns = SESSION_MAX_NS;
	c->max_inflight = KVB_SQ_MAX;
	c->prefault = 1;
	c->dir = 1;
	c->keep = 1;
	strcpy(c->numa, "auto");
	c->hugepage = HP_MODE_AUTO;
	c->disk.qd = 64;
	strcpy(c->remote.prefix, "kvb:");
	c->remote.timeout = 0.2;
	c->remote.max_inflight = 256ull << 20;
	c->remote.publish = REMOTE_PUB_PUT;
	c->copy_threads = default_copy_threads();
	c->copy_inline = COPY_HOST_INLINE_DEFAULT;
	c->gpu = 1;
	c->gpu_path = CUDA_PATH_AUTO;
	if (kvb_default_socket(c->socket_path, sizeof(c->socket_path))) {
		fprintf(stderr,
			"kvbrokerd: $KVB_SOCKET is longer than a socket path may be (%zu "
			"bytes)\n",
			sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
		return -ENAMETOOLONG;
	}
	while ((o = cli_getopt(argc, argv, "h", opts, "kvbrokerd")) != -1) {
		switch (o) {
		case O_SOCKET:
			if (snprintf(c->socket_path, sizeof(c->socket_path), "%s", optarg) >=
			    (int)sizeof(c->socket_path)) {
				cli_usage_error("kvbrokerd", "--socket: path longer than %zu bytes",
						sizeof(c->socket_path) - 1);
				return -EINVAL;
			}
			break;
		case O_POOL:
			if (size_parse(optarg, &c->pool_bytes) || !c->pool_bytes)
				goto bad;
			break;
		case O_POOL_OVERCOMMIT:
			c->pool_overcommit = 1;
			break;
		case O_POOL_NAME:
			if (optarg[0] != '/' || strchr(optarg + 1, '/') ||
			    strlen(optarg) >= sizeof(c->pool_name) - 8)
				goto bad;
			snprintf(c->pool_name, sizeof(c->pool_name), "%s", optarg);
			break;
		case O_SLAB:
			if (size_parse(optarg, &c->slab_bytes) || c->slab_bytes < (1u << 20) ||
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
		case O_METRICS:
			if (!*optarg || strlen(optarg) >= sizeof(c->metrics_listen))
				goto bad;
			snprintf(c->metrics_listen, sizeof(c->metrics_listen), "%s", optarg);
			break;
		case O_MAXC:
			if (parse_u32(optarg, &c->max_clients) || !c->max_clients)
				goto bad;
			break;
		case O_MAXCTL:
			if (parse_u32(optarg, &c->max_control) || !c->max_control)
				goto bad;
			break;
		case O_TENANTS:
			if (tenant_parse_mode(optarg, &c->tenants.mode))
				goto bad;
			break;
		case O_TENANT:
			if (c->tenants.nlisted == POOL_MAX_PARTS)
				goto bad;
			c->tenants.listed_arg[c->tenants.nlisted++] = optarg;
			break;
		case O_TENANT_SHARE:
			if (tenant_parse_share(optarg, &c->tenants))
				goto bad;
			break;
		case O_NS_LIMIT:
			if (c->n_ns_limits == NS_LIMITS_MAX ||
			    ns_limit_parse(optarg, &c->ns_limits[c->n_ns_limits]))
				goto bad;
			c->n_ns_limits++;
			break;
		case O_MAXLB: {
			size_t n = strlen(optarg);
			uint32_t pct;

			if (n > 1 && optarg[n - 1] == '%') {
				optarg[n - 1] = '\0';
				if (parse_u32(optarg, &pct) || !pct || pct > 100)
					goto bad;
				c->max_lease_frac = pct / 100.0;
				c->max_lease_bytes = 0;
			} else if (size_parse(optarg, &c->max_lease_bytes) || !c->max_lease_bytes) {
				goto bad;
			} else {
				c->max_lease_frac = 0;
			}
			break;
		}
		case O_MAXPIN: {
			uint32_t pct;

			if (parse_u32(optarg, &pct) || !pct || pct > 100)
				goto bad;
			c->max_pinned = pct / 100.0;
			break;
		}
		case O_LEASE_LIFE: {
			uint32_t secs;

			if (parse_u32(optarg, &secs))
				goto bad;
			c->lease_lifetime = secs;
			break;
		}
		case O_CTLIDLE: {
			uint32_t secs;

			if (parse_u32(optarg, &secs))
				goto bad;
			c->control_idle = secs;
			break;
		}
		case O_MAXL:
			if (parse_u32(optarg, &c->max_leases))
				goto bad;
			break;
		case O_ARG:
			if (size_parse(optarg, &v) || v < 4096 || v > (64u << 20))
				goto bad;
			c->arg_size = (uint32_t)v;
			break;
		case O_GROUP: {
			struct group *g = getgrnam(optarg);

			if (!g) {
				cli_usage_error("kvbrokerd", "--group: no group '%s'", optarg);
				return -EINVAL;
			}
			c->group = g->gr_gid;
			c->has_group = 1;
			break;
		}
		case O_MAXBUF:
			if (size_parse(optarg, &c->max_buf_bytes))
				goto bad;
			break;
		case O_NOPREFAULT:
			c->prefault = 0;
			break;
		case O_NODIR:
			c->dir = 0;
			break;
		case O_NUMA:
			if (snprintf(c->numa, sizeof(c->numa), "%s", optarg) >=
			    (int)sizeof(c->numa))
				goto bad;
			break;
		case O_HUGEPAGES:
			lvl = hugepage_parse(optarg);
			if (lvl < 0)
				goto bad;
			c->hugepage = (enum hp_mode)lvl;
			break;
		case O_DISK:
			if (!*optarg)
				goto bad;
			c->disk.paths = optarg;
			break;
		case O_DISK_SIZE:
			if (size_parse(optarg, &c->disk.size) || !c->disk.size)
				goto bad;
			break;
		case O_DISK_QD:
			if (parse_u32(optarg, &c->disk.qd) || !c->disk.qd || c->disk.qd > 4096)
				goto bad;
			break;
		case O_REMOTE:
			if (!*optarg)
				goto bad;
			c->remote.url = optarg;
			break;
		case O_REMOTE_PREFIX:
			/* A brace would make a hash tag: every page on one shard. */
			if (strlen(optarg) >= sizeof(c->remote.prefix) || strpbrk(optarg, "{}"))
				goto bad;
			strcpy(c->remote.prefix, optarg);
			break;
		case O_REMOTE_TIMEOUT: {
			uint32_t ms;

			if (parse_u32(optarg, &ms) || !ms || ms > 60000)
				goto bad;
			c->remote.timeout = ms / 1000.0;
			break;
		}
		case O_REMOTE_INFLIGHT:
			if (size_parse(optarg, &c->remote.max_inflight) || !c->remote.max_inflight)
				goto bad;
			break;
		case O_REMOTE_PUBLISH:
			if (!strcmp(optarg, "put"))
				c->remote.publish = REMOTE_PUB_PUT;
			else if (!strcmp(optarg, "never"))
				c->remote.publish = REMOTE_PUB_NEVER;
			else if (!strcmp(optarg, "reuse"))
				c->remote.publish = REMOTE_PUB_REUSE;
			else if (!strcmp(optarg, "evict"))
				c->remote.publish = REMOTE_PUB_EVICT;
			else
				goto bad;
			break;
		case O_DISK_SQPOLL:
			c->disk.sqpoll = 1;
			break;
		case O_COPY_THREADS:
			if (parse_u32(optarg, &c->copy_threads) || c->copy_threads > 64)
				goto bad;
			break;
		case O_COPY_INLINE:
			if (size_parse(optarg, &c->copy_inline))
				goto bad;
			break;
		case O_COPY_DELAY:
			if (parse_u32(optarg, &c->copy_delay_us))
				goto bad;
			break;
		case O_NO_GPU:
			c->gpu = 0;
			break;
		case O_COPY_FAIL:
			if (parse_u32(optarg, &c->copy_fail_every))
				goto bad;
			break;
		case O_GPU_PATH:
			if (!strcmp(optarg, "auto"))
				c->gpu_path = CUDA_PATH_AUTO;
			else if (!strcmp(optarg, "copy"))
				c->gpu_path = CUDA_PATH_COPY;
			else if (!strcmp(optarg, "kernel"))
				c->gpu_path = CUDA_PATH_KERNEL;
			else
				goto bad;
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
		case O_NO_KEEP:
			c->keep = 0;
			break;
		case O_FREE_POOL:
			c->free_pool = 1;
			break;
		case O_TAKEOVER:
			c->takeover = 1;
			break;
		case O_HELP:
		case 'h':
			usage(stdout);
			exit(0);
		case O_VERSION:
			cli_version("kvbrokerd");
			exit(0);
		default: /* cli_getopt() said what */
			return -EINVAL;
		}
	}
	if (optind < argc) {
		cli_usage_error("kvbrokerd", "unexpected argument '%s'", argv[optind]);
		return -EINVAL;
	}
	if (c->disk.paths && !c->disk.size) {
		cli_usage_error("kvbrokerd", "--disk needs --disk-size");
		return -EINVAL;
	}
	/* A disk share with no disk would be a limit that never applies: say so, not ignore it. */
	if (!c->disk.paths) {
		int disk_share = c->tenants.share_disk || c->tenants.share_disk_frac > 0;

		for (uint32_t i = 0; i < c->tenants.nlisted; i++) {
			const char *eq = strchr(c->tenants.listed_arg[i], '=');

			disk_share |= eq && strchr(eq, ',');
		}
		if (disk_share) {
			cli_usage_error("kvbrokerd", "a tenant's disk share (--tenant ID=RAM,DISK, "
						     "--tenant-share RAM,DISK) needs --disk");
			return -EINVAL;
		}
	}
	if (!high)
		high = c->disk.paths ? 90 : 100;
	if (!low)
		low = c->disk.paths ? (high > 10 ? high - 10 : high) : (high < 90 ? high : 90);
	if (low > high) {
		cli_usage_error("kvbrokerd", "--low-watermark above --high-watermark");
		return -EINVAL;
	}
	c->high_wm = high / 100.0;
	c->low_wm = low / 100.0;
	if (!c->pool_bytes)
		c->pool_bytes = default_pool();
	if (!c->slab_bytes)
		c->slab_bytes = plan_default_slab(c->pool_bytes); /* kvbctl plan assumes the same */
	if (c->slab_bytes > c->pool_bytes) {
		cli_usage_error("kvbrokerd", "--slab larger than --pool");
		return -EINVAL;
	}
	if (!c->pool_name[0])
		default_pool_name(c->socket_path, c->pool_name, sizeof(c->pool_name));
	return 0;
bad:
	cli_usage_error("kvbrokerd", "bad value '%s' for --%s", optarg, opts[o - O_SOCKET].name);
	return -EINVAL;
}

/* The signalfd is readable: SIGHUP is a no-op, the others stop the loop. */
static void on_signal(void *arg)
{
	struct broker *b = arg;
	struct signalfd_siginfo si;

	while (read(b->sigfd, &si, sizeof(si)) == sizeof(si)) {
		if (si.ssi_signo == SIGHUP) {
			log_info("SIGHUP: logs go to stderr, nothing to reopen");
			continue;
		}
		if (si.ssi_signo == SIGUSR2) {
			if (!b->keeper && !b->fdstore) {
				log_warn("SIGUSR2 from pid %u: no keeper holds the pool "
					 "(--no-pool-keep): nothing to hand over, running on",
					 si.ssi_pid);
				continue;
			}
			/* [handover] Exit keeping the pool: the keeper (or systemd's fd
			 * store) passes it on. */
			log_info("SIGUSR2 from pid %u: handing the pool over", si.ssi_pid);
			b->handover = 1;
			b->loop.stop = 1;
			continue;
		}
		log_info("signal %u from pid %u: draining and exiting", si.ssi_signo, si.ssi_pid);
		b->loop.stop = 1;
	}
}

/*
 * A ring client costs 6 fds (socket, pidfd, two doorbells, its record's region and ledger), any
 * connection 2: with the usual soft limit of 1024, some 170 clients would attach whatever
 * --max-clients says, and the rest would be refused. Raise the soft limit to what --max-clients
 * needs, up to the hard limit, and say so when even that is short (t_rel_overload: fd_limit).
 */
static void raise_nofile(uint32_t max_clients, uint32_t max_control)
{
	/* [records] ... and 2 more for its record (orphan.c) */
	rlim_t want = ((rlim_t)max_clients + max_control + CONN_SPARE) * 6 + 64;
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
	sigaddset(&set, SIGUSR2);
	if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
		return -errno;
	return signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
}

/*
 * Refuses a new pool larger than the machine can give the broker (memcap.c), before any arena
 * exists: past it, the prefault ends in the OOM killer with nothing in the log. With
 * --pool-overcommit a warning instead. Only a new pool: an adopted one is in memory already.
 * 0 or -ENOMEM (said in the log).
 */
static int pool_fits(struct broker *b, const struct pool_cfg *pc)
{
	struct numa_plan plan[POOL_MAX_PARTS];
	struct numa_topo topo;
	struct memcap_need need;
	struct memcap m;
	char size[32], can[32], why[1024], what[192], fix[160];
	int sized = strchr(pc->numa, ':') != NULL, n;
	double t0 = clock_now(), grew = t0;
	uint64_t max, best = 0;

	numa_topo_probe(&topo);
	n = pool_plan(pc, &topo, plan);
	if (n < 0)
		return 0; /* pool_create says what is wrong with --numa */
	for (int first = 1;; first = 0) {
		struct timespec ts = {0, 50000000};

		memcap_probe(memcap_root(), &m);
		memcap_need(&m, pc->hugepage, plan, (uint32_t)n, &need);
		max = memcap_max_pool(&m, &need);
		if (need.total <= max || !b->freed_kept || b->cfg.pool_overcommit)
			break;
		/*
		 * [keep] A kept pool freed just before (adopt_kept) comes back to the machine only
		 * as its holder lets go: the keeper exits after it answers, systemd closes the fds
		 * after FDSTOREREMOVE, and the kernel frees a big pool's pages over seconds. So look
		 * again while the room still grows; once it stops for half a second, that is all.
		 */
		if (first || max > best) {
			best = max;
			grew = clock_now();
		}
		if (clock_now() - grew > 0.5 || clock_now() - t0 > 60)
			break;
		nanosleep(&ts, NULL);
	}
	memcap_explain(&m, &need, max, why, sizeof(why));
	text_bytes((double)need.total, size, sizeof(size));
	text_bytes((double)max, can, sizeof(can));
	if (sized)
		snprintf(what, sizeof(what), "--numa %s (%s in all)", pc->numa, size);
	else
		snprintf(what, sizeof(what), "--pool %s", size);
	if (need.total <= max) {
		log_info("pool: %s fits: this machine can give the broker %s (%s)", size,
			 max == MEMCAP_NONE ? "what it asks (no limit found)" : can, why);
		return 0;
	}
	if (max >= (1ull << 30))
		snprintf(fix, sizeof(fix), "use %s%lluG or less",
			 sized ? "--numa sizes adding up to " : "--pool ",
			 (unsigned long long)(max >> 30));
	else if (max >= (2ull << 20))
		snprintf(fix, sizeof(fix), "use %s%lluM or less",
			 sized ? "--numa sizes adding up to " : "--pool ",
			 (unsigned long long)(max >> 20));
	else
		snprintf(fix, sizeof(fix), "free memory first");
	if (b->cfg.pool_overcommit) {
		log_warn("%s: this machine can give the broker %s (%s): starting anyway "
			 "(--pool-overcommit)",
			 what, can, why);
		return 0;
	}
	log_error("%s: this machine can give the broker %s (%s): %s, or --pool-overcommit if you "
		  "know better",
		  what, can, why, fix);
	return -ENOMEM;
}

/*
 * Start-up phases, each timed into the log and the stats ("startup"): reserve (arenas created,
 * bound, sealed), prefault (parallel, per node), pin (the copy engines start, and a CUDA engine
 * registers the pool with the driver: xfer_init in main), then the socket listens (ready).
 * Nobody can attach before.
 */
static int start_pool(struct broker *b)
{
	struct pool_cfg pc = {.name = b->cfg.pool_name + 1,
			      .size = b->cfg.pool_bytes,
			      .numa = b->cfg.numa,
			      .hugepage = b->cfg.hugepage,
			      .prefault = b->cfg.prefault,
			      .keep = b->cfg.keep,
			      .dir = b->cfg.dir,
			      .slab_bytes = b->cfg.slab_bytes};
	double t = clock_now();
	int err = tenant_plan(&b->cfg.tenants, b->cfg.pool_bytes, &pc, &b->tt);

	if (!err)
		err = pool_fits(b, &pc);
	if (err)
		return err;
	err = pool_create(&b->pool, &pc);
	b->startup.reserve_s = clock_now() - t;
	if (!err && b->cfg.tenants.mode != TENANTS_NONE)
		log_info("tenants by %s: %u partitions", tenant_mode_name(b->cfg.tenants.mode),
			 b->pool.nparts);
	if (err) {
		log_error("pool (%llu MiB, --numa %s): %s%s", (unsigned long long)(pc.size >> 20),
			  pc.numa, strerror(-err),
			  err == -ENODEV   ? ": a listed node has no memory (see numactl -H)"
			  : err == -EINVAL ? ": bad --numa list"
			  : err == -ENOMEM ? ": the machine cannot hold the pool"
					   : "");
		return err;
	}
	log_info("pool: reserved %llu MiB in %u arena(s) in %.3f s",
		 (unsigned long long)(b->pool.total >> 20), b->pool.narenas, b->startup.reserve_s);
	if (b->cfg.hugepage == HP_MODE_COLLAPSE && !b->cfg.prefault)
		log_warn("pool: --hugepages collapse works at the prefault: with --no-prefault the "
			 "pool stays on 4 KiB pages");
	if (b->cfg.prefault) {
		t = clock_now();
		err = pool_prefault(&b->pool);
		b->startup.prefault_s = clock_now() - t;
		if (err) {
			log_error("pool: prefault: %s: the machine cannot hold the pool",
				  strerror(-err));
			return err;
		}
		log_info("pool: prefaulted %llu MiB in %.3f s (%.2f GiB/s)",
			 (unsigned long long)(b->pool.total >> 20), b->startup.prefault_s,
			 (double)b->pool.total / (1 << 30) / (b->startup.prefault_s + 1e-9));
	}
	return 0;
}

/* [keep] Lets go of a pool we were handed and will not use: who holds it frees it. */
static void drop_kept(struct broker *b, int fdstore, uint32_t nfds)
{
	b->freed_kept = 1; /* its memory comes back soon after (pool_fits) */
	if (fdstore)
		sdn_remove_pool(nfds ? nfds - 1 : 0);
	else
		keeper_release(&b->kl, 1);
}

/*
 * [owner] A live broker owns the pool kept for our socket: we must not start, whatever the
 * files say. Returns -EBUSY for main to exit with.
 */
static int owned_elsewhere(struct broker *b, pid_t owner)
{
	log_error("socket %s: its pool belongs to kvbrokerd pid %d, which runs (its socket or lock "
		  "file was removed or replaced meanwhile; it makes them again within a second): "
		  "not starting a second broker on one pool. Stop pid %d first, or replace it "
		  "with kvbrokerd --takeover",
		  b->cfg.socket_path, (int)owner, (int)owner);
	return -EBUSY;
}

/*
 * [owner] The keeper's fds, the pool's ownership with them. Under --takeover a broker that owns
 * the pool but holds no lock (its lock file was removed) is asked to hand it over, as one that
 * holds the lock is (main). A keeper of an earlier version knows no owner: it is retired once
 * we have its fds, and keep_pool starts one of ours.
 */
static int fetch_kept(struct broker *b, int *fds)
{
	double t0 = clock_now();
	int n = keeper_fetch(b->cfg.socket_path, fds, KEEPER_MAX_FDS, &b->kl);
	pid_t owner = b->kl.pid, none;

	if (n == -EBUSY && b->cfg.takeover && owner > 0) {
		log_info("takeover: asking kvbrokerd pid %d, which owns the pool, to hand it over",
			 (int)owner);
		if (kill(owner, SIGUSR2) < 0)
			log_warn("takeover: pid %d: %s", (int)owner, strerror(errno));
		while (n == -EBUSY && clock_now() - t0 < 60)
			n = keeper_fetch(b->cfg.socket_path, fds, KEEPER_MAX_FDS, &b->kl);
		owner = b->kl.pid;
	}
	if (n == -EBUSY)
		return owned_elsewhere(b, owner);
	if (n > 0 && b->kl.fd < 0 && keeper_free(b->cfg.socket_path, &none) == 0)
		log_info("adopt: retired a keeper of an earlier version: ours replaces it");
	return n;
}

/*
 * [keep] The pool kept for this socket, adopted (1), none (0: start cold), or -EBUSY: a live
 * broker owns it (keeper.c [owner]; its files were removed, or it was started outside this
 * unit), and we must not start. A pool that cannot be adopted (another slab size, a damaged
 * side table) is freed: the flags changed, so the operator asked for a new one.
 *
 * [fdstore] Precedence: fds systemd passed back (LISTEN_FDS, sdnotify.c) first, then a keeper.
 * The service manager outlives every broker and hands its store back on each start of the
 * unit, so under systemd it is the record of the pool; a keeper that also answers can only be
 * left from a run outside the unit (or before an upgrade to the fd store) and is freed, so that
 * one pool, not two, stays pinned in RAM. A keeper's pool adopted under a manager that has a
 * store moves into the store (keep_pool), and the keeper is retired.
 */
static int adopt_kept(struct broker *b)
{
	int fds[KEEPER_MAX_FDS], n = sdn_listen_pool(fds, KEEPER_MAX_FDS), err, fdstore = n > 0;
	const char *from = fdstore ? "systemd's fd store" : "the keeper";
	double t = clock_now();
	pid_t owner;

	if (fdstore) {
		err = keeper_free(b->cfg.socket_path, &owner);
		if (!err)
			log_warn("a keeper also held a pool for %s: freed it (systemd's fd store "
				 "has precedence)",
				 b->cfg.socket_path);
		if (err == -EBUSY)
			return owned_elsewhere(b, owner);
	} else {
		n = fetch_kept(b, fds);
		if (n == -EBUSY)
			return -EBUSY;
	}
	if (n == -ENOENT || n == 0)
		return 0;
	if (n < 0) {
		log_warn("keeper of %s: %s: starting with a new pool", b->cfg.socket_path,
			 strerror(-n));
		return 0;
	}
	if (!b->cfg.keep) {
		log_info("--no-pool-keep: freeing the pool a previous broker left (%s)", from);
		for (int i = 0; i < n; i++)
			close(fds[i]);
		drop_kept(b, fdstore, (uint32_t)n);
		return 0;
	}
	err = pool_adopt(&b->pool, fds, (uint32_t)n, b->cfg.slab_bytes);
	if (err) {
		log_warn("the pool from %s (socket %s) cannot be adopted (%s%s): freeing it, "
			 "starting with a new pool",
			 from, b->cfg.socket_path, strerror(-err),
			 err == -EXDEV	  ? ": another --slab size"
			 : err == -EINVAL ? ": the fds are not the side table and arenas it "
					    "describes"
					  : "");
		drop_kept(b, fdstore, (uint32_t)n);
		return 0;
	}
	/* [tenant-part] The partitions come with the pool; --tenants must cut the same number. */
	{
		struct pool_cfg pc = {.size = b->cfg.pool_bytes};

		err = tenant_plan(&b->cfg.tenants, b->cfg.pool_bytes, &pc, &b->tt);
		if (err) {
			pool_close(&b->pool);
			return 0; /* start_pool says what is wrong */
		}
		if (b->tt.n != b->pool.nparts) {
			log_warn("the pool from %s (socket %s) has %u tenant partition(s), "
				 "--tenants wants %u: freeing it, starting with a new pool",
				 from, b->cfg.socket_path, b->pool.nparts, b->tt.n);
			pool_close(&b->pool);
			drop_kept(b, fdstore, (uint32_t)n);
			return 0;
		}
		log_info("adopt: %u arena(s) in %u tenant partition(s), from %s", b->pool.narenas,
			 b->pool.nparts, from);
	}
	b->startup.reserve_s = clock_now() - t;
	if (b->pool.total != b->cfg.pool_bytes)
		log_info("adopt: the kept pool is %llu MiB in %u arena(s) (--pool says %llu MiB): "
			 "kept as it is; --free-pool (or a clean stop) then a start resizes it",
			 (unsigned long long)(b->pool.total >> 20), b->pool.narenas,
			 (unsigned long long)(b->cfg.pool_bytes >> 20));
	b->keeper = !fdstore && b->kl.fd >= 0;
	b->fdstore = fdstore; /* the store still holds these fds: nothing to send again */
	return 1;
}

/*
 * [keep] Has the pool kept for the next broker: in systemd's fd store when the unit has one
 * ($FDSTORE large enough: FileDescriptorStoreMax=), else by a keeper process. Before any other
 * thread exists (keeper_spawn forks). A keeper's pool adopted under such a unit moves into the
 * store: the keeper is then told to exit.
 */
static void keep_pool(struct broker *b)
{
	int fds[KEEPER_MAX_FDS], err;
	uint32_t n = pool_handover_fds(&b->pool, fds);

	if (b->fdstore || !n)
		return;
	/* [records] Room for the pool and three fds for every client's record (orphan.c). */
	if (sdn_fdstore_ok(n + KEEPER_REC_FDS * (b->cfg.max_clients + b->cfg.max_control))) {
		err = sdn_store_pool(fds, n);
		if (!err) {
			log_info("pool kept in systemd's fd store (%u fds): no keeper", n);
			b->fdstore = 1;
			if (b->keeper && !keeper_release(&b->kl, 1))
				log_info("pool keeper retired: systemd's fd store holds the pool");
			b->keeper = 0;
			return;
		}
		log_warn("FDSTORE=1 on $NOTIFY_SOCKET: %s: a keeper keeps the pool instead",
			 strerror(-err));
	} else if (sdn_enabled() && !b->keeper) {
		log_info("$NOTIFY_SOCKET without $FDSTORE >= %u (FileDescriptorStoreMax=, systemd "
			 ">= 254): a keeper keeps the pool",
			 n);
	}
	if (b->keeper)
		return;
	err = keeper_spawn(b->cfg.socket_path, fds, n, &b->kl);
	if (err)
		log_warn("pool keeper: %s: the pool will not survive a crash", strerror(-err));
	b->keeper = !err;
}

/* kvbrokerd --free-pool: what --help promises. */
static int free_pool(struct broker *b)
{
	pid_t owner;
	int fd = instance_lock(b->cfg.socket_path, &owner), err;

	if (fd < 0) {
		log_error("socket %s: %s%s (pid %d): stop it instead, a clean stop frees its pool",
			  b->cfg.socket_path, strerror(-fd),
			  fd == -EBUSY ? ": a live kvbrokerd owns it" : "", (int)owner);
		return 1;
	}
	err = keeper_free(b->cfg.socket_path, &owner);
	if (err == -EBUSY)
		log_error("the pool kept for %s belongs to kvbrokerd pid %d, which runs (its lock "
			  "file was removed): stop it instead, a clean stop frees its pool",
			  b->cfg.socket_path, (int)owner);
	else if (err)
		log_error("no pool is kept for %s (%s)", b->cfg.socket_path, strerror(-err));
	else
		log_info("freed the pool kept for %s", b->cfg.socket_path);
	instance_unlock(b->cfg.socket_path, fd);
	return err ? 1 : 0;
}

/*
 * The socket's directory may not be made or written by this uid: most often a user without
 * root starting a broker on the default socket, in /run. Say what to do instead.
 */
static void socket_denied(const char *sock)
{
	log_error("socket %s: permission denied creating it, its lock file or its directory: run "
		  "as root (%s, the default, is in /run), or give --socket a path in a directory "
		  "you may write, e.g. --socket $XDG_RUNTIME_DIR/kvbroker.sock, and clients the "
		  "same path (KVB_SOCKET=PATH, kvbctl --socket PATH)",
		  sock, KVB_SOCKET_DEFAULT);
}

int main(int argc, char **argv)
{
	static struct broker b;
	struct loop_hooks hooks;
	struct list *pos, *tmp;
	pid_t owner;
	double t;
	int err, made_dir;

	if (argc == 4 && !strcmp(argv[1], "--keeper")) /* PATH: for ps; it asks its socket */
		return keeper_main(atoi(argv[2]));
	if (parse_args(argc, argv, &b.cfg))
		return 2;
	list_init(&b.sessions);
	list_init(&b.graveyard);
	list_init(&b.orphans);
	b.run_id = orphan_run_id();
	b.listen_fd = b.loop.epfd = b.sigfd = b.kl.fd = -1;
	b.start_time = clock_now();
	/*
	 * Not dumpable: processes of our uid can then neither ptrace us nor reopen our fds through
	 * /proc/<pid>/fd, which would hand them a writable pool.
	 */
	prctl(PR_SET_DUMPABLE, 0);
	raise_nofile(b.cfg.max_clients, b.cfg.max_control);
	b.spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

	/* First, before any work: a second broker on this socket stops here. */
	err = instance_dir(b.cfg.socket_path, b.cfg.has_group, b.cfg.group);
	if (err < 0) {
		if (err == -EACCES || err == -EPERM)
			socket_denied(b.cfg.socket_path);
		else
			log_error("socket directory of %s: %s", b.cfg.socket_path, strerror(-err));
		return 1;
	}
	made_dir = err;
	b.lock_fd = instance_lock(b.cfg.socket_path, &owner);
	/*
	 * A broker killed while it started a keeper leaves a copy of its lock's fd in that child
	 * until the child's exec closes it (t_rel_crash saw it once): a dead owner's lock is
	 * waited for, briefly.
	 */
	for (int i = 0;
	     b.lock_fd == -EBUSY && owner > 0 && i < 300 && kill(owner, 0) < 0 && errno == ESRCH;
	     i++) {
		struct timespec ts = {0, 10000000};

		if (!i)
			log_info("socket %s: the lock of pid %d, which is gone, is still held: "
				 "waiting up to 3 s",
				 b.cfg.socket_path, (int)owner);
		nanosleep(&ts, NULL);
		b.lock_fd = instance_lock(b.cfg.socket_path, &owner);
	}
	if (b.lock_fd == -EBUSY && b.cfg.takeover && owner > 0 && !b.cfg.free_pool) {
		/* [handover] The running broker drains and exits; its lock goes last. */
		double t0 = clock_now();

		log_info("takeover: asking kvbrokerd pid %d to hand its pool over", (int)owner);
		if (kill(owner, SIGUSR2) < 0)
			log_warn("takeover: pid %d: %s", (int)owner, strerror(errno));
		while (b.lock_fd == -EBUSY && clock_now() - t0 < 60) {
			struct timespec ts = {0, 1000000};

			nanosleep(&ts, NULL);
			b.lock_fd = instance_lock(b.cfg.socket_path, &owner);
		}
		b.handover_wait_s = clock_now() - t0;
		log_info("takeover: the old broker was gone after %.3f s", b.handover_wait_s);
	}
	if (b.lock_fd == -EACCES || b.lock_fd == -EPERM) {
		socket_denied(b.cfg.socket_path);
		return 1;
	}
	if (b.lock_fd < 0) {
		log_error("socket %s: %s%s (lock file %s.lock, pid %d)", b.cfg.socket_path,
			  strerror(-b.lock_fd),
			  b.lock_fd == -EBUSY ? ": another kvbrokerd owns it" : "",
			  b.cfg.socket_path, (int)owner);
		return 1;
	}
	if (b.cfg.free_pool) {
		instance_unlock(b.cfg.socket_path, b.lock_fd);
		return free_pool(&b);
	}
	err = adopt_kept(&b);
	if (err < 0)
		goto out_pool;
	(void)orphan_load(&b); /* [orphans] before keep_pool may retire the keeper */
	if (!err) {
		err = start_pool(&b);
		if (err)
			goto out_pool;
	}
	if (b.cfg.keep)
		keep_pool(&b);	    /* before any other thread exists (a keeper forks) */
	b.pool.no_dir = !b.cfg.dir; /* [dir] an adopted pool's directory is wiped, then unused */
	err = store_init(&b.store, &b.pool, b.cfg.slab_bytes, b.cfg.high_wm, b.cfg.low_wm);
	if (err) {
		log_error("store: %s", strerror(-err));
		goto out_pool;
	}
	ops_init(&b); /* after store_init: it hooks the store's page-wake */
	if (b.pool.adopted) {
		err = adopt_pool(&b);
		if (err) {
			log_error("adopt: %s", strerror(-err));
			goto out_store;
		}
	}
	b.sigfd = setup_signals();
	rounds_hooks(&b, &hooks);
	if (b.sigfd < 0 || loop_init(&b.loop, b.cfg.poll_us * 1e-6, &hooks)) {
		log_error("start-up: out of resources");
		err = -ENOMEM;
		goto out_store;
	}
	b.bg = bg_start(); /* NULL: clients' memory is unmapped inline, never populated */
	/* [pin] The copy engines start; a CUDA engine registers the pool with the driver. */
	t = clock_now();
	err = xfer_init(&b);
	b.startup.pin_s = clock_now() - t;
	if (err) {
		log_error("copy engines: %s", strerror(-err));
		goto out_store;
	}
	log_info("pool: pinned in %.3f s (%s)", b.startup.pin_s,
		 b.gpu ? "registered with CUDA" : "no GPU copy engine: nothing to pin");
	/* A warm restart scans the cache file here: clients are answered only after it. */
	if (b.cfg.disk.paths) {
		err = tier_open(&b, &b.cfg.disk);
		if (err) {
			log_error("disk tier: %s", strerror(-err));
			goto out_store;
		}
	}
	if (b.cfg.remote.url) {
		/* Connects without waiting: until the cluster answers, remote lookups miss. */
		err = remote_open(&b, &b.cfg.remote);
		if (err) {
			log_error("--remote %s: %s", b.cfg.remote.url, strerror(-err));
			goto out_store;
		}
	}
	b.listen_fd = instance_listen(b.cfg.socket_path, b.cfg.has_group, b.cfg.group);
	if (b.listen_fd < 0) {
		err = b.listen_fd;
		log_error("socket %s: %s%s", b.cfg.socket_path, strerror(-err),
			  err == -EADDRINUSE ? ": another kvbrokerd answers there" : "");
		goto out_store;
	}
	/* After setup_signals(): the HTTP thread inherits the blocked signals. */
	if (b.cfg.metrics_listen[0]) {
		err = metrics_http_start(b.cfg.metrics_listen, &b.metrics);
		if (err) {
			log_error("--metrics-listen %s: %s", b.cfg.metrics_listen, strerror(-err));
			goto out_sock;
		}
		snprintf(b.metrics_addr, sizeof(b.metrics_addr), "%s",
			 metrics_http_addr(b.metrics));
		log_info("metrics: http://%s/metrics", b.metrics_addr);
		metrics_http_tick(&b);
	}
	b.on_listen = (struct loop_fd){.fn = session_on_listen, .arg = &b};
	b.on_signal = (struct loop_fd){.fn = on_signal, .arg = &b};
	err = loop_add(&b.loop, b.listen_fd, &b.on_listen);
	if (!err)
		err = loop_add(&b.loop, b.sigfd, &b.on_signal);
	if (err)
		goto out_sock;
	watch_start(&b);
	orphan_start(&b); /* [orphans] what the previous broker's clients lease, watched */
	b.startup.ready_s = clock_now() - b.start_time;
	log_info("kvbrokerd %s ready in %.3f s (reserve %.3f s, prefault %.3f s, pin %.3f s): "
		 "socket %s, pool %s %llu MiB in %u arena(s), %u slabs of %llu MiB, "
		 "copy engine %s (%u threads) + %s, poll %u us",
		 KVB_VERSION_STRING, b.startup.ready_s, b.startup.reserve_s, b.startup.prefault_s,
		 b.startup.pin_s, b.cfg.socket_path, b.cfg.pool_name,
		 (unsigned long long)(b.pool.total >> 20), b.pool.narenas, b.store.nslabs,
		 (unsigned long long)(b.cfg.slab_bytes >> 20), b.copy->name, b.cfg.copy_threads,
		 b.gpu ? b.gpu->name : "no GPU", b.cfg.poll_us);
	/* [fdstore] Type=notify: systemd counts the broker started from here. */
	if (sdn_enabled()) {
		char msg[400];

		snprintf(msg, sizeof(msg),
			 "READY=1\nSTATUS=serving %s: pool %llu MiB in %u arena(s)%s, kept by %s",
			 b.cfg.socket_path, (unsigned long long)(b.pool.total >> 20),
			 b.pool.narenas, b.pool.adopted ? " (adopted)" : "",
			 b.fdstore  ? "systemd's fd store"
			 : b.keeper ? "a keeper process"
				    : "nobody (dies with the broker)");
		err = sdn_send(msg, NULL, 0);
		if (err)
			log_warn("READY=1 on $NOTIFY_SOCKET: %s", strerror(-err));
	}
	err = loop_run(&b.loop);
	if (sdn_enabled())
		sdn_send(b.handover ? "STOPPING=1\nSTATUS=handing the pool over"
				    : "STOPPING=1\nSTATUS=draining, then freeing the pool",
			 NULL, 0);
	list_for_each_safe (pos, tmp, &b.sessions)
		session_destroy(&b, list_entry(pos, struct session, link), NULL);
	xfer_fini(&b);	  /* in-flight copies finish, their dead sessions' counts drop to 0 */
	tier_close(&b);	  /* writes what is only in RAM, completes parked ops */
	remote_close(&b); /* requests in flight are cancelled: their pages abort */
	session_reap(&b);
	log_info("stopped: %llu puts, %llu gets, %llu dedup, %llu evictions",
		 (unsigned long long)b.ctr.puts, (unsigned long long)b.ctr.gets,
		 (unsigned long long)b.ctr.dedup, (unsigned long long)b.store.st.evictions);
out_sock:
	metrics_http_stop(b.metrics);
	close(b.listen_fd);
	if (instance_is(b.cfg.socket_path, -1, &b.watch.sock)) /* ours, not a successor's */
		unlink(b.cfg.socket_path);
out_store:
	orphan_fini(&b); /* [orphans] their pins; handed over, their records stay kept */
	remote_close(&b);
	loop_fini(&b.loop);
	if (b.sigfd >= 0)
		close(b.sigfd);
	xfer_fini(&b);
	ops_fini(&b);  /* after the last op completed */
	bg_stop(b.bg); /* after the last session: its unmaps are queued */
	if (b.spare_fd >= 0)
		close(b.spare_fd);
	ns_table_fini(&b.nst);
	store_fini(&b.store);
out_pool:
	/* [keep] A clean exit (or a failed start) frees the pool: only a crash or a hand-over
	 * leaves it. Our end of the keeper's connection closes before the lock goes: a
	 * successor that takes the lock finds the pool without an owner. */
	if (b.handover)
		log_info("handed over: the pool stays with its keeper for the next broker");
	if (b.handover || !b.keeper)
		keeper_release(&b.kl, 0);
	else if (keeper_release(&b.kl, 1))
		log_warn("pool keeper of %s did not answer: free it with --free-pool",
			 b.cfg.socket_path);
	if (!b.handover && b.fdstore)
		sdn_remove_pool(b.pool.narenas); /* [fdstore] FDSTOREREMOVE=1 of each */
	pool_close(&b.pool);
	instance_unlock(b.cfg.socket_path, b.lock_fd);
	if (err && made_dir)
		instance_dir_remove(b.cfg.socket_path);
	return err ? 1 : 0;
}
