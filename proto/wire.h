/* SPDX-License-Identifier: MIT */
/*
 * wire.h - every byte that crosses between kvbrokerd and a client.
 *
 * Two channels:
 *
 * 1. The control socket (AF_UNIX, SOCK_SEQPACKET). Each message is one datagram:
 *    struct kvb_msg_hdr followed by a type-specific body. Requests carry a seq the reply echoes.
 *    Replies are struct kvb_msg_hdr + struct kvb_msg_reply (+ body). File descriptors travel as
 *    SCM_RIGHTS with the message that names them.
 *
 *      client                         broker
 *      HELLO{abi, name, sq_entries,
 *            cpu node, gpu bus id} ->
 *                                  <- HELLO reply{client id, region geometry, pool geometry}
 *                                     + fds [region memfd, sq doorbell, cq doorbell, arena fds...]
 *      NS_OPEN{layout}             -> <- {ns, page_bytes}
 *      BUF_REG{len} + fd           -> <- {buf}
 *      BUF_UNREG{buf}              -> <- {}
 *      VIEW_CREATE{ns, parts[]}    -> <- {view}
 *      VIEW_DESTROY{view}          -> <- {}
 *      STATS{}                     -> <- {json text}
 *      BUF_REG_GPU{uuid, handle, range} (+ fd for cuMem memory) -> <- {buf}
 *      BUF_REG_FD{offset, len} + fd  -> <- {buf}                       (ABI 1.2)
 *      VIEW_CREATE2{ns, parts2[]}  -> <- {view}                        (ABI 1.2)
 *      NS_OPEN{layout, ident}      -> <- {ns, page_bytes}              (ABI 1.2)
 *
 *    A client sends an ABI 1.2 message only to a broker whose HELLO reply reported minor >= 2:
 *    an older broker would reject the new types, and would read an NS_OPEN's layout and
 *    silently ignore the identity after it (merging namespaces that must stay apart).
 *
 *    A message whose length, type or fields do not validate is answered with -EPROTO/-EINVAL;
 *    a HELLO with a different ABI major is answered with -EPROTO and the socket closed.
 *
 * 2. The ring region, a memfd the broker creates per client (sealed against shrink and grow),
 *    mapped read-write by both. Layout (offsets are published in the header; clients must use
 *    them rather than their own sizeof):
 *
 *      [0]        struct kvb_region_hdr                          one cache line
 *      [64]       sq tail                 written by the client  own cache line
 *      [128]      sq head, sq flags       written by the broker  own cache line
 *      [192]      cq tail                 written by the broker  own cache line
 *      [256]      cq head, cq flags       written by the client  own cache line
 *      [sqes_off] sq_entries x struct kvb_sqe (64 B)
 *      [cqes_off] cq_entries x struct kvb_cqe (32 B)
 *      [arg_off]  argument area (key arrays of LOOKUP, tier bytes back), page aligned
 *      [notes]    KVB_FEAT_NOTES (ABI 1.6): the note ring, right after the argument area
 *                 (kvb_region_notes_off()): its tail line (client), its head line (broker),
 *                 KVB_NOTES_ENTRIES x struct kvb_sqe
 *
 *    See ring.h for the index protocol and the wake-up protocol.
 *
 * All fields are fixed-width; no pointers, bool, enums or size_t. Little-endian host order (both
 * sides run on the same machine).
 */
#ifndef KVB_PROTO_WIRE_H
#define KVB_PROTO_WIRE_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbroker.h"

#define KVB_ABI_MAJOR 1
/* 1: BUF_REG_GPU; 2: BUF_REG_FD, VIEW_CREATE2, NS_OPEN identity, KVB_SQEF_GET;
 * 3: DROP, paged STATS (struct kvb_msg_stats_page);
 * 4: KVB_SQEF_FILL (the filled PUT: ask-first, pipelined PUT from plain memory), KVB_OPF_PARENT
 *    (a PUT's parent key, in the arg area: chains evicted tail first);
 * 5: the pool directory (proto/pooldir.h, HELLO reply dir_units), GET with KVB_SQEF_GET;
 * 6: the note ring (KVB_FEAT_NOTES);
 * 7: NS_LIMIT (an operator sets or removes a model's namespace cap at run time);
 * 8: TENANT_SHARE (an operator sets a tenant's share at run time) */
