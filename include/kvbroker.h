/* SPDX-License-Identifier: MIT */
/*
 * kvbroker.h - the public client API of kvbroker, the only header an engine includes.
 *
 * A process attaches to the node-local broker (kvbrokerd) with kvb_connect(), opens the
 * namespace of its model's KV layout with kvb_ns_open(), and then stores, fetches and looks up
 * KV pages by their 256-bit content key. Pages are immutable; a PUT of a key that is already
 * stored (by another TP rank, another engine, another job) copies nothing.
 *
 * Conventions (as liburing): functions return >= 0 on success and a negative errno on failure;
 * errno is not used, but for kvb_buf_alloc_host(), which returns an address (NULL with errno
 * set). Input structs end with flags and reserved words that must be zero.
 *
 * Thread-safety: a kvb_client may be shared by threads; every call takes the client's lock, so
 * calls on one client are serialized, except that kvb_reap() drops the lock while it sleeps
 * (one thread may reap while others submit). For parallel I/O open one client per thread.
 * kvb_close() may be called while other threads wait in kvb_reap(): they wake and return
 * -ESHUTDOWN, and kvb_close() returns once they have left; a call in progress in another
 * thread finishes first. No call on the client may start after kvb_close() was called.
 *
 * Errors every call on a client may return besides its own: -ECONNRESET the broker went away
 * (and every later call fails the same way), -EBADF a namespace, buffer or view this client did
 * not open, -EOPNOTSUPP a data call on a KVB_CONNECT_CONTROL client. A kvb_client
 * must not be used in a child after fork(); connect again there.
 *
 * Ownership: memory returned by kvb_buf_alloc_host() belongs to the client and is unmapped by
 * kvb_buf_unregister() or kvb_close(). Lease data stays valid until kvb_release() or kvb_close().
 */
#ifndef KVBROKER_H
#define KVBROKER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The one version of kvbroker, here and nowhere else: the library (kvb_version()), kvbrokerd
 * (its "ready" log line, the stats document's "version", so `kvbctl status` and the metric
 * kvbroker_info{version=...}), every program's --version, kvbroker.pc and the Python package
 * (kvbroker.__version__ and its metadata, which python/setup.py reads from these lines) all
 * take it from these three numbers. t_version and python/tests/test_version.py fail when any
 * two disagree.
 */
#define KVB_VERSION_MAJOR 0
#define KVB_VERSION_MINOR 6
#define KVB_VERSION_PATCH 0
/* "major.minor.patch", made from the three numbers above. */
#define KVB_VERSION_STRING                                                                         \
	KVB_VERSION_STR_(KVB_VERSION_MAJOR)                                                        \
	"." KVB_VERSION_STR_(KVB_VERSION_MINOR) "." KVB_VERSION_STR_(KVB_VERSION_PATCH)
#define KVB_VERSION_STR_(x) KVB_VERSION_STR2_(x)
#define KVB_VERSION_STR2_(x) #x

/* Returns (major << 16) | (minor << 8) | patch of the library actually linked. */
unsigned kvb_version(void);

typedef struct kvb_client kvb_client;

/* 256-bit content key: SHA-256 chain over the token ids of a prefix (see kvb_key_chain). */
typedef struct {
	uint8_t b[32];
} kvb_key;

enum kvb_layout_kind {
	KVB_LAYOUT_MLA = 1, /* latent KV, identical on every TP rank: one namespace per model */
	KVB_LAYOUT_MHA = 2, /* per-rank KV shards: tp_size and tp_rank are part of the identity */
};

#define KVB_MAX_COMPONENTS 4
#define KVB_MODEL_MAX 64
#define KVB_COMP_NAME_MAX 16

/* One KV component (main latent KV, indexer cache, draft KV, ...). */
struct kvb_component {
	char name[KVB_COMP_NAME_MAX];	/* NUL-terminated, not empty */
	uint32_t num_layers;		/* >= 1 */
	uint32_t bytes_per_token_layer; /* >= 1 */
};

/*
 * A namespace's KV layout. Page layout: [component][layer][token][bytes_per_token_layer].
 * page_bytes = tokens_per_page * sum(num_layers * bytes_per_token_layer).
 */
struct kvb_layout {
	char model[KVB_MODEL_MAX]; /* NUL-terminated, not empty */
	uint32_t kind;		   /* enum kvb_layout_kind */
	uint32_t tokens_per_page;  /* >= 1 */
	uint32_t tp_size;	   /* >= 1; identity only for MHA */
	uint32_t tp_rank;	   /* < tp_size */
	uint32_t ncomponents;	   /* 1..KVB_MAX_COMPONENTS */
	struct kvb_component comp[KVB_MAX_COMPONENTS];
	uint32_t flags;	  /* must be 0 */
	uint32_t resv[3]; /* must be 0 */
};

/* kvb_opts.flags */
#define KVB_CONNECT_CONTROL (1u << 0)	   /* tools: no rings, no pool; only kvb_stats_json works */
#define KVB_CONNECT_NUMA_NODE (1u << 1)	   /* numa_node is set */
#define KVB_CONNECT_NO_RECONNECT (1u << 2) /* stay -ECONNRESET once the broker is gone */

/*
 * Placement: the broker keeps one pool arena per NUMA node and puts a client's new pages in the
 * arena nearest to its GPU (gpu_busid: the broker reads the device's node from sysfs), else to
 * its CPU node (numa_node with KVB_CONNECT_NUMA_NODE), falling back to farther arenas when that
 * one is full. Without either, pages go to the arenas in the broker's order. Reads are served
 * from wherever a page is; only its placement at PUT depends on this.
 */
