// SPDX-License-Identifier: MIT
/*
 * options.c - kvbrokerd's settings in one table, as Redis's config.c declares its options:
 * each entry says the name, the value it takes, how it is read and stored into struct config,
 * its help, and whether it is a test-only knob (hidden from --help, shown by --help-all) or a
 * command that acts once (--takeover, --free-pool: command line only). From the table come:
 *
 *   - the command line (cli_getopt(): full names only, the nearest name suggested);
 *   - --help and --help-all, wrapped to 80 columns;
 *   - the config file, --config FILE: one setting a line, "name = value", "name value" or
 *     "--name=value", with the long option names; "#" comments; a flag alone or "= yes|no".
 *     The file is read first wherever --config stands, so the command line wins; repeatable
 *     options (--tenant, --ns-limit) add up. An error names FILE:LINE, the cause and the fix;
 *   - the "config" section of the STATS document (kvbctl status): each setting's value and
 *     where it came from.
 *
 * Sizes and durations are read by common/size.c and common/duration.c, as in every program.
 * A bare duration counts in the unit the option's name says (--poll-us, --remote-timeout in
 * ms, seconds for the others), so existing command lines keep their meaning.
 * Start-up (main thread) only, but options_json(), which the loop thread calls.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <grp.h>
#include <openssl/evp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include "broker.h"
#include "cli.h"
#include "copy_cuda.h"
#include "duration.h"
#include "hugepage.h"
#include "log.h"
#include "options.h"
#include "parse.h"
#include "plan.h"
#include "proto.h"
#include "size.h"

#define PROG "kvbrokerd"

enum opt_kind {
	K_STR,	/* char[size] at off, copied */
	K_STRP, /* const char * at off, pointing at a copy the config owns */
	K_U32,	/* uint32_t at off, min..max */
	K_SIZE, /* uint64_t (size 8) or uint32_t (size 4) at off, min..max bytes */
	K_DUR,	/* double seconds (size 8) or uint32_t in unit (size 4), min..max ns */
	K_FLAG, /* int at off set to min */
	K_FN,	/* set() reads it */
	K_CMD,	/* --help, --help-all, --version, --config */
};

#define OPTF_TEST 1u	/* a test-only knob: --help-all shows it, --help does not */
#define OPTF_REPEAT 2u	/* may be given several times; the values add up */
#define OPTF_CMDLINE 4u /* acts once (a command): not in a config file */
#define OPTF_POW2 8u	/* K_U32: a power of two */

struct opt_def {
	const char *name;
	const char *arg; /* the value's name in help ("SIZE"); NULL: takes none */
	uint8_t kind;
	uint8_t flags;
	uint16_t off, size; /* the field in struct config */
	uint64_t min, max;  /* K_U32, K_SIZE, K_DUR (ns); K_FLAG: the value set */
	uint64_t unit;	    /* K_DUR: ns of a bare number and of a uint32_t field */
	int (*set)(struct config *c, const char *arg);
	const char *def;  /* the default as status shows it, where the field cannot say */
	const char *hint; /* what a good value looks like, for errors */
	const char *help;
};

#define F(field) offsetof(struct config, field), sizeof(((struct config *)0)->field)

/* ---- the settings that take more than a type and a range ---- */

static int set_socket(struct config *c, const char *a)
{
	if (!*a || strlen(a) >= sizeof(c->socket_path))
		return -EINVAL;
	strcpy(c->socket_path, a);
	return 0;
}

static int set_pool_name(struct config *c, const char *a)
{
	if (a[0] != '/' || strchr(a + 1, '/') || strlen(a) >= sizeof(c->pool_name) - 8)
		return -EINVAL;
	strcpy(c->pool_name, a);
	return 0;
}

static int set_slab(struct config *c, const char *a)
{
	uint64_t v;

	if (size_parse(a, &v) || v < (1u << 20) || v % STORE_SLOT_ALIGN)
		return -EINVAL;
	c->slab_bytes = v;
	return 0;
}

static int set_pct(const char *a, uint32_t *pct)
{
	return parse_u32(a, pct) || !*pct || *pct > 100 ? -EINVAL : 0;
}

static int set_high(struct config *c, const char *a)
{
	return set_pct(a, &c->high_pct);
}

static int set_low(struct config *c, const char *a)
{
	return set_pct(a, &c->low_pct);
}

static int set_max_pinned(struct config *c, const char *a)
{
	uint32_t pct;

	if (set_pct(a, &pct))
		return -EINVAL;
	c->max_pinned = pct / 100.0;
	return 0;
}

static int set_metrics(struct config *c, const char *a)
{
	if (!*a || strlen(a) >= sizeof(c->metrics_listen))
		return -EINVAL;
	strcpy(c->metrics_listen, a);
	return 0;
}

static int set_numa(struct config *c, const char *a)
{
	if (!*a || strlen(a) >= sizeof(c->numa))
		return -EINVAL;
	strcpy(c->numa, a);
	return 0;
}

static int set_hugepages(struct config *c, const char *a)
{
	int m = hugepage_parse(a);

	if (m < 0)
		return -EINVAL;
	c->hugepage = (enum hp_mode)m;
	return 0;
}

static int set_tenants(struct config *c, const char *a)
{
	return tenant_parse_mode(a, &c->tenants.mode) ? -EINVAL : 0;
}

/* a is the config's own copy (seen[]), which outlives the broker's use of it. */
static int set_tenant(struct config *c, const char *a)
{
	if (c->tenants.nlisted == POOL_MAX_PARTS)
		return -EINVAL;
	c->tenants.listed_arg[c->tenants.nlisted++] = (char *)(uintptr_t)a;
	return 0;
}