#define KVB_ABI_MINOR 8

#define KVB_MSG_MAGIC 0x4b56424du    /* "KVBM" */
#define KVB_REGION_MAGIC 0x4b564252u /* "KVBR" */

/* Bounds both sides enforce. */
#define KVB_MSG_MAX (64u * 1024)     /* largest control datagram, request or reply */
#define KVB_STATS_MAX (1024u * 1024) /* stats replies may be larger: read with MSG_PEEK|MSG_TRUNC */
#define KVB_SQ_MIN 8u
#define KVB_SQ_MAX 4096u
#define KVB_SQ_DEFAULT 256u
#define KVB_MAX_FDS 16u /* SCM_RIGHTS fds in one message */
#define KVB_MAX_ARENAS 8u
#define KVB_MAX_VIEW_PARTS 1024u /* (component, layer) pairs of one view */
#define KVB_MAX_PAGE_BYTES (1ull << 30)
#define KVB_NAME_MAX 32

enum kvb_msg_type {
	KVB_MSG_HELLO = 1,
	KVB_MSG_NS_OPEN = 2,
	KVB_MSG_BUF_REG = 3,
	KVB_MSG_BUF_UNREG = 4,
	KVB_MSG_VIEW_CREATE = 5,
	KVB_MSG_VIEW_DESTROY = 6,
	KVB_MSG_STATS = 7,
	KVB_MSG_BUF_REG_GPU = 8,
	KVB_MSG_BUF_REG_FD = 9,	   /* ABI 1.2 */
	KVB_MSG_VIEW_CREATE2 = 10, /* ABI 1.2 */
	KVB_MSG_DROP = 11,	   /* ABI 1.3: {client id} ends that client's session */
	KVB_MSG_NS_LIMIT = 12,	   /* ABI 1.7: struct kvb_msg_ns_limit, operators only */
	KVB_MSG_TENANT_SHARE = 13, /* ABI 1.8: struct kvb_msg_tenant_share, operators only */
	KVB_MSG__COUNT,
};

#define KVB_MSGF_REPLY (1u << 0)

struct kvb_msg_hdr {
	uint32_t magic; /* KVB_MSG_MAGIC */
	uint16_t type;	/* enum kvb_msg_type */
	uint16_t flags; /* KVB_MSGF_* */
	uint32_t len;	/* whole datagram, header included */
	uint32_t seq;	/* chosen by the client, echoed in the reply */
};
static_assert(sizeof(struct kvb_msg_hdr) == 16, "msg hdr");

/* Every reply starts with this after the header. */
struct kvb_msg_reply {
	int32_t res;   /* >= 0 or negative errno */
	uint32_t resv; /* 0 */
};
static_assert(sizeof(struct kvb_msg_reply) == 8, "reply");

/* HELLO flags. */
#define KVB_HELLOF_CONTROL (1u << 0) /* control only (kvbctl): no rings, no pool, not counted */
#define KVB_HELLOF_PLACE (1u << 1)   /* ABI 1.1: cpu_node and gpu_busid are meaningful */

#define KVB_BUSID_MAX 32
#define KVB_MSG_HELLO_V0_SIZE 48u /* an ABI 1.0 HELLO stops after name */