struct kvb_opts {
	const char *socket_path; /* NULL: $KVB_SOCKET, else KVB_SOCKET_DEFAULT
				    (kvb_socket_path) */
	const char *name;	 /* shown by kvbctl; NULL: the program name */
	const char *gpu_busid;	 /* PCI bus id of this client's GPU, as cudaDeviceGetPCIBusId()
				    writes it ("0000:3B:00.0"); NULL: none. One the broker's
				    machine does not list is refused (-ENODEV), not ignored */
	uint32_t sq_entries;	 /* power of two up to 4096; 0: 256 */
	uint32_t flags;		 /* KVB_CONNECT_* */
	int32_t numa_node;	 /* with KVB_CONNECT_NUMA_NODE: NUMA node this client runs on
				    (>= 0); 0 without it */
	uint32_t reconnect_ms;	 /* while the broker is away, a call tries to reconnect for
				    up to this long before it returns -ECONNRESET; 0: fail at
				    once (see "Broker restarts" below) */
	uint32_t resv[2];	 /* must be 0 */
};

/* A pinned, read-only, zero-copy view of a RAM-resident page. */
struct kvb_lease {
	const void *data; /* inside the client's read-only mapping of the pool */
	size_t len;	  /* the namespace's page_bytes */
	uint64_t id;	  /* capability checked on release (opaque: after a broker restart the
			     library's alias of the broker's) */
};

/* Tiers reported by kvb_lookup_tiers(). */
enum kvb_tier {
	KVB_TIER_RAM = 0,
	KVB_TIER_DISK = 1,
	KVB_TIER_REMOTE = 2, /* in the cross-node tier (--remote): a GET fetches it */
	KVB_TIER_NONE = 0xff,
};

/*
 * The control socket's path when neither --socket nor $KVB_SOCKET names one: kvbrokerd listens
 * there, and every client (kvb_connect, kvbctl, the Python package) looks there.
 */
#define KVB_SOCKET_DEFAULT "/run/kvbroker/kvbroker.sock"

/*
 * The socket kvb_connect() tries for opts->socket_path = path, into buf (len bytes): path when
 * not NULL, else $KVB_SOCKET when set and not empty, else KVB_SOCKET_DEFAULT. That is the one
 * rule, kvbrokerd's for its own socket too (--socket, else $KVB_SOCKET, else the default); no
 * other variable, $XDG_RUNTIME_DIR included, moves it, so a broker started by a service and a
 * client in a login shell agree on the default. A broker that must live elsewhere (no root to
 * create /run/kvbroker) is given --socket, and its clients the same path in $KVB_SOCKET.
 * Returns 0, or -ENAMETOOLONG when the path does not fit buf or a sockaddr_un (107 bytes).
 * Thread-safe as getenv() is. Library 0.6.
 */
int kvb_socket_path(const char *path, char *buf, size_t len);

/*
 * Connects to the broker and maps this client's rings and the pool. opts may be NULL.
 * Errors: -ENOENT no socket at the path, -ECONNREFUSED a socket file nobody listens on (a
 * broker that died), -EAGAIN a broker is starting there (it listens only once its pool is
 * ready, which for a large pool takes seconds: retry), -EACCES the permissions of the socket
 * or of a directory above it refuse this uid and its groups (-EPERM where a security module
 * refuses), -ECONNRESET the broker hung up at once: its credential check refused this uid or
 * group (its log says so), -EPROTO version mismatch, -EINVAL bad opts (or a malformed
 * gpu_busid), -ENODEV gpu_busid names no PCI device on the broker's machine (a broker that
 * cannot see any, without sysfs, accepts it and places by CPU node), -ENAMETOOLONG socket
 * path, -EUSERS the broker's --max-clients (or, for a KVB_CONNECT_CONTROL client,
 * --max-control) reached, or with --tenants every partition bound to a tenant in use (a
 * released one is bound to a new tenant), -ETIMEDOUT no answer, -ENOMEM. kvb_connect_error() turns each into
 * a sentence naming the socket, the cause and the fix.
 */
int kvb_connect(const struct kvb_opts *opts, kvb_client **out);

/*
 * Broker restarts. The broker's RAM pool survives its crash and its planned hand-over to a new
 * broker (kvbrokerd --takeover), and so does a client: once the broker is gone the library
 * reconnects by itself, unless KVB_CONNECT_NO_RECONNECT is set (or KVB_RECONNECT=0 is in the
 * environment at kvb_connect()), in which case every later call returns -ECONNRESET as before.
 *   - The call in progress when the broker went, on this client, returns -ECONNRESET; its op
 *     may or may not have run. PUT, GET, LOOKUP, DELETE, ACQUIRE and PREFETCH are idempotent:
 *     repeat it. Async ops in flight complete with res -ECONNRESET, delivered by kvb_reap()
 *     (and signalled on the kvb_completion_fd()) before anything else.
 *   - The next call (any call that takes the client, kvb_reap() once those failed completions
 *     were reaped) attaches again: same socket, same kvb_opts, then every namespace the client
 *     opened, every host buffer it allocated or registered by fd (the library keeps an fd of
 *     each) and every view are opened, registered and created again. Attempts back off from
 *     1 ms, doubling to 200 ms. Between attempts a call fails at once with -ECONNRESET; with
 *     opts.reconnect_ms it keeps trying for up to that long first (holding the client's lock:
 *     other threads' calls wait with it). A broker that is starting counts as away.
 *   - Ids stay valid: namespace, buffer and view ids the caller holds keep naming the same
 *     objects (the library translates them; the new broker's ids may differ). GPU buffers are
 *     registered again too: the library exports each one's allocation anew from the device
 *     pointer it was registered with (a CUDA IPC handle, or a fresh fd of cuMem memory), in the
 *     calling thread. One whose allocation is no longer the one registered (freed, replaced at
 *     that address), or that the new broker refuses (started --no-gpu), is lost alone: its
 *     ops, and those of views over it, fail -EBADF until the caller registers it anew.
 *   - Leases of the old broker stay readable and intact (their mapping is kept, and a broker
 *     that adopts the pool holds their pages until this library, at its first call after the
 *     broker went, has copied each into memory of its own, or until the process exits: so a
 *     lease reads the page it leased even before the library notices); kvb_release() of one,
 *     or a RELEASE of its id through kvb_submit(), completes 0 without a round trip, and the
 *     old mapping goes with the last of them (each broker's with its own last lease, whatever
 *     leases of other brokers are held). An async RELEASE that was in flight when the
 *     broker went fails -ECONNRESET and leaves the lease held: send it again. (An async
 *     RELEASE names a lease by its id alone: a lease of the new broker that has the id of an
 *     old one still held is handed out under another id, so neither is taken for the other.)
 *     Pages themselves are served by the new broker if it adopted the pool (a crash, a
 *     hand-over: every page committed before, byte-exact; a page being written is never
 *     served), or are gone (--no-pool-keep, a clean stop, a changed --slab).
 *   - Until the library notices the broker is gone, a kvb_get() that finds its page in the
 *     pool directory (see kvb_get) still succeeds without it: the bytes are the page's, since
 *     nobody writes a pool whose broker died, and a broker that adopts the pool invalidates
 *     the directory before it writes any slot. The library notices at its next round trip,
 *     and at a kvb_submit() with no async op in flight (none done and not yet reaped either,
 *     and no thread in kvb_reap()), which looks at the socket before it queues anything: a
 *     broker that went meanwhile is reconnected to first, so the batch goes to the new broker
 *     (or fails -ECONNRESET whole, nothing queued, when there is none).
 * Mappings and fds do not accumulate across reconnects (t_handover, t_pool_keep).
 */