static int set_tenant_share(struct config *c, const char *a)
{
	return tenant_parse_share(a, &c->tenants) ? -EINVAL : 0;
}

static int set_ns_limit(struct config *c, const char *a)
{
	if (c->n_ns_limits == NS_LIMITS_MAX || ns_limit_parse(a, &c->ns_limits[c->n_ns_limits]))
		return -EINVAL;
	c->n_ns_limits++;
	return 0;
}

static int set_max_lease_bytes(struct config *c, const char *a)
{
	size_t n = strlen(a);
	uint64_t v;

	if (n > 1 && a[n - 1] == '%') {
		char pct[16];
		uint32_t p;

		if (n > sizeof(pct))
			return -EINVAL;
		memcpy(pct, a, n - 1);
		pct[n - 1] = '\0';
		if (set_pct(pct, &p))
			return -EINVAL;
		c->max_lease_frac = p / 100.0;
		c->max_lease_bytes = 0;
		return 0;
	}
	if (size_parse(a, &v) || !v)
		return -EINVAL;
	c->max_lease_bytes = v;
	c->max_lease_frac = 0;
	return 0;
}

static int set_group(struct config *c, const char *a)
{
	struct group *g = getgrnam(a);

	if (!g)
		return -ENOENT;
	c->group = g->gr_gid;
	c->has_group = 1;
	return 0;
}

static int set_remote_prefix(struct config *c, const char *a)
{
	/* A brace would make a hash tag: every page on one shard. */
	if (strlen(a) >= sizeof(c->remote.prefix) || strpbrk(a, "{}"))
		return -EINVAL;
	strcpy(c->remote.prefix, a);
	return 0;
}

/* name -> value, for the few settings that are one word of a list. */
struct word {
	const char *name;
	int val;
};

static int set_word(const struct word *w, const char *a, int *out)
{
	for (; w->name; w++)
		if (!strcmp(w->name, a))
			return *out = w->val, 0;
	return -EINVAL;
}

static const struct word publish_words[] = {{"put", REMOTE_PUB_PUT},
					    {"never", REMOTE_PUB_NEVER},
					    {"reuse", REMOTE_PUB_REUSE},
					    {"evict", REMOTE_PUB_EVICT},
					    {NULL, 0}};
static const struct word gpu_path_words[] = {{"auto", CUDA_PATH_AUTO},
					     {"copy", CUDA_PATH_COPY},
					     {"kernel", CUDA_PATH_KERNEL},
					     {NULL, 0}};

static int set_publish(struct config *c, const char *a)
{
	return set_word(publish_words, a, &c->remote.publish);
}

static int set_gpu_path(struct config *c, const char *a)
{
	return set_word(gpu_path_words, a, &c->gpu_path);
}

static int set_log_level(struct config *c, const char *a)
{
	int lvl = log_parse_level(a);

	(void)c;
	if (lvl < 0)
		return -EINVAL;
	log_min_level = lvl;
	return 0;
}

/* ---- the table ---- */

#define SIZE_HINT "a size such as 64G (G = GiB; GB = 10^9 bytes)"