struct kvb_msg_hello {
	uint16_t abi_major;
	uint16_t abi_minor;
	uint32_t flags;		 /* KVB_HELLOF_* */
	uint32_t sq_entries;	 /* power of two, KVB_SQ_MIN..KVB_SQ_MAX; 0: default */
	uint32_t resv;		 /* 0 */
	char name[KVB_NAME_MAX]; /* NUL-terminated */
	/* ABI 1.1, read only with KVB_HELLOF_PLACE: where this client's new pages should go. */
	int32_t cpu_node;	       /* NUMA node the client runs on, -1 unknown */
	uint32_t resv2;		       /* 0 */
	char gpu_busid[KVB_BUSID_MAX]; /* its GPU's PCI bus id, NUL-terminated, "" none; the
					  broker reads the GPU's node, which wins over cpu_node */
};
static_assert(sizeof(struct kvb_msg_hello) == 88, "hello");
static_assert(offsetof(struct kvb_msg_hello, cpu_node) == KVB_MSG_HELLO_V0_SIZE, "hello v0");

struct kvb_arena_desc {
	uint64_t size; /* bytes, maps from offset 0 of its fd */
	int32_t node;  /* NUMA node, -1 unknown */
	uint32_t resv;
};
static_assert(sizeof(struct kvb_arena_desc) == 16, "arena desc");

/*
 * HELLO reply body. fds, in order: region memfd, sq doorbell eventfd (client writes),
 * cq doorbell eventfd (broker writes), then narenas read-only arena fds.
 */
struct kvb_msg_hello_reply {
	uint16_t abi_major;
	uint16_t abi_minor;
	uint32_t client_id;
	uint64_t region_size;
	uint32_t narenas;
	uint32_t dir_units; /* ABI 1.5: the directory's 4 KiB units at byte 0 of arena 0; 0 none */
	struct kvb_arena_desc arenas[KVB_MAX_ARENAS];
};
static_assert(sizeof(struct kvb_msg_hello_reply) == 24 + 16 * KVB_MAX_ARENAS, "hello reply");

/*
 * NS_OPEN: body is struct kvb_layout verbatim (it is fixed-width by construction). ABI 1.2:
 * struct kvb_ns_ident may follow it (body of exactly layout + ident); without it the identity
 * is the default one. A client sends the ident only when it is not the default.
 */
static_assert(sizeof(struct kvb_layout) == 64 + 5 * 4 + KVB_MAX_COMPONENTS * 24 + 16, "layout");
static_assert(offsetof(struct kvb_layout, comp) == 84, "layout comp");
static_assert(sizeof(struct kvb_ns_ident) == 96, "ns ident");
static_assert(offsetof(struct kvb_ns_ident, page_format) == 16, "ns ident format");
static_assert(offsetof(struct kvb_ns_ident, pp_size) == 48, "ns ident pp");
static_assert(offsetof(struct kvb_ns_ident, flags) == 72, "ns ident flags");
#define KVB_MSG_NS_OPEN_V2_SIZE (sizeof(struct kvb_layout) + sizeof(struct kvb_ns_ident))

struct kvb_msg_ns_reply {
	uint32_t ns;
	uint32_t resv;
	uint64_t page_bytes;
};
static_assert(sizeof(struct kvb_msg_ns_reply) == 16, "ns reply");

/* BUF_REG: one fd (a memfd with F_SEAL_SHRINK) travels with it. */
struct kvb_msg_buf_reg {
	uint64_t len;  /* bytes from offset 0 of the fd */
	uint32_t kind; /* KVB_BUF_HOST */
	uint32_t resv;
};
static_assert(sizeof(struct kvb_msg_buf_reg) == 16, "buf reg");
#define KVB_BUF_HOST 1

/*
 * BUF_REG_GPU: GPU memory of the client, on the CUDA device whose UUID is given. The broker
 * opens the allocation that holds it once per client (cache key: alloc_base) and registers
 * [alloc_base + off, + len) of it. KVB_BUF_GPU_IPC: handle is a CUipcMemHandle
 * (cuIpcGetMemHandle of the allocation), no fd. KVB_BUF_GPU_FD: memory of CUDA's virtual-memory
 * API, which legacy IPC cannot export: one fd travels with the message
 * (cuMemExportToShareableHandle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), handle is zero and
 * alloc_size is the allocation's size (a multiple of its granularity).
 */