/*
 * Detaches; the broker releases every lease, buffer and view of this client. NULL is a no-op.
 * Threads asleep in kvb_reap() on it are woken and return -ESHUTDOWN (see Thread-safety).
 */
void kvb_close(kvb_client *c);

/* A static, human-readable string for a negative errno returned by this API. */
const char *kvb_strerror(int err);

/*
 * What a failed kvb_connect() tells a person: one line naming the socket, the cause and the
 * fix, for err as kvb_connect() returned it and socket_path as given to it (NULL: resolved as
 * kvb_connect() does, kvb_socket_path). For example:
 *   -ENOENT        "no broker at /run/kvbroker/kvbroker.sock (no socket there): start one
 *                   with: kvbrokerd --socket /run/kvbroker/kvbroker.sock, or point
 *                   $KVB_SOCKET at the socket of the broker that runs"
 *   -ECONNREFUSED  the same for a socket file nobody listens on
 *   -EACCES/-EPERM "permission denied at PATH: a broker is running there, but DIR (owner root,
 *                   group kvbroker, mode 0750) admits only uid 0 (root) and group kvbroker,
 *                   and uid 1000 (alice) is not in it: usermod -aG kvbroker alice, then log
 *                   in again", after a look at the socket and the directories above it (the
 *                   first that refuses this process is named; a group this user was added to
 *                   after logging in, a group-less broker and a mode that admits no group
 *                   each get their own fix)
 *   others         "the broker at PATH ...: " and kvb_strerror()'s text, or its own fix.
 * Writes at most len bytes into buf, NUL-terminated when len > 0 (512 bytes hold every message
 * with paths of up to 107 bytes). Returns buf. Reads the filesystem and the user and group
 * databases (reentrant calls), never the socket; thread-safe. Library 0.6.
 */
const char *kvb_connect_error(int err, const char *socket_path, char *buf, size_t len);

/*
 * Opens (creating on first use) the namespace of a layout. Every rank of an MLA model gets the
 * same *ns; MHA ranks get one each. *page_bytes receives the page size (may be NULL).
 * Errors: -EINVAL malformed layout, -E2BIG page larger than the broker accepts, -EMFILE too many
 * namespaces, -EACCES an operator (root, the broker's uid) attached for inspection only
 * because every tenant share was taken (--tenants), -ECONNRESET broker gone.
 */
int kvb_ns_open(kvb_client *c, const struct kvb_layout *l, uint32_t *ns, size_t *page_bytes);

/*
 * ---- namespace identity beyond the layout (library 0.2, broker ABI 1.2) ----
 *
 * What else decides whether two processes' pages are the same bytes. Two ranks share a
 * namespace, and so each other's pages, only when the layout and every identity field below
 * agree, except where a field is documented as not part of the identity.
 */

/* Element types of a component's KV (struct kvb_ns_ident.dtype[]). Numbers are stable. */
enum kvb_dtype {
	KVB_DTYPE_UNSPEC = 0, /* not stated: what every ABI 1.1 namespace is */
	KVB_DTYPE_FP16 = 1,
	KVB_DTYPE_BF16 = 2,
	KVB_DTYPE_FP32 = 3,
	KVB_DTYPE_FP8_E4M3 = 4,	    /* OCP e4m3fn (torch.float8_e4m3fn) */
	KVB_DTYPE_FP8_E5M2 = 5,	    /* torch.float8_e5m2 */
	KVB_DTYPE_FP8_E4M3FNUZ = 6, /* AMD's e4m3fnuz */
	KVB_DTYPE_INT8 = 7,
	KVB_DTYPE_UINT8 = 8,	/* raw bytes, e.g. a packed fp8 value-plus-scale cache */
	KVB_DTYPE_FP4_E2M1 = 9, /* packed two per byte (nvfp4/mxfp4 payloads) */
	KVB_DTYPE__COUNT,
};

#define KVB_PAGE_FORMAT_MAX 32