static const struct opt_def opts[] = {
	{"config", "FILE", K_CMD, OPTF_CMDLINE, 0, 0, 0, 0, 0, NULL, NULL, NULL,
	 "read settings from FILE first, one a line in the names below: \"pool = 64G\", "
	 "\"no-prefault\" (docs/operations.md); the command line wins over it"},
	{"socket", "PATH", K_FN, 0, 0, 0, 0, 0, 0, set_socket, "$KVB_SOCKET or " KVB_SOCKET_DEFAULT,
	 "a path of at most 107 bytes",
	 "control socket (default $KVB_SOCKET, else " KVB_SOCKET_DEFAULT ", whoever runs it: "
	 "clients look there by the same rule; its directory is made 0750, group --group, if "
	 "missing)"},
	{"pool", "SIZE", K_SIZE, 0, F(pool_bytes), 1, UINT64_MAX, 0, NULL, NULL, SIZE_HINT,
	 "RAM pool size (default 1/16 of RAM, 64M..4G). A new pool larger than the machine can "
	 "give the broker (MemAvailable, its memory cgroup, RLIMIT_AS, less a headroom; hugetlb "
	 "pages apart) is refused before any memory is touched (docs/operations.md)"},
	{"pool-overcommit", NULL, K_FLAG, 0, F(pool_overcommit), 1, 0, 0, NULL, NULL, NULL,
	 "start with such a pool anyway, with a warning (memory that something else frees first, "
	 "swap on purpose)"},
	{"pool-name", "/NAME", K_FN, 0, F(pool_name), 0, 0, 0, set_pool_name, NULL,
	 "/NAME, one slash, at most 71 bytes",
	 "name of the pool's memfds, shown in /proc/PID/maps (default derived from the socket)"},
	{"numa", "MODE", K_FN, 0, F(numa), 0, 0, 0, set_numa, NULL,
	 "auto, off, interleave, 0,1 or 0:64G,1:32G",
	 "auto (one arena per NUMA node with memory, sized in proportion), off, interleave, or a "
	 "node list: 0,1 or 0:64G,1:32G (sizes replace --pool) (default auto)"},
	{"hugepages", "MODE", K_FN, 0, 0, 0, 0, 0, 0, set_hugepages, "auto",
	 "auto, 2M, 1G, off or collapse",
	 "auto, 2M, 1G, off or collapse: hugetlb pages when enough are free, else transparent "
	 "huge pages where shmem allows them, else 4 KiB pages (default auto); collapse: no "
	 "hugetlb, 4 KiB pages made into 2 MiB ones at the prefault (Linux 6.1; about 1 s more "
	 "per GiB)"},
	{"slab", "SIZE", K_FN, 0, F(slab_bytes), 0, 0, 0, set_slab, NULL,
	 "a multiple of 4K, at least 1M",
	 "slab size; the largest page must fit (default pool/32 clamped to 8M..64M)"},
	{"high-watermark", "PCT", K_FN, 0, 0, 0, 0, 0, 0, set_high, NULL, "1 to 100",
	 "evict in the background above this pool use, down to the low watermark (default 100: "
	 "with RAM as the only tier, pages are evicted on demand, coldest first, only when a PUT "
	 "finds the pool full; 90 with --disk, so that demotion runs ahead of demand)"},
	{"low-watermark", "PCT", K_FN, 0, 0, 0, 0, 0, 0, set_low, NULL, "1 to 100",
	 "background eviction stops here (default 90; 80 with --disk)"},
	{"disk", "PATH[,PATH...]", K_STRP, 0, F(disk.paths), 0, 0, 0, NULL, NULL,
	 "one or more paths, comma-separated",
	 "NVMe tier: cold pages are demoted to these files or block devices (O_DIRECT, "
	 "io_uring), pages striped across them; an existing cache of the same geometry is "
	 "adopted (warm restart)"},
	{"disk-size", "SIZE", K_SIZE, 0, F(disk.size), 1, UINT64_MAX, 0, NULL, NULL, SIZE_HINT,
	 "bytes of disk cache in all, split across the paths (required with --disk; block "
	 "devices: at most their size)"},
	{"disk-qd", "N", K_U32, 0, F(disk.qd), 1, 4096, 0, NULL, NULL, NULL,
	 "page I/Os in flight (default 64)"},
	{"disk-sqpoll", NULL, K_FLAG, 0, F(disk.sqpoll), 1, 0, 0, NULL, NULL, NULL,
	 "io_uring SQPOLL: a kernel thread submits (costs a CPU)"},
	{"remote", "URL", K_STRP, 0, F(remote.url), 0, 0, 0, NULL, NULL,
	 "redis://HOST:PORT[,HOST:PORT...]",
	 "share pages across nodes through a Redis Cluster: redis://HOST:PORT[,HOST:PORT...] "
	 "(seed nodes)"},
	{"remote-prefix", "P", K_FN, 0, F(remote.prefix), 0, 0, 0, set_remote_prefix, NULL,
	 "at most 31 bytes, no { or }", "prefix of every key there (default \"kvb:\")"},
	{"remote-timeout", "MS", K_DUR, 0, F(remote.timeout), DUR_MS, 60000 * DUR_MS, DUR_MS, NULL,
	 NULL, "1 to 60000 ms, or a duration such as 0.5s",
	 "deadline of a remote lookup or fetch (default 200)"},
	{"remote-inflight", "SIZE", K_SIZE, 0, F(remote.max_inflight), 1, UINT64_MAX, 0, NULL, NULL,
	 SIZE_HINT, "value bytes on the wire at most (default 256M)"},
	{"remote-publish", "WHEN", K_FN, 0, 0, 0, 0, 0, 0, set_publish, "put",
	 "put, reuse, evict or never",
	 "put (publish each page a PUT stores, default), reuse (at its first GET or ACQUIRE hit "
	 "here), evict (as it leaves RAM) or never"},
	{"poll-us", "N", K_DUR, 0, F(poll_us), 0, UINT32_MAX *DUR_US, DUR_US, NULL, NULL,
	 "microseconds, or a duration such as 1ms",
	 "busy-poll the rings this long after the last op (default 200)"},
	{"metrics-listen", "ADDR", K_FN, 0, F(metrics_listen), 0, 0, 0, set_metrics, NULL,
	 "HOST:PORT or PORT",
	 "serve Prometheus metrics at http://ADDR/metrics; ADDR is HOST:PORT or PORT "
	 "(loopback), e.g. 127.0.0.1:9464"},
	{"max-clients", "N", K_U32, 0, F(max_clients), 1, UINT32_MAX, 0, NULL, NULL, NULL,
	 "attached clients (default 1024)"},
	{"max-control", "N", K_U32, 0, F(max_control), 1, UINT32_MAX, 0, NULL, NULL, NULL,
	 "control-only connections such as kvbctl, apart from --max-clients (default 64)"},
	{"control-idle", "SECS", K_DUR, 0, F(control_idle), 0, UINT32_MAX *DUR_S, DUR_S, NULL, NULL,
	 "seconds, or a duration such as 2m",
	 "close control connections silent this long (default 120; 0: never)"},
	{"max-leases", "N", K_U32, 0, F(max_leases), 0, UINT32_MAX, 0, NULL, NULL, NULL,
	 "leases one client may hold (default 65536)"},
	{"max-lease-bytes", "SIZE|N%", K_FN, 0, 0, 0, 0, 0, 0, set_max_lease_bytes, "12%",
	 "a size such as 8G, or 1% to 100%",
	 "page bytes one client may hold leased (default 12% of its tenant's pool): -EDQUOT past "
	 "it"},
	{"max-pinned", "PCT", K_FN, 0, 0, 0, 0, 0, 0, set_max_pinned, "50", "1 to 100",
	 "leases of all clients pin at most this much of a pool (partition), so a PUT always "
	 "finds room (default 50): -EBUSY past it"},
	{"lease-lifetime", "SECS", K_DUR, 0, F(lease_lifetime), 0, UINT32_MAX *DUR_S, DUR_S, NULL,
	 NULL, "seconds, or a duration such as 10m",
	 "a client holding a lease longer is disconnected (default 600; 0: never)"},
	{"tenants", "none|uid|gid", K_FN, 0, 0, 0, 0, 0, 0, set_tenants, "none", "none, uid or gid",
	 "isolate clients by uid or primary gid: own namespaces, own pool partition (memfds), "
	 "own eviction (default none)"},
	{"tenant", "ID=RAM[,DISK]", K_FN, OPTF_REPEAT, 0, 0, 0, 0, 0, set_tenant, NULL,
	 "ID=RAM[,DISK], at most 8",
	 "a tenant's (user or group, name or number) share of the pool and of the --disk tier, "
	 "each SIZE or N% (default disk share: in proportion to RAM); repeatable"},
	{"tenant-share", "RAM[,DISK]", K_FN, 0, 0, 0, 0, 0, 0, set_tenant_share, NULL,
	 "SIZE or N%, optionally ,SIZE or ,N%",
	 "the share of each tenant not listed (default: the rest of the pool in 4 shares), its "
	 "guarantee from its first attach; capacity a tenant does not use is lent to the others"},
	{"tenant-idle", "DURATION", K_DUR, 0, F(tenants.idle_s), 0, UINT32_MAX *DUR_S, DUR_S, NULL,
	 NULL, "seconds, or a duration such as 10m",
	 "a tenant's share is released this long after its last client left: its pages stay "
	 "while the pool has room and go first when another tenant needs it (default 10m; 0: "
	 "at once)"},
	{"ns-limit", "MODEL=SIZE|N%", K_FN, OPTF_REPEAT, 0, 0, 0, 0, 0, set_ns_limit, NULL,
	 "MODEL=SIZE or MODEL=N%, at most 16",
	 "cap each namespace of a model (its layout's model name) at SIZE of RAM or N% of its "
	 "tenant's pool; over it, it evicts its own pages first; repeatable (16)"},
	{"arg-size", "SIZE", K_SIZE, 0, F(arg_size), 4096, 64u << 20, 0, NULL, NULL, "4K to 64M",
	 "per-client argument area for batched ops (default 1M)"},
	{"max-buf-bytes", "SIZE", K_SIZE, 0, F(max_buf_bytes), 0, UINT64_MAX, 0, NULL, NULL,
	 SIZE_HINT, "host memory one client may register (default: a quarter of RAM, at most 64G)"},
	{"max-sq-entries", "N", K_U32, OPTF_POW2, F(max_sq), KVB_SQ_MIN, KVB_SQ_MAX, 0, NULL, NULL,
	 NULL,
	 "ring depth one client may ask for, a power of two; larger asks are clamped (default "
	 "4096)"},
	{"max-bufs", "N", K_U32, 0, F(max_bufs), 1, SESSION_MAX_BUFS, 0, NULL, NULL, NULL,
	 "registered buffers per client (default 256, at most 256)"},
	{"max-ns", "N", K_U32, 0, F(max_ns), 1, SESSION_MAX_NS, 0, NULL, NULL, NULL,
	 "namespaces one client may open (default 64, at most 64)"},
	{"max-inflight", "N", K_U32, 0, F(max_inflight), 1, UINT32_MAX, 0, NULL, NULL, NULL,
	 "ops per client taken from its ring and not completed (default 4096)"},
	{"no-prefault", NULL, K_FLAG, 0, F(prefault), 0, 0, 0, NULL, NULL, NULL,
	 "do not fault the pool in at start-up (in parallel, per node); its memory is reserved "
	 "either way, and first PUTs then pay the page faults"},
	{"no-directory", NULL, K_FLAG, 0, F(dir), 0, 0, 0, NULL, NULL, NULL,
	 "keep no pool directory: every kvb_get() of a client asks the broker (a round trip) "
	 "instead of finding the page itself (docs/design.md [dir])"},
	{"group", "NAME", K_FN, 0, 0, 0, 0, 0, 0, set_group, "(same uid only)", "a group name",
	 "also admit clients of this group (default: same uid only)"},
	{"copy-threads", "N", K_U32, 0, F(copy_threads), 0, 64, 0, NULL, NULL, NULL,
	 "host copy worker threads (default: CPUs / 2, 2..4)"},
	{"copy-inline", "SIZE", K_SIZE, 0, F(copy_inline), 0, UINT64_MAX, 0, NULL, NULL, SIZE_HINT,
	 "host copies up to SIZE run on the loop thread, larger ones on the workers (default 4M; "
	 "0: every copy on a worker)"},
	{"copy-delay-us", "N", K_U32, OPTF_TEST, F(copy_delay_us), 0, UINT32_MAX, 0, NULL, NULL,
	 NULL, "testing: each worker copy sleeps N us first"},
	{"copy-fail-every", "N", K_U32, OPTF_TEST, F(copy_fail_every), 0, UINT32_MAX, 0, NULL, NULL,
	 NULL, "testing: every N-th worker copy fails with EIO"},
	{"no-gpu", NULL, K_FLAG, 0, F(gpu), 0, 0, 0, NULL, NULL, NULL,
	 "do not load CUDA (GPU buffers are then refused)"},
	{"gpu-path", "auto|copy|kernel", K_FN, 0, 0, 0, 0, 0, 0, set_gpu_path, "auto",
	 "auto, copy or kernel",
	 "how GPU pages move: measured per page shape (auto, default), cuMemcpyAsync per part, "
	 "or the gather/scatter kernel"},
	{"no-pool-keep", NULL, K_FLAG, 0, F(keep), 0, 0, 0, NULL, NULL, NULL,
	 "let the RAM pool die with the broker. By default it outlives a crash: a small keeper "
	 "process (\"kvbrokerd --keeper\", socket <socket>.keep) holds its memfds, and the next "
	 "kvbrokerd on the same socket adopts it and serves its pages again (after checking "
	 "every page's crc32c; pages being written when the broker died are dropped). A kept "
	 "pool is read-only to clients by file mode instead of F_SEAL_FUTURE_WRITE: see "
	 "docs/operations.md. A clean exit frees the pool. Under systemd with "
	 "FileDescriptorStoreMax= ($FDSTORE set, systemd >= 254) the unit's fd store holds the "
	 "pool instead of a keeper (FDSTORE=1, names kvbpool-*), and fds systemd passes back "
	 "(LISTEN_FDS) are adopted"},
	{"free-pool", NULL, K_FLAG, OPTF_CMDLINE, F(free_pool), 1, 0, 0, NULL, NULL, NULL,
	 "free the pool a dead broker on --socket left with its keeper, without starting a "
	 "broker, and exit (also: rm <socket>.keep, or kill the keeper; under systemd: systemctl "
	 "clean --what=fdstore kvbrokerd)"},
	{"takeover", NULL, K_FLAG, OPTF_CMDLINE, F(takeover), 1, 0, 0, NULL, NULL, NULL,
	 "planned hand-over (an upgrade, new flags): when a broker runs on --socket, send it "
	 "SIGUSR2 and take its place: it stops taking work, lets its copies finish, and exits "
	 "leaving its pool to the keeper; this broker then adopts the pool and listens. Clients "
	 "reconnect by themselves (include/kvbroker.h)"},
	{"log-level", "LEVEL", K_FN, 0, 0, 0, 0, 0, 0, set_log_level, "info",
	 "debug, info, warn or error", "debug, info, warn or error (default info)"},
	{"version", NULL, K_CMD, OPTF_CMDLINE, 0, 0, 0, 0, 0, NULL, NULL, NULL,
	 "print the version (the library's, kvbctl's and the Python package's are the same) and "
	 "exit"},
	{"help", NULL, K_CMD, OPTF_CMDLINE, 0, 0, 0, 0, 0, NULL, NULL, NULL, "this text"},
	{"help-all", NULL, K_CMD, OPTF_CMDLINE, 0, 0, 0, 0, 0, NULL, NULL, NULL,
	 "this text and the options for testing"},
};