struct kvb_msg_buf_reg_gpu {
	uint8_t uuid[16];    /* CUuuid of the device */
	uint8_t handle[64];  /* KVB_BUF_GPU_IPC: CUipcMemHandle; else 0 */
	uint64_t alloc_base; /* the allocation's base address in the client */
	uint64_t alloc_size; /* its size in bytes */
	uint64_t off;	     /* registered range: from alloc_base + off ... */
	uint64_t len;	     /* ... len bytes, inside the allocation */
	uint32_t kind;	     /* KVB_BUF_GPU_IPC or KVB_BUF_GPU_FD */
	uint32_t resv;	     /* 0 */
};
static_assert(sizeof(struct kvb_msg_buf_reg_gpu) == 120, "buf reg gpu");
static_assert(offsetof(struct kvb_msg_buf_reg_gpu, alloc_base) == 80, "buf reg gpu base");
#define KVB_BUF_GPU_IPC 2
#define KVB_BUF_GPU_FD 3

/*
 * BUF_REG_FD (ABI 1.2): [off, off + len) of a host-memory file the client owns; one fd travels
 * with it. The broker accepts only a tmpfs file (-EMEDIUMTYPE) with off + len <= its size
 * (-EFAULT). Sealed F_SEAL_SHRINK: it maps the enclosing pages. Unsealed: -EPERM, unless
 * flags has KVB_BUF_REG_FD_FDCOPY; then it copies with pread/pwrite on the file and maps
 * nothing (the fd must be open O_RDWR, not O_APPEND: -EBADF). The client seals the fd first
 * when the caller asked (KVB_BUF_SEAL is the client's business, not on the wire).
 */
struct kvb_msg_buf_reg_fd {
	uint64_t off;	/* byte offset in the file, any alignment */
	uint64_t len;	/* bytes, >= 1 */
	uint32_t flags; /* KVB_BUF_REG_FD_* */
	uint32_t resv;	/* 0 */
};
#define KVB_BUF_REG_FD_FDCOPY 1u /* an unsealed file is fine: copy by pread/pwrite */
static_assert(sizeof(struct kvb_msg_buf_reg_fd) == 24, "buf reg fd");

/* BUF_UNREG, VIEW_DESTROY; also the reply of BUF_REG and VIEW_CREATE. */
struct kvb_msg_id {
	uint32_t id;
	uint32_t resv;
};
static_assert(sizeof(struct kvb_msg_id) == 8, "id");

/*
 * NS_LIMIT (ABI 1.7): the cap of every namespace of one model (--ns-limit MODEL=SIZE|N%), set
 * or removed on a running broker. bytes or percent (1..100, of the namespace's tenant
 * partition) sets it, both 0 removes it; the reply's res is 0 or -EPERM (not the broker's uid
 * or root), -EINVAL (malformed), -ENOSPC (the table of limits is full), -ENOENT (removing a
 * model with no limit).
 */
struct kvb_msg_ns_limit {
	char model[64];	  /* NUL-terminated, not empty */
	uint64_t bytes;	  /* the cap in bytes, or 0 */
	uint32_t percent; /* or the cap in percent of the partition, or 0 */
	uint32_t resv;	  /* 0 */
};
static_assert(sizeof(struct kvb_msg_ns_limit) == 80, "ns_limit");

/*
 * TENANT_SHARE (ABI 1.8): the share of one tenant (--tenant ID=SIZE|N%) set on a running broker
 * with --tenants uid or gid: bytes, or percent (1..100) of the pool; both 0 returns it to the
 * default share (--tenant-share). A tenant with no partition yet is given one, as --tenant
 * does at start-up. The reply's res is 0 or -EPERM (not the broker's uid or root), -EINVAL
 * (malformed, or a share below the smallest, 8 MiB, or above the pool), -ENOENT (no such user
 * or group), -EUSERS (a new tenant and no partition free), -EOPNOTSUPP (no --tenants).
 */