/*
 * struct kvb_ns_ident: the identity fields a struct kvb_layout has no room for. All-zero is the
 * default identity, the one kvb_ns_open() and every ABI 1.1 client get: a size of 0 means 1.
 *
 * - dtype[i] is comp[i]'s element type (entries from ncomponents on must be 0). fp16 and bf16
 *   pages of one byte size are different data: they never share a namespace. UNSPEC is its
 *   own identity (it is not "any"): an engine that starts stating its dtype starts a new cache.
 * - page_format names the byte order of a page as the engine PUTs and GETs it whole through
 *   kvb_put()/kvb_get() (e.g. "sglang:page_first"); "" (the default) is the broker's canonical
 *   order [component][layer][token][bytes], which is what views always produce, whatever the
 *   engine's own memory layout: two engines that move pages only through views should leave
 *   it "" and share. NUL-terminated printable ASCII, zero after the NUL.
 * - pp_size/pp_rank: pipeline stage (its layers). Identity for MHA and MLA.
 * - cp_size/cp_rank: attention context parallelism (each rank holds a disjoint slice of every
 *   page's tokens: SGLang's attn-CP, or decode-CP/DCP folded as cp_rank = that rank). Identity
 *   for MHA and MLA.
 * - dp_size/dp_rank: attention data parallelism. NOT part of the identity: the KV of a prefix
 *   does not depend on which DP replica computed it, so DP replicas on one node share pages
 *   (as SGLang's own HiCache storage keys do). With DP attention, tp_size and tp_rank of the
 *   layout are the attention-TP group's (rank within the group), as SGLang reports them. The
 *   broker validates them (rank < size) and shows them in kvbctl clients.
 * - MLA namespaces remain shared across TP ranks only: tp_size/tp_rank are not part of an
 *   MLA identity, everything else here (but dp) is.
 */
struct kvb_ns_ident {
	uint32_t dtype[KVB_MAX_COMPONENTS];    /* enum kvb_dtype of comp[i] */
	char page_format[KVB_PAGE_FORMAT_MAX]; /* "" canonical; see above */
	uint32_t pp_size;		       /* 0 or 1: no pipeline parallelism */
	uint32_t pp_rank;		       /* < pp_size */
	uint32_t cp_size;		       /* 0 or 1: no attention context parallelism */
	uint32_t cp_rank;		       /* < cp_size */
	uint32_t dp_size;		       /* 0 or 1: no attention data parallelism */
	uint32_t dp_rank;		       /* < dp_size; not identity */
	uint32_t flags;			       /* must be 0 */
	uint32_t resv[5];		       /* must be 0 */
};

/*
 * kvb_ns_open() with identity fields. id NULL, or the default identity (all zero), is exactly
 * kvb_ns_open(): the same namespace an ABI 1.1 client opens, and it works with any broker.
 * Errors: as kvb_ns_open(), and -EINVAL a malformed id (rank >= size, unknown dtype, dtype set
 * for a component the layout does not have, bad page_format, non-zero flags or resv),
 * -EOPNOTSUPP a non-default id and a broker older than ABI 1.2 (it cannot keep them apart).
 */
int kvb_ns_open2(kvb_client *c, const struct kvb_layout *l, const struct kvb_ns_ident *id,
		 uint32_t *ns, size_t *page_bytes);

/*
 * key = SHA-256(parent->b || le32(tokens[0]) || ... ) , or without parent for the first page.
 * Bit for bit SGLang HiCache's get_hash_str(). tokens may be NULL when ntokens is 0.
 * Pure function, thread-safe.
 */
kvb_key kvb_key_chain(const kvb_key *parent, const uint32_t *tokens, size_t ntokens);

/*
 * The key of an EAGLE (bigram) page, bit for bit SGLang HiCache's get_hash_str() of a bigram
 * token key: key = SHA-256(parent->b || le32(t[0]) || le32(t[1]) || le32(t[1]) || le32(t[2])
 * || ... || le32(t[n-1]) || le32(t[n])), 8 bytes per position i in [0, npos): the pair
 * (tokens[i], tokens[i + 1]). tokens holds npos + 1 ids: the page's npos tokens and the first
 * token after the page (SGLang's bigram key keeps that one extra id). npos 0 hashes the parent
 * alone (tokens may be NULL). Pure function, thread-safe.
 */
kvb_key kvb_key_chain_eagle(const kvb_key *parent, const uint32_t *tokens, size_t npos);

/*
 * Stores a page of exactly page_bytes from src. Returns 0 when stored, 1 when the key was already
 * stored (nothing copied). src inside a buffer from kvb_buf_alloc_host() (or inside the addr range
 * of kvb_buf_register_host_fd(), or a registered GPU buffer) is copied by the broker directly;
 * any other src goes through a staging buffer (one extra memcpy).
 *
 * From 64 KiB pages up (KVB_CLIENT_FILL_KB) and with a broker of ABI 1.4, a src in plain memory
 * is a filled PUT: the PUT is sent first and the library's copy into staging overlaps the
 * broker's copy out of it (about one copy's time, not two), and the broker asks first: a key
 * stored, or being stored by another client (TP ranks of one MLA page), returns 1 with nothing
 * copied by anyone beyond the library's first chunks. src must not change until the call
 * returns; the page becomes visible to GETs only once all of it is stored.
 * Errors: -EINVAL length or ns, -ENOSPC pool full of leased pages, -ECONNRESET broker gone.
 */
int kvb_put(kvb_client *c, uint32_t ns, kvb_key key, const void *src, size_t len);