#define NOPTS (sizeof(opts) / sizeof(opts[0]))

/* ---- defaults ---- */

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

static void defaults(struct config *c)
{
	memset(c, 0, sizeof(*c));
	c->poll_us = 200;
	c->max_clients = 1024;
	c->max_control = 64;
	c->control_idle = 120;
	c->max_leases = 65536;
	c->max_lease_frac = 0.125; /* a client pins at most an eighth of its tenant's pool */
	c->tenants.idle_s = TENANT_IDLE_DEFAULT; /* [tenant-lend] */
	c->max_pinned = 0.5; /* leases pin at most half of a partition: PUTs find room */
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
}

/* ---- reading one value ---- */

static void *field(struct config *c, const struct opt_def *o)
{
	return (char *)c + o->off;
}

/* Stores a into o's field. -EINVAL: not a valid value (-ENOENT: no such group). */
static int apply(struct config *c, const struct opt_def *o, const char *a)
{
	uint64_t v;
	uint32_t u;

	switch (o->kind) {
	case K_STR:
		if (strlen(a) >= o->size)
			return -EINVAL;
		strcpy(field(c, o), a);
		return 0;
	case K_STRP:
		if (!*a)
			return -EINVAL;
		memcpy(field(c, o), &a, sizeof(a));
		return 0;
	case K_U32:
		if (parse_u32(a, &u) || u < o->min || u > o->max ||
		    ((o->flags & OPTF_POW2) && !kvb_is_pow2(u)))
			return -EINVAL;
		memcpy(field(c, o), &u, sizeof(u));
		return 0;
	case K_SIZE:
		if (size_parse(a, &v) || v < o->min || v > o->max)
			return -EINVAL;
		if (o->size == sizeof(uint32_t)) {
			u = (uint32_t)v;
			memcpy(field(c, o), &u, sizeof(u));
		} else {
			memcpy(field(c, o), &v, sizeof(v));
		}
		return 0;
	case K_DUR:
		if (duration_parse(a, o->unit, &v) || v < o->min || v > o->max)
			return -EINVAL;
		if (o->size == sizeof(uint32_t)) {
			if (v % o->unit)
				return -EINVAL; /* finer than the field keeps */
			u = (uint32_t)(v / o->unit);
			memcpy(field(c, o), &u, sizeof(u));
		} else {
			double s = (double)v * 1e-9;

			memcpy(field(c, o), &s, sizeof(s));
		}
		return 0;
	case K_FLAG: {
		int f = (int)o->min;

		memcpy(field(c, o), &f, sizeof(f));
		return 0;
	}
	case K_FN:
		return o->set(c, a);
	default:
		return -EINVAL;
	}
}