struct kvb_msg_tenant_share {
	char tenant[64];  /* NUL-terminated: a uid or gid, or a user or group name */
	uint64_t bytes;	  /* the share in bytes, or 0 */
	uint32_t percent; /* or in percent of the pool, or 0 */
	uint32_t resv;	  /* 0 */
};
static_assert(sizeof(struct kvb_msg_tenant_share) == 80, "tenant_share");

/* VIEW_CREATE: header then nparts x struct kvb_view_part. */
struct kvb_msg_view_create {
	uint32_t ns;
	uint32_t nparts;
};
static_assert(sizeof(struct kvb_msg_view_create) == 8, "view create");
static_assert(sizeof(struct kvb_view_part) == 16, "view part");

/* VIEW_CREATE2 (ABI 1.2): header then nparts x struct kvb_view_part2 (page strides). */
struct kvb_msg_view_create2 {
	uint32_t ns;
	uint32_t nparts;
	uint32_t flags; /* 0 */
	uint32_t resv;	/* 0 */
};
static_assert(sizeof(struct kvb_msg_view_create2) == 16, "view create2");
static_assert(sizeof(struct kvb_view_part2) == 32, "view part2");
static_assert(offsetof(struct kvb_view_part2, page_stride) == 16, "view part2 page_stride");

/*
 * STATS (ABI 1.3) with this body: one page of the document, bytes [offset, offset + max) of
 * it (max 0: the broker's choice, at most KVB_STATS_PAGE), and reply res = the document's
 * whole length. Offset 0 renders the document afresh; later pages come from that rendering,
 * so a document read page by page is one consistent snapshot of any size. Without a body
 * STATS answers the whole document in one datagram, res 0 (ABI 1.0: at most KVB_STATS_MAX,
 * and what the socket's buffer takes).
 */
#define KVB_STATS_PAGE (48u * 1024)
struct kvb_msg_stats_page {
	uint64_t offset;
	uint32_t max;
	uint32_t flags; /* 0 */
};
static_assert(sizeof(struct kvb_msg_stats_page) == 16, "stats page");

/* ---- ring region ---- */

#define KVB_FEAT_NEED_WAKEUP (1u << 0)
/*
 * [notes] ABI 1.6: the region has a note ring after its argument area, a second
 * client-to-broker ring of SQEs that the broker reads when it gets round to it rather than in
 * every round: in each loop tick (at least every millisecond while it is busy, after every
 * wake-up), before it sleeps, before it renders STATS, before an ACQUIRE or RELEASE of the
 * session's SQ, before a full pool or --max-pinned refuses anything, and when the session
 * ends. Only a GET with KVB_SQEF_GET (a read through the
 * pool directory, told afterwards) and a RELEASE of a lease the session holds may go there;
 * no CQE comes back. What it saves is the cache-line traffic of the SQ: a broker that polls the SQ
 * pulls its tail and entry lines to its CPU on every round, so a post there costs the client
 * two cache misses on the way to its next read, and the CQE two more; the note ring's lines
 * stay in the client's cache between drains. The broker trusts nothing there: an impossible
 * tail ends the session, any other entry is counted as a protocol error and skipped.
 */