/*
 * Copies a page into dst (len >= page_bytes). Returns page_bytes. -ENOENT when not stored.
 * A page in RAM that the broker's pool directory lists (ABI 1.5) is copied by this call itself
 * from the client's read-only pool mapping, with no round trip to the broker, into plain memory
 * and into a registered host buffer for pages below 1 MiB or at the dst of the client's previous
 * kvb_get() (a reused staging page); otherwise dst inside a registered buffer is written by the
 * broker, and any other dst is read from the pool mapping under a
 * lease (one memcpy). KVB_CLIENT_DIR=0 in the environment turns the first way off. After
 * -ENOENT (or any error) dst's bytes are unspecified: a fetch from the remote tier lands in a
 * registered dst as it arrives, and one that fails its checksum is a miss.
 */
int kvb_get(kvb_client *c, uint32_t ns, kvb_key key, void *dst, size_t len);

/*
 * Counts how many leading keys of keys[0..n) are stored (any tier) into *hits. Returns 0.
 * kvb_lookup_tiers() also writes each key's enum kvb_tier into tiers[0..n) (may be NULL; then it
 * stops at the first chunk of keys with a miss, like kvb_lookup()).
 */
int kvb_lookup(kvb_client *c, uint32_t ns, const kvb_key *keys, size_t n, size_t *hits);
int kvb_lookup_tiers(kvb_client *c, uint32_t ns, const kvb_key *keys, size_t n, size_t *hits,
		     uint8_t *tiers);

/*
 * kvb_put() of a page that continues parent's (the key of the page before it in its chain, e.g.
 * kvb_key_chain()'s parent; NULL: none, kvb_put() itself). With a broker of ABI 1.4 or later
 * the broker evicts the chain tail first: parent stays in RAM as long as this page does, so a
 * prefix lookup finds whole prefixes, never a head evicted under a stored tail. A parent not
 * stored (or not in RAM) is no error; an older broker gets a plain PUT. Returns as kvb_put().
 * (Library 0.4.)
 */
int kvb_put_child(kvb_client *c, uint32_t ns, kvb_key key, const kvb_key *parent, const void *src,
		  size_t len);

/* Drops a page; its memory is freed once no lease holds it. -ENOENT when not stored. */
int kvb_delete(kvb_client *c, uint32_t ns, kvb_key key);

/*
 * Pins a RAM-resident page and maps it for zero-copy reads: its bytes stay what they are until
 * kvb_release() (a DELETE meanwhile removes it for everyone else; eviction leaves it alone).
 * A page the pool directory lists is leased without a round trip to the broker (the library's
 * hazard table, docs/protocol.md); each lease then has an id of its own. -ENOENT when not
 * stored, -EDQUOT too many leases held by this client.
 */
int kvb_acquire(kvb_client *c, uint32_t ns, kvb_key key, struct kvb_lease *lease);

/* Unpins and clears lease->data and len. -EINVAL when the lease is not held by this client
 * (released twice, forged, another client's). A lease this client holds is released without
 * waiting for the broker (docs/protocol.md, the note ring): the broker reads the RELEASE before
 * it answers a stats request sent after it (another client's stats see the page unpinned),
 * before this client's next ACQUIRE or RELEASE through it, before a full pool refuses a PUT, and
 * otherwise within about a millisecond while it is busy (until then the page stays pinned). */
int kvb_release(kvb_client *c, struct kvb_lease *lease);

/*
 * Copies len bytes from off in a held lease to dst with the library's own page copy, kvb_get()'s:
 * streaming stores from 256 KiB, and from 64 KiB into a destination other than the one this
 * thread's last such copy wrote, so that dst's lines are not read first and the caller's cache
 * is not flushed by a page nobody reads back soon. A 64 KiB lease copied into rotating
 * destinations ran at 0.84-1.01 of a back-to-back memcpy this way, at 0.63-0.73 with glibc's
 * memcpy (docs/benchmarks.md). -EINVAL when [off, off + len) is outside the lease, or after
 * kvb_release() of this struct (a RELEASE through kvb_submit() leaves it as it was: do not
 * copy after one). Takes no lock and makes no round trip: any thread, but not while another
 * releases the same lease. (Library 0.5.)
 */
int kvb_lease_copy(const struct kvb_lease *lease, size_t off, void *dst, size_t len);

/* Round trip through the rings; for health checks and latency measurement. */
int kvb_nop(kvb_client *c);

/*
 * Allocates len bytes of shared memory the broker may copy to and from, registers it and
 * returns its address (NULL on failure with errno set: ENOMEM over the client's --max-buf-bytes,
 * EMFILE past its --max-bufs, ...; *buf untouched). The id goes to *buf. The memory is
 * faulted in here, by the caller, so it is charged to the caller's memory cgroup (not to the
 * broker's at its first copy) and a buffer the machine cannot back fails now.
 */
void *kvb_buf_alloc_host(kvb_client *c, size_t len, uint32_t *buf);

/*
 * Registers [dev_ptr, dev_ptr + len) of GPU memory, so that the broker copies pages straight
 * between its pinned pool and that memory (views over it, or kvb_put()/kvb_get() of a device
 * pointer inside it). The allocation holding dev_ptr is exported once per client: pointers
 * inside a caching allocator's segment work. cuMemAlloc/cudaMalloc memory goes as a legacy IPC
 * handle; memory of CUDA's virtual-memory API (cuMemCreate) as a POSIX fd, and must have been
 * created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR among its requested handle types. The
 * device is named by UUID. The library loads libcuda.so.1 at run time: no link dependency.
 * The memory must stay allocated until kvb_buf_unregister() or kvb_close(); the broker keeps
 * the handle open until copies in flight on it completed.
 * Errors: -ENODEV no CUDA driver or device in this process, the broker has GPU copies off, or
 * it does not see this device; -EINVAL not device memory; -EFAULT the range runs past the
 * allocation; -EOPNOTSUPP memory CUDA cannot export this way; -EMFILE too many buffers.
 */
int kvb_buf_register_gpu(kvb_client *c, void *dev_ptr, size_t len, uint32_t *buf);