/* Keeps a copy of a as the latest value of opts[i] (from: where), for status and for the
 * settings that point at their value. Returns the copy, or NULL without memory. */
static const char *remember(struct config *c, size_t i, const char *a, const char *from)
{
	struct opt_seen *s = &c->seen[i];
	char **v;

	if (!(opts[i].flags & OPTF_REPEAT) && s->n) {
		/* A later value replaces the earlier one (the command line over the file). */
		free(s->vals[0]);
		s->n = 0;
	}
	v = realloc(s->vals, (s->n + 1) * sizeof(*v));
	if (!v)
		return NULL;
	s->vals = v;
	v[s->n] = strdup(a ? a : "");
	if (!v[s->n])
		return NULL;
	free(s->from);
	s->from = strdup(from);
	if (!s->from) {
		free(v[s->n]);
		return NULL;
	}
	return v[s->n++];
}

/* What a value should look like, for an error message. */
static void hint(const struct opt_def *o, char *buf, size_t len)
{
	if (o->hint)
		snprintf(buf, len, "%s", o->hint);
	else if (o->kind == K_U32 && o->max == UINT32_MAX)
		snprintf(buf, len, "a whole number from %llu", (unsigned long long)o->min);
	else if (o->kind == K_U32)
		snprintf(buf, len, "a whole number from %llu to %llu%s", (unsigned long long)o->min,
			 (unsigned long long)o->max,
			 o->flags & OPTF_POW2 ? ", a power of two" : "");
	else
		snprintf(buf, len, "see --help");
}