#define KVB_FEAT_NOTES (1u << 1)
#define KVB_NOTES_ENTRIES 256u
#define KVB_NOTES_TAIL 0u   /* from kvb_region_notes_off(): written by the client */
#define KVB_NOTES_HEAD 64u  /* written by the broker */
#define KVB_NOTES_SQES 128u /* the entries */
#define KVB_NOTES_BYTES (KVB_NOTES_SQES + KVB_NOTES_ENTRIES * 64u)
/*
 * [hazard] ABI 1.6: right after the note ring, the client's hazard table, through which it
 * leases a page the pool directory lists without a round trip (kvb_acquire). One line with the
 * number of entries in use (KVB_HZ_COUNT, u32), then KVB_HZ_ENTRIES u64 entries: 0 free, or
 * the loc of a page it reads (as a CQE's, every slot is 4 KiB aligned) | 1. Both written by the
 * client only. The two sides' order (the classic hazard pointer, a Dekker pair of full fences):
 *   client: entry = loc | 1; count++; full fence [H1]; then the directory entry's seq and the
 *           epoch again (pooldir.h): unchanged, and the page is leased until it clears the
 *           entry; changed, and it clears it and asks the broker;
 *   broker: before a page leaves the directory for good (unindex), after withdrawing its entry:
 *           full fence [H1]; every session whose count is not 0 that names the page's loc
 *           gets a pin on it, held until that entry no longer names it (read every tick).
 * Either the client sees the withdrawal or the broker sees the entry, so a slot is never
 * rewritten under a reader. The broker trusts the table only as far as it hurts the session's
 * own tenant: entries naming pages outside the session's partition are ignored, and a pin
 * held past --lease-lifetime ends the session as a lease would. Lease ids the library makes
 * for such leases have KVB_HZ_LEASE_MIN or more in their low 32 bits, which no page id of the
 * broker's reaches (store.c).
 */
#define KVB_FEAT_HAZARDS (1u << 2)
#define KVB_HZ_ENTRIES 32u
#define KVB_HZ_COUNT 0u	 /* from kvb_region_hz_off() */
#define KVB_HZ_TABLE 64u /* the entries */
#define KVB_HZ_BYTES (KVB_HZ_TABLE + KVB_HZ_ENTRIES * 8u)
#define KVB_HZ_LEASE_MIN 0xffffff00u
/*
 * In a spare word of the note ring's head line (broker): the page bytes the session may still
 * hold under its hazard table (u64, 0 no limit): its --max-lease-bytes share less its leases
 * through the broker, rewritten as those come and go (once, before 2026-12-04), so that its
 * leases of either kind stay within the limits together. The ACQUIRE and RELEASE with
 * KVB_SQEF_HELD carry the library's lease id in off, so the broker can count what each holds.
 */
#define KVB_HZ_BUDGET (KVB_NOTES_HEAD + 8u)
/* And (u32, broker, likewise) how many entries it may still use: --max-leases less its leases
 * through the broker, at most KVB_HZ_ENTRIES. */
#define KVB_HZ_MAX (KVB_NOTES_HEAD + 16u)

struct kvb_region_hdr {
	uint32_t magic; /* KVB_REGION_MAGIC */
	uint16_t abi_major;
	uint16_t abi_minor;
	uint32_t features;   /* KVB_FEAT_* */
	uint32_t hdr_size;   /* sizeof(struct kvb_region_hdr) at the broker */
	uint32_t sq_entries; /* power of two */
	uint32_t cq_entries; /* power of two, 2 x sq_entries */
	uint32_t sq_tail_off;
	uint32_t sq_head_off;
	uint32_t sq_flags_off;
	uint32_t cq_tail_off;
	uint32_t cq_head_off;
	uint32_t cq_flags_off;
	uint32_t sqes_off;
	uint32_t cqes_off;
	uint32_t arg_off;
	uint32_t arg_size;
};
static_assert(sizeof(struct kvb_region_hdr) == 64, "region hdr");

/* sq flags (broker writes): the broker sleeps; ring the sq doorbell after publishing. */
#define KVB_SQ_NEED_WAKEUP (1u << 0)
/*
 * ABI 1.3: the broker ended this session while it lives on (kvbctl drop, --lease-lifetime):
 * leased pages may be reused for others' data, so the library unmaps the pool at once and a
 * stale lease pointer faults. Without it (a broker that died) the mapping stays and leases keep
 * reading: the next broker holds their pages until the library copied them ([retire] below).
 */
#define KVB_SQ_REVOKED (1u << 1)
/* cq flags (client writes): the client sleeps; ring the cq doorbell after posting. */
#define KVB_CQ_NEED_WAKEUP (1u << 0)