/* kvb_buf_register_host_fd() flags */
#define KVB_BUF_SEAL (1u << 0)	 /* add F_SEAL_SHRINK to the fd when it lacks it */
#define KVB_BUF_FDCOPY (1u << 1) /* unsealed is fine: the broker copies with pread/pwrite */

/*
 * Registers [offset, offset + len) of a host-memory file the caller owns (a memfd, e.g.
 * SGLang's "allocator": "shm" host pool), so that the broker copies straight between its pool
 * and that memory: async ops with buf + off, views over it, and kvb_put()/kvb_get() of pointers
 * inside [addr, addr + len) when addr is given. The broker maps the file itself (the pages
 * enclosing the range: offset need not be page-aligned) and keeps its own reference; the
 * caller keeps fd and may close it at once. addr is where the caller has the same bytes
 * mapped MAP_SHARED in this process (NULL: nowhere the library should look; then only buf+off
 * ops and views reach the buffer); the library maps nothing itself. Where /proc/self/maps
 * shows addr to be a shared, writable mapping of exactly the registered range of this file,
 * and the file is sealed F_SEAL_SHRINK, the library itself writes pages the pool directory
 * lists into it (kvb_get, view GETs), as into a buffer from kvb_buf_alloc_host(); otherwise
 * only the broker writes the buffer, through the file. That is checked once, here: the range
 * at addr must stay that mapping, writable, while the buffer is registered (remapped, made
 * read-only or unmapped, the library's copies fault or land elsewhere).
 *
 * The broker must never fault on client memory, so the file must be a tmpfs file (memfd or
 * /dev/shm) that can never shrink: sealed F_SEAL_SHRINK. With KVB_BUF_SEAL the library adds
 * the seal when it is missing (other seals are left as they are: the caller may still write
 * and grow the file); a memfd made without MFD_ALLOW_SEALING, like every /dev/shm file, cannot
 * be sealed, and such a file is refused unless KVB_BUF_FDCOPY is given. A sealed file cannot
 * be truncated below its size by anyone afterwards (ftruncate fails with EPERM), for the life
 * of the file.
 *
 * KVB_BUF_FDCOPY accepts an unsealed tmpfs file (SGLang 0.5.23's alloc_shm memfd, made without
 * MFD_ALLOW_SEALING, or its unlinked /dev/shm file): the broker then never maps it and moves
 * the bytes with pread/pwrite on the file (through its own open of it), which cannot fault
 * whatever the caller does to the file. Everything else is as for a sealed file (buf+off ops,
 * views, pointers inside addr), one kernel copy per op instead of a memcpy (see docs/design.md
 * for the cost). If the caller shrinks the file under the range an op touches, the op fails
 * with -EFAULT: a PUT stores nothing (a LOOKUP misses), a GET may have written part of the
 * page into the file before it failed. A GET checks the file's size first and fails -EFAULT
 * rather than write past its end (a truncation racing with the GET may be undone by it, never
 * beyond the registered range). GETs into such a buffer always run on a broker copy thread. A
 * file that is sealed (or, with KVB_BUF_SEAL as well, can be sealed) is mapped as without the
 * flag, so KVB_BUF_SEAL | KVB_BUF_FDCOPY takes the fastest path the file allows. The fd must
 * be open O_RDWR (-EBADF; O_APPEND too is -EBADF where the broker cannot open the file itself
 * through /proc). Such buffers are host memory: a view mixing them with GPU buffers is -EINVAL,
 * like any host buffer.
 * Errors: -EINVAL len 0, offset + len overflows, unknown flags, fd not a file; -EPERM the file
 * lacks F_SEAL_SHRINK (without KVB_BUF_SEAL) or cannot be sealed (with it: F_ADD_SEALS failed),
 * and KVB_BUF_FDCOPY was not given; -EBADF (KVB_BUF_FDCOPY, unsealed) fd not open O_RDWR (or
 * O_APPEND, see above); -EMEDIUMTYPE not a tmpfs file (disk files and hugetlbfs are refused: they can lose
 * pages under a mapping); -EFAULT the range runs past the file's size; -ENOMEM over the
 * broker's --max-buf-bytes; -EMFILE too many buffers; -EOPNOTSUPP a broker older than ABI 1.2.
 */
int kvb_buf_register_host_fd(kvb_client *c, int fd, uint64_t offset, size_t len, void *addr,
			     uint32_t flags, uint32_t *buf);

/*
 * Unregisters a buffer (and unmaps it when it came from kvb_buf_alloc_host). Copies in flight
 * on it complete first, in the broker.
 */
int kvb_buf_unregister(kvb_client *c, uint32_t buf);

/*
 * Views: where the client's KV cache lives. parts[] holds one entry per (component, layer) of the
 * namespace, component-major: token slot s of that layer is at buf + base + s * stride, and
 * stride >= bytes_per_token_layer. A page op on a view moves tokens_per_page consecutive slots
 * starting at the op's slot.
 */
struct kvb_view_part {
	uint32_t buf;	 /* registered buffer id */
	uint32_t stride; /* bytes between token slots */
	uint64_t base;	 /* byte offset of slot 0 in buf */
};

int kvb_view_create(kvb_client *c, uint32_t ns, const struct kvb_view_part *parts, size_t nparts,
		    uint32_t *view);
int kvb_view_destroy(kvb_client *c, uint32_t view);