/* Sets opts[i] to a (NULL for a flag), from where; 0 or -errno, said by the caller. */
static int set_opt(struct config *c, size_t i, const char *a, const char *from)
{
	const char *copy = remember(c, i, a, from);

	if (!copy)
		return -ENOMEM;
	/* Settings that keep a pointer to their value keep the config's own copy. */
	return apply(c, &opts[i], copy);
}

/* ---- the config file ---- */

static int find(const char *name, size_t len)
{
	for (size_t i = 0; i < NOPTS; i++)
		if (strlen(opts[i].name) == len && !strncmp(opts[i].name, name, len))
			return (int)i;
	return -1;
}

/* "FILE:LINE: unknown setting 'pol'; did you mean 'pool'?" */
static void file_unknown(const char *where, const char *name, size_t len)
{
	const char *names[NOPTS], *near[4];
	size_t n = 0, k;

	for (size_t i = 0; i < NOPTS; i++)
		if (!(opts[i].flags & OPTF_CMDLINE))
			names[n++] = opts[i].name;
	k = cli_nearest(name, len, names, n, near, 4);
	if (!k)
		fprintf(stderr,
			PROG ": %s: unknown setting '%.*s' (the names are kvbrokerd's long "
			     "options: kvbrokerd --help)\n",
			where, (int)len, name);
	else
		fprintf(stderr, PROG ": %s: unknown setting '%.*s'; did you mean '%s'%s%s%s?\n",
			where, (int)len, name, near[0], k > 1 ? " or '" : "", k > 1 ? near[1] : "",
			k > 1 ? "'" : "");
}

static int is_word(const char *v, const char *const *words)
{
	for (; *words; words++)
		if (!strcasecmp(v, *words))
			return 1;
	return 0;
}

/* One line of the file, NUL-terminated without its newline. 0 or -EINVAL (said). */
static int file_line(struct config *c, char *line, const char *where)
{
	static const char *const yes[] = {"yes", "true", "on", "1", NULL};
	static const char *const no[] = {"no", "false", "off", "0", NULL};
	char *p = line, *name, *val, *e;
	char h[128];
	size_t len;
	int i, err;

	while (*p == ' ' || *p == '\t')
		p++;
	if (!*p || *p == '#')
		return 0;
	if (p[0] == '-' && p[1] == '-')
		p += 2;
	name = p;
	while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
	       *p == '-' || *p == '_')
		p++;
	len = (size_t)(p - name);
	while (*p == ' ' || *p == '\t')
		p++;
	if (*p == '=')
		p++;
	while (*p == ' ' || *p == '\t')
		p++;
	val = p;
	e = val + strlen(val);
	while (e > val && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
		*--e = '\0';
	if (e - val >= 2 && val[0] == '"' && e[-1] == '"') {
		e[-1] = '\0';
		val++;
	}
	if (!len) {
		fprintf(stderr,
			PROG ": %s: expected \"name = value\" (a kvbrokerd long option "
			     "without its --), found '%s'\n",
			where, line);
		return -EINVAL;
	}
	i = find(name, len);
	if (i < 0) {
		file_unknown(where, name, len);
		return -EINVAL;
	}
	if (opts[i].flags & OPTF_CMDLINE) {
		fprintf(stderr, PROG ": %s: '%s' is not a setting: give --%s on the command line\n",
			where, opts[i].name, opts[i].name);
		return -EINVAL;
	}
	if (!opts[i].arg) {
		if (is_word(val, no))
			return 0;
		if (*val && !is_word(val, yes)) {
			fprintf(stderr,
				PROG ": %s: '%s' is a flag: write it alone, or = yes or no\n",
				where, opts[i].name);
			return -EINVAL;
		}
		val = NULL;
	} else if (!*val) {
		hint(&opts[i], h, sizeof(h));
		fprintf(stderr, PROG ": %s: '%s' needs a value (%s): %s = %s\n", where,
			opts[i].name, h, opts[i].name, opts[i].arg);
		return -EINVAL;
	}
	err = set_opt(c, (size_t)i, val, where);
	if (err == -ENOMEM) {
		fprintf(stderr, PROG ": %s: %s\n", where, strerror(ENOMEM));
	} else if (err == -ENOENT) {
		fprintf(stderr, PROG ": %s: group: no group '%s'\n", where, val);
	} else if (err) {
		hint(&opts[i], h, sizeof(h));
		fprintf(stderr, PROG ": %s: bad value '%s' for %s: %s\n", where, val, opts[i].name,
			h);
	}
	return err ? -EINVAL : 0;
}

/* Reads the config file path; the first error ends it. 0 or -EINVAL (said on stderr). */
static int load_file(struct config *c, const char *path)
{
	FILE *f = fopen(path, "re");
	char *line = NULL, where[PATH_MAX + 16];
	size_t cap = 0;
	unsigned n = 0;
	int err = 0;

	if (!f) {
		fprintf(stderr, PROG ": --config %s: %s\n", path, strerror(errno));
		return -EINVAL;
	}
	while (!err && getline(&line, &cap, f) >= 0) {
		n++;
		line[strcspn(line, "\n")] = '\0';
		snprintf(where, sizeof(where), "%s:%u", path, n);
		err = file_line(c, line, where);
	}
	if (!err && ferror(f)) {
		fprintf(stderr, PROG ": --config %s: %s\n", path, strerror(errno));
		err = -EINVAL;
	}
	free(line);
	fclose(f);
	return err;
}