/* SQE flags: KVB_OPF_* of kvbroker.h, and the library's own: */
/*
 * KVB_SQEF_GET (ABI 1.2): on the ACQUIRE and the RELEASE that kvb_get() issues for a
 * destination in plain memory: the broker counts the pair as that GET (counters.gets, with its
 * hit or miss), not as an ACQUIRE and a RELEASE. ABI 1.5, on a GET that names no buffer (buf,
 * off and layers 0): the client read the page itself through the pool directory
 * (pooldir.h [dir]); the broker counts that GET and its hit and touches the page, copying
 * nothing. Refused on any other op.
 */
#define KVB_SQEF_GET (1u << 7)
/*
 * KVB_SQEF_FILL (ABI 1.4): a PUT whose source, a host buffer of the client, is being
 * filled while the op runs (kvb_put() from plain memory: the library's copy into its staging
 * buffer overlaps the broker's copy out of it). The broker asks first: a key stored (RAM or
 * disk) completes EXISTED having read nothing, and a key being written waits for that write;
 * either way the broker then stores this PUT's sequence number in the fill-stop word, and the
 * client stops filling. Otherwise the broker copies the bytes the fill word says are ready,
 * as they become ready, into a WRITING page that is committed (made visible) only once all of
 * it was copied. -EAGAIN when the broker gave up on the fill (no progress for a while, or told
 * the client to stop and then found it must write after all): the client sends a plain PUT.
 * Refused with KVB_OPF_VIEW and on every other op. See docs/protocol.md, "Filled PUT".
 */
#define KVB_SQEF_FILL (1u << 1)
/*
 * KVB_SQEF_HELD (ABI 1.6), in the note ring only, on an ACQUIRE or a RELEASE: a lease the
 * client took itself under its hazard table ([hazard] above), told afterwards: the broker counts
 * the ACQUIRE (with its hit, touching the page) or the RELEASE and pins nothing (an async
 * RELEASE of such a lease the library answers itself and tells here; on the SQ, as any note,
 * only when this ring is full, and then it completes as any SQE).
 */
#define KVB_SQEF_HELD (1u << 6)
struct kvb_sqe {
	uint8_t opcode;	    /* enum kvb_opcode */
	uint8_t flags;	    /* KVB_OPF_* */
	uint16_t resv0;	    /* 0 */
	uint32_t ns;	    /* namespace id (ignored with KVB_OPF_VIEW) */
	uint64_t user_data; /* echoed in the CQE */
	union {
		uint8_t key[32];	   /* page ops */
		struct {		   /* LOOKUP */
			uint32_t arg_off;  /* keys: count x 32 bytes in the arg area */
			uint32_t count;	   /* number of keys */
			uint32_t out_off;  /* tiers: count bytes in the arg area */
			uint32_t resv1[5]; /* 0 */
		} batch;
	};
	uint32_t buf; /* buffer id, or view id with KVB_OPF_VIEW */
	union {
		struct {
			uint16_t layer_first; /* view GET: first layer */
			uint16_t layer_count; /* view GET: layers, 0 = all */
		};
		uint32_t parent_off; /* PUT with KVB_OPF_PARENT: see below */
	};
	uint64_t off; /* offset in buf, view token slot, or lease id (RELEASE) */
};
static_assert(sizeof(struct kvb_sqe) == 64, "sqe");
static_assert(offsetof(struct kvb_sqe, user_data) == 8, "sqe user_data");
static_assert(offsetof(struct kvb_sqe, key) == 16, "sqe key");
static_assert(offsetof(struct kvb_sqe, buf) == 48, "sqe buf");
static_assert(offsetof(struct kvb_sqe, off) == 56, "sqe off");
static_assert(offsetof(struct kvb_sqe, parent_off) == 52, "sqe parent_off");

/*
 * KVB_OPF_PARENT (ABI 1.4) on a PUT: the 32-byte key of the page this one continues
 * (its prefix) is at byte parent_off of the arg area; the SQE has no room for a second key. The
 * broker reads it once, when it takes the SQE, so the client may reuse those bytes as soon as
 * the CQE came. The library gives each op slot its own 32 bytes at the top of the arg area
 * (slot i at arg_size - 32 * (i + 1)) and LOOKUP the rest. Refused on any other op, and
 * -EINVAL when parent_off + 32 passes arg_size.
 */