/*
 * Views over paged memory (broker ABI 1.2). Token slot s of a part is at
 *
 *   buf + base + (s / tokens_per_page) * page_stride + (s % tokens_per_page) * stride
 *
 * so a page's tokens are contiguous runs of stride, and pages are page_stride apart:
 * page_stride 0 means tokens_per_page * stride (a plain kvb_view_part). This covers host
 * layouts whose K and V, or whose layers, of one page lie in separate ranges: SGLang's
 * page_first_direct [2][page][layer][token][head*dim] (K part of layer l: base l * ps * T,
 * stride T, page_stride L * ps * T, the V parts a further page_num * L * ps * T on) and
 * vLLM's [block][2][token][head*dim] (page_stride 2 * block_size * T), besides layer_first and
 * page_first, which plain views already express. Non-zero page_stride must be at least
 * (tokens_per_page - 1) * stride + bytes_per_token_layer, so pages never overlap.
 * flags and resv must be 0.
 */
struct kvb_view_part2 {
	uint32_t buf;	      /* registered buffer id */
	uint32_t stride;      /* bytes between token slots within a page */
	uint64_t base;	      /* byte offset of slot 0 in buf */
	uint64_t page_stride; /* bytes between pages; 0: tokens_per_page * stride */
	uint32_t flags;	      /* must be 0 */
	uint32_t resv;	      /* must be 0 */
};

/*
 * kvb_view_create() with page strides. Works with any broker when every page_stride is 0
 * (or equal to tokens_per_page * stride); otherwise -EOPNOTSUPP from a broker older than
 * ABI 1.2. flags must be 0.
 * Errors (both): -EINVAL nparts is not the namespace's (component, layer) count, a stride
 * below the part's bytes_per_token_layer, a page_stride that makes pages overlap, non-zero
 * flags/resv; -EBADF an unknown namespace or buffer; -EMFILE too many views.
 */
int kvb_view_create2(kvb_client *c, uint32_t ns, const struct kvb_view_part2 *parts, size_t nparts,
		     uint32_t flags, uint32_t *view);

/*
 * Page ops on a view. layer_first/layer_count restrict a GET to layers [first, first+count) of
 * every component (count 0: all layers; -EINVAL when the range reaches past the deepest
 * component or selects no layer), so an engine can load layer groups in order and start
 * computing early; a PUT always takes every layer (all or nothing). The view's buffers may be
 * host or GPU memory, but one op's parts must all be host memory or all on one GPU (-EINVAL).
 * Return as kvb_put() (0 stored, 1 already stored) and kvb_get() (page_bytes).
 * A GET of a page the pool directory lists into a view over kvb_buf_alloc_host() buffers is
 * copied by the library itself, with no round trip (also through kvb_submit(): its completion
 * is then ready before kvb_submit() returns); docs/protocol.md, "View GETs through the pool
 * directory". Results and errors are the broker's either way.
 */
int kvb_view_put(kvb_client *c, uint32_t view, kvb_key key, uint64_t slot);
int kvb_view_get(kvb_client *c, uint32_t view, kvb_key key, uint64_t slot, uint32_t layer_first,
		 uint32_t layer_count);
/* kvb_view_put() naming the page's parent, as kvb_put_child() (library 0.4). */
int kvb_view_put_child(kvb_client *c, uint32_t view, kvb_key key, const kvb_key *parent,
		       uint64_t slot);

/* ---- asynchronous, batched operations (io_uring style) ---- */

enum kvb_opcode {
	KVB_OP_NOP = 0,
	KVB_OP_PUT = 1,	    /* from buf+off, or a view slot with KVB_OPF_VIEW */
	KVB_OP_GET = 2,	    /* into buf+off, or a view slot with KVB_OPF_VIEW */
	KVB_OP_ACQUIRE = 3, /* completion carries the lease */
	KVB_OP_RELEASE = 4, /* lease_id in off */
	KVB_OP_DELETE = 5,
	KVB_OP_LOOKUP = 6, /* synchronous API only (kvb_lookup) */
	KVB_OP_PREFETCH = 7,
	KVB_OP__COUNT,
};

#define KVB_OPF_VIEW (1u << 0) /* buf is a view id and off a token slot */
/*
 * PUT only (broker ABI 1.4): the op's parent key is given (kvb_submit_parents(), or the
 * library's kvb_put_child()/kvb_view_put_child()). The broker then evicts the page's chain
 * tail first: no page is evicted while a page stored with it as parent is in RAM, so a
 * prefix LOOKUP never finds a hole in the middle of a chain. Set by the library; a broker
 * older than ABI 1.4 (or one without room in the ring's arg area) is sent plain PUTs.
 */
#define KVB_OPF_PARENT (1u << 2)
/*
 * The broker serves the op, never the library inside kvb_submit(): a view GET of a page the
 * pool directory lists is otherwise copied by kvb_submit() itself, on the caller's thread,
 * before it returns (docs/protocol.md, "View GETs through the pool directory"). For callers
 * that go on with work of their own between kvb_submit() and kvb_reap() (an engine loads layer
 * groups while it computes): the copy then runs on the broker's CPU meanwhile. Library only,
 * never sent to the broker.
 */
#define KVB_OPF_ASYNC (1u << 3)

struct kvb_op {
	uint32_t opcode; /* enum kvb_opcode */
	uint32_t flags;	 /* KVB_OPF_* */
	uint32_t ns;	 /* ignored with KVB_OPF_VIEW (the view's namespace) */
	uint32_t buf;	 /* buffer id, or view id */
	kvb_key key;
	uint64_t off;	      /* byte offset in buf, token slot of a view, or a lease id */
	uint16_t layer_first; /* view GET only */
	uint16_t layer_count; /* view GET only; 0: all */
	uint32_t resv;	      /* must be 0 */
	uint64_t user_data;   /* returned in the completion */
};

/* Completion flags. */
#define KVB_CQEF_EXISTED (1u << 0) /* PUT: already stored, nothing copied */

struct kvb_completion {
	uint64_t user_data;
	int32_t res;		/* >= 0 success, negative errno */
	uint32_t flags;		/* KVB_CQEF_* */
	struct kvb_lease lease; /* ACQUIRE only */
};