/* ---- the command line ---- */

/* The settings against each other, and the defaults that depend on others. 0 or -EINVAL. */
static int finish(struct config *c)
{
	uint32_t high = c->high_pct, low = c->low_pct;

	if (c->disk.paths && !c->disk.size) {
		cli_usage_error(PROG, "--disk needs --disk-size");
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
			cli_usage_error(PROG, "a tenant's disk share (--tenant ID=RAM,DISK, "
					      "--tenant-share RAM,DISK) needs --disk");
			return -EINVAL;
		}
	}
	if (!high)
		high = c->disk.paths ? 90 : 100;
	if (!low)
		low = c->disk.paths ? (high > 10 ? high - 10 : high) : (high < 90 ? high : 90);
	if (low > high) {
		cli_usage_error(PROG, "--low-watermark above --high-watermark");
		return -EINVAL;
	}
	c->high_wm = high / 100.0;
	c->low_wm = low / 100.0;
	if (!c->pool_bytes)
		c->pool_bytes = default_pool();
	if (!c->slab_bytes)
		c->slab_bytes = plan_default_slab(c->pool_bytes); /* kvbctl plan assumes the same */
	if (c->slab_bytes > c->pool_bytes) {
		cli_usage_error(PROG, "--slab larger than --pool");
		return -EINVAL;
	}
	if (!c->pool_name[0])
		default_pool_name(c->socket_path, c->pool_name, sizeof(c->pool_name));
	return 0;
}