struct kvb_cqe {
	uint64_t user_data; /* from the SQE */
	int32_t res;	    /* >= 0 or negative errno; LOOKUP: leading hits */
	uint32_t flags;	    /* KVB_CQEF_* */
	uint64_t lease;	    /* ACQUIRE: lease id */
	uint64_t loc;	    /* ACQUIRE: (arena << 56) | byte offset in the arena */
};
static_assert(sizeof(struct kvb_cqe) == 32, "cqe");
static_assert(offsetof(struct kvb_cqe, res) == 8, "cqe res");
static_assert(offsetof(struct kvb_cqe, lease) == 16, "cqe lease");

#define KVB_LOC_ARENA(loc) ((uint32_t)((loc) >> 56))
#define KVB_LOC_OFF(loc) ((loc) & ((1ull << 56) - 1))
#define KVB_LOC(arena, off) (((uint64_t)(arena) << 56) | (uint64_t)(off))

/* Region geometry both sides compute identically from sq_entries and arg_size. */
#define KVB_REGION_LINE 64u
#define KVB_REGION_SQ_TAIL 64u
#define KVB_REGION_SQ_HEAD 128u
#define KVB_REGION_SQ_FLAGS 132u
#define KVB_REGION_CQ_TAIL 192u
#define KVB_REGION_CQ_HEAD 256u
#define KVB_REGION_CQ_FLAGS 260u
#define KVB_REGION_SQES 320u
/*
 * Spinning hints, in spare words of the two sides' lines (zero in a fresh region, so
 * a peer that never writes them reads as "unknown"): the broker's loop writes the CPU it polls
 * on + 1 at sq head + 8; a client writes the CPU it spins on + 1 at cq head + 8 while it spins
 * on its CQ or fills a PUT's source (KVB_SQEF_FILL), 0 otherwise. A side that finds the other
 * spinning on its own CPU yields (sched_yield) while it spins, so that the two take turns
 * rather than wait for a time slice (a broker waiting for a fill on its CPU sleeps instead);
 * elsewhere it never yields, since on a loaded machine a yield hands the CPU to unrelated tasks
 * for a slice. Hints only: a wrong value costs time, never correctness.
 */
#define KVB_REGION_BROKER_CPU (KVB_REGION_SQ_HEAD + 8u)
#define KVB_REGION_CLIENT_CPU (KVB_REGION_CQ_HEAD + 8u)
/*
 * KVB_SQEF_FILL's two words (ABI 1.4), one in each side's line. The fill word (client): bytes
 * of the current filled PUT's source that are in place, stored with release after the bytes
 * [F1]; 0 before the SQE is published. The fill-stop word (broker): the sequence number of the
 * last filled PUT whose source it needs no more of; both sides number this session's
 * KVB_SQEF_FILL SQEs 1, 2, ... in ring order. The broker trusts neither: bytes past the page
 * or going backwards are ignored, and a stop for another PUT only ends that client's fill.
 */
#define KVB_REGION_FILL (KVB_REGION_CQ_HEAD + 16u)
#define KVB_REGION_FILL_STOP (KVB_REGION_SQ_HEAD + 16u)
/*
 * [retire] In the client's line (u32, client): KVB_RETIRED_MAGIC once the library, finding its
 * broker gone, holds private copies of every lease it had of that broker (client/conn.c), so a
 * broker that adopted the pool may reuse those pages (broker/orphan.c). Zero in a fresh region;
 * a client that writes it early only lets go of its own leases.
 */
#define KVB_REGION_RETIRED (KVB_REGION_CQ_HEAD + 24u)
#define KVB_RETIRED_MAGIC 0x44525452u /* "RTRD" */

#endif /* KVB_PROTO_WIRE_H */