/*
 * Queues up to n ops and rings the broker once. Returns how many were queued (may be fewer than
 * n when the ring is full: reap and retry), or a negative errno.
 */
int kvb_submit(kvb_client *c, const struct kvb_op *ops, size_t n);

/*
 * kvb_submit() whose PUTs may name their parents (library 0.4, broker ABI 1.4): parents[i] is
 * the parent key of ops[i] when ops[i].flags has KVB_OPF_PARENT (as kvb_put_child()), unread
 * otherwise; parents may be NULL when no op has the flag. -EINVAL: KVB_OPF_PARENT on an op
 * other than PUT, or with parents NULL. The keys are copied before the call returns.
 */
int kvb_submit_parents(kvb_client *c, const struct kvb_op *ops, const kvb_key *parents, size_t n);

/*
 * Reaps up to max completions, waiting until at least min have arrived or timeout_ms passed
 * (-1: no limit). Completions may arrive out of submission order (a PUT or GET whose copy runs
 * asynchronously in the broker, e.g. into GPU memory, completes later): match by user_data.
 * A PUT of a key whose PUT is still copying waits for it and completes with KVB_CQEF_EXISTED.
 * Returns the count reaped, -ETIMEDOUT when fewer than min arrived in time, -ECONNRESET when
 * the broker went away, or -ESHUTDOWN when another thread called kvb_close() meanwhile (then
 * this thread must not touch the client again). With a kvb_completion_fd(), the call that
 * leaves nothing to reap re-arms that fd.
 */
int kvb_reap(kvb_client *c, struct kvb_completion *out, size_t max, size_t min, int timeout_ms);

/*
 * A file descriptor that polls readable (POLLIN / EPOLLIN, level-triggered) while completions
 * of kvb_submit()'s ops wait to be reaped, for an event loop (asyncio's loop.add_reader(),
 * LMCache's event_fd()) that must not block in kvb_reap(). The contract:
 *
 *   - Readable whenever at least one completion is ready for kvb_reap(), including ones that
 *     arrive late (asynchronous copies, disk promotions): no wake-up is lost, whichever
 *     thread or call (synchronous calls included) happened to take them off the ring.
 *   - Never read() it or write it (it is an epoll instance: read() fails). When it polls
 *     readable, call kvb_reap(c, out, max, 0, 0) until it returns 0; the call that finds
 *     nothing left re-arms the fd, after which it polls readable again only once a new
 *     completion arrives. It may poll readable once more with nothing to reap (a wake-up
 *     meant for a synchronous call); kvb_reap() then returns 0 and re-arms it.
 *   - Add it to any epoll set, poll() or select() it, from any thread; several waiters all
 *     see it readable. It stays readable while completions wait, however many.
 *
 * The first call creates it; later calls return the same fd. It belongs to the client: do not
 * close it; kvb_close() does. While it exists the broker writes the client's completion
 * doorbell after every batch of completions (an eventfd write, about a microsecond), which a
 * client without one avoids while it spins. Errors: -EMFILE/-ENFILE/-ENOMEM creating it, and
 * those of every call (-ECONNRESET, -EOPNOTSUPP on a control client).
 */
int kvb_completion_fd(kvb_client *c);

/*
 * The broker's statistics as a JSON document; free *json with free(). Read page by page from
 * an ABI 1.3 broker, so it has no size limit (thousands of namespaces and clients).
 */
int kvb_stats_json(kvb_client *c, char **json);

/*
 * Ends another client's session (kvbctl drop): its leases are released and its library
 * unmaps the pool, so its calls fail -ECONNRESET. For operators: the caller must run as the
 * broker's uid or root. Works on a control client (KVB_CONNECT_CONTROL). Errors: -EPERM not an
 * operator, -ENOENT no client of that id, -EINVAL the caller's own id, -EOPNOTSUPP a broker
 * before ABI 1.3, those of every call.
 */
int kvb_drop_client(kvb_client *c, uint32_t client_id);

/*
 * Sets the cap of every namespace of model (kvbrokerd --ns-limit MODEL=SIZE|N%) on a running
 * broker: bytes of RAM slots each, or percent (1..100) of its tenant's partition; both 0
 * removes it. Takes effect at once: a namespace over its new cap has its coldest pages evicted
 * (demoted to the disk tier where there is one) down to it; nothing else moves. For operators
 * (the broker's uid or root); works on a control client. Errors: -EPERM not an operator,
 * -EINVAL an empty or too long model (63 bytes at most) or both bytes and percent, -ENOSPC
 * the broker's table of limits is full, -ENOENT removing a limit that is not set, -EOPNOTSUPP
 * a broker before ABI 1.7, those of every call.
 */
int kvb_ns_limit(kvb_client *c, const char *model, uint64_t bytes, uint32_t percent);

/*
 * Sets the share of tenant (a uid or gid as the broker's --tenants says, or a user or group
 * name) on a running broker: bytes, or percent (1..100) of the pool; both 0 returns it to the
 * default share. A share is a guarantee: what the tenant can always reclaim from tenants
 * borrowing beyond theirs. Raising it takes effect at once (its next PUTs reclaim); lowering it
 * evicts nothing (what it holds beyond is lent, reclaimed when another tenant needs it). For
 * operators (the broker's uid or root); works on a control client. Errors: -EPERM not an
 * operator, -EINVAL malformed or a share below 8 MiB or above the pool, -ENOENT no such user or
 * group, -EUSERS a tenant with no partition and none free, -EOPNOTSUPP a broker without
 * --tenants or before ABI 1.8, those of every call.
 */
int kvb_tenant_share(kvb_client *c, const char *tenant, uint64_t bytes, uint32_t percent);

#ifdef __cplusplus
}
#endif

#endif /* KVBROKER_H */