int options_parse(int argc, char **argv, struct config *c)
{
	struct option lo[NOPTS + 1];
	struct {
		int i;
		const char *arg;
	} *given = NULL;
	const char *config = NULL;
	int o, n = 0, err = 0;

	defaults(c);
	c->seen = calloc(NOPTS, sizeof(*c->seen));
	given = calloc((size_t)argc + 1, sizeof(*given));
	if (!c->seen || !given) {
		fprintf(stderr, PROG ": %s\n", strerror(ENOMEM));
		err = -ENOMEM;
		goto out;
	}
	if (kvb_default_socket(c->socket_path, sizeof(c->socket_path))) {
		fprintf(stderr,
			PROG ": $KVB_SOCKET is longer than a socket path may be (%zu bytes)\n",
			sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
		err = -ENAMETOOLONG;
		goto out;
	}
	for (size_t i = 0; i < NOPTS; i++)
		lo[i] = (struct option){opts[i].name, opts[i].arg ? required_argument : no_argument,
					NULL, 256 + (int)i};
	lo[NOPTS] = (struct option){NULL, 0, NULL, 0};
	/* First every word, so that --config FILE is read before the rest, wherever it is. */
	while ((o = cli_getopt(argc, argv, "h", lo, PROG)) != -1) {
		const struct opt_def *d;

		if (o == 'h')
			o = 256 + find("help", 4);
		if (o < 256 || o >= 256 + (int)NOPTS) { /* cli_getopt() said what */
			err = -EINVAL;
			goto out;
		}
		d = &opts[o - 256];
		if (!strcmp(d->name, "help") || !strcmp(d->name, "help-all")) {
			options_help(stdout, d->name[4] == '-');
			err = 1;
			goto out;
		}
		if (!strcmp(d->name, "version")) {
			cli_version(PROG);
			err = 1;
			goto out;
		}
		if (!strcmp(d->name, "config")) {
			config = optarg;
			continue;
		}
		given[n].i = o - 256;
		given[n++].arg = optarg;
	}
	if (optind < argc) {
		cli_usage_error(PROG, "unexpected argument '%s'", argv[optind]);
		err = -EINVAL;
		goto out;
	}
	if (config) {
		err = load_file(c, config);
		if (err)
			goto out;
	}
	for (int k = 0; k < n; k++) {
		const struct opt_def *d = &opts[given[k].i];
		char h[128];

		err = set_opt(c, (size_t)given[k].i, given[k].arg, "command line");
		if (err == -ENOENT) {
			cli_usage_error(PROG, "--group: no group '%s'", given[k].arg);
		} else if (err == -ENOMEM) {
			fprintf(stderr, PROG ": %s\n", strerror(ENOMEM));
		} else if (err) {
			hint(d, h, sizeof(h));
			cli_usage_error(PROG, "bad value '%s' for --%s: %s", given[k].arg, d->name,
					h);
		}
		if (err) {
			err = -EINVAL;
			goto out;
		}
	}
	err = finish(c);
out:
	free(given);
	return err;
}

/* ---- help ---- */

#define HELP_COL 25   /* where descriptions start */
#define HELP_WIDTH 80 /* columns of a terminal */

/* Prints text from column HELP_COL, wrapped before HELP_WIDTH; the cursor is at column col. */
static void wrap(FILE *f, const char *text, int col)
{
	const char *p = text;

	while (*p) {
		const char *line = p, *brk = NULL;
		int room = HELP_WIDTH - 1 - HELP_COL;

		if (col > HELP_COL) {
			fputc('\n', f);
			col = 0;
		}
		fprintf(f, "%*s", HELP_COL - col, "");
		for (const char *q = p; *q && q - line <= room; q++)
			if (*q == ' ')
				brk = q;
		if ((int)strlen(line) <= room || !brk)
			brk = line + strlen(line);
		fprintf(f, "%.*s\n", (int)(brk - line), line);
		p = *brk ? brk + 1 : brk;
		col = 0;
	}
}

void options_help(FILE *f, int all)
{
	fprintf(f,
		"usage: kvbrokerd [options]\n"
		"\n"
		"The node-local KV-cache page broker. Runs in the foreground and logs to stderr.\n"
		"Sizes: 64G is 64 GiB, 64GB is 64 x 10^9 bytes; durations take ns, us, ms, s, m\n"
		"or h, a bare number counting in the unit the option says (docs/operations.md).\n"
		"Every option but the commands may be set in a --config file.\n"
		"\n");
	for (size_t i = 0; i < NOPTS; i++) {
		char head[64];
		int n;

		if ((opts[i].flags & OPTF_TEST) && !all)
			continue;
		n = snprintf(head, sizeof(head), "  --%s%s%s", opts[i].name, opts[i].arg ? " " : "",
			     opts[i].arg ? opts[i].arg : "");
		fputs(head, f);
		wrap(f, opts[i].help, n + 1 >= HELP_COL ? HELP_COL + 1 : n);
	}
	fprintf(f,
		"\n"
		"Signals: SIGTERM or SIGINT drains and exits 0 (freeing the pool); SIGUSR2 hands\n"
		"the pool over (exits 0 keeping it for the next broker); SIGHUP is logged.\n"
		"The broker listens only once its pool is ready; meanwhile \"<socket>.lock\"\n"
		"is held, and clients get -EAGAIN (starting).\n");
	if (!all)
		fprintf(f, "Options for testing: kvbrokerd --help-all.\n");
}

/* ---- status ---- */

/* The value of a K_FN setting nobody set, from the config where it tells. */
static cJSON *fn_value(const struct config *c, const struct opt_def *o)
{
	if (!strcmp(o->name, "socket"))
		return cJSON_CreateString(c->socket_path);
	if (!strcmp(o->name, "pool-name"))
		return cJSON_CreateString(c->pool_name);
	if (!strcmp(o->name, "numa"))
		return cJSON_CreateString(c->numa);
	if (!strcmp(o->name, "slab"))
		return cJSON_CreateNumber((double)c->slab_bytes);
	if (!strcmp(o->name, "high-watermark"))
		return cJSON_CreateNumber(c->high_wm * 100);
	if (!strcmp(o->name, "low-watermark"))
		return cJSON_CreateNumber(c->low_wm * 100);
	if (!strcmp(o->name, "metrics-listen"))
		return c->metrics_listen[0] ? cJSON_CreateString(c->metrics_listen)
					    : cJSON_CreateNull();
	if (!strcmp(o->name, "remote-prefix"))
		return cJSON_CreateString(c->remote.prefix);
	return o->def ? cJSON_CreateString(o->def) : cJSON_CreateNull();
}

static cJSON *value(const struct config *c, size_t i)
{
	const struct opt_def *o = &opts[i];
	const struct opt_seen *s = &c->seen[i];
	const char *p = (const char *)c + o->off;
	uint64_t v = 0;
	uint32_t u = 0;
	double d = 0;
	int f;

	switch (o->kind) {
	case K_STR:
		return cJSON_CreateString(p);
	case K_STRP: {
		const char *str;

		memcpy(&str, p, sizeof(str));
		return str ? cJSON_CreateString(str) : cJSON_CreateNull();
	}
	case K_U32:
		memcpy(&u, p, sizeof(u));
		return cJSON_CreateNumber(u);
	case K_SIZE:
		if (o->size == sizeof(u))
			memcpy(&u, p, sizeof(u)), v = u;
		else
			memcpy(&v, p, sizeof(v));
		return cJSON_CreateNumber((double)v);
	case K_DUR: /* in the unit of a bare number, as the option is written */
		if (o->size == sizeof(u)) {
			memcpy(&u, p, sizeof(u));
			return cJSON_CreateNumber(u);
		}
		memcpy(&d, p, sizeof(d));
		return cJSON_CreateNumber(d * 1e9 / (double)o->unit);
	case K_FLAG:
		memcpy(&f, p, sizeof(f));
		return cJSON_CreateBool(f == (int)o->min);
	default:
		break;
	}
	if (o->flags & OPTF_REPEAT) {
		cJSON *a = cJSON_CreateArray();

		for (unsigned k = 0; a && k < s->n; k++)
			cJSON_AddItemToArray(a, cJSON_CreateString(s->vals[k]));
		return a;
	}
	if (s->n)
		return cJSON_CreateString(s->vals[s->n - 1]);
	return fn_value(c, o);
}

cJSON *options_json(const struct config *c)
{
	cJSON *root = cJSON_CreateObject();

	for (size_t i = 0; root && c->seen && i < NOPTS; i++) {
		cJSON *e;

		if (opts[i].kind == K_CMD || (opts[i].flags & OPTF_CMDLINE))
			continue;
		e = cJSON_AddObjectToObject(root, opts[i].name);
		if (!e)
			continue;
		cJSON_AddItemToObject(e, "value", value(c, i));
		cJSON_AddStringToObject(e, "source", c->seen[i].n ? c->seen[i].from : "default");
	}
	return root;
}

void options_free(struct config *c)
{
	if (!c->seen)
		return;
	for (size_t i = 0; i < NOPTS; i++) {
		for (unsigned k = 0; k < c->seen[i].n; k++)
			free(c->seen[i].vals[k]);
		free(c->seen[i].vals);
		free(c->seen[i].from);
	}
	free(c->seen);
	c->seen = NULL;
	c->tenants.nlisted = 0; /* they pointed into seen[] */
	c->disk.paths = NULL;
	c->remote.url = NULL;
}
