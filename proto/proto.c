// SPDX-License-Identifier: MIT
/*
 * proto.c - validation and geometry shared by broker and client. Pure functions over untrusted
 * bytes: every length and count is checked before it is used, sums are done in 64 bits.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include "proto.h"

#define ARG_ALIGN 4096u

static_assert(KVB_NOTES_BYTES == KVB_NOTES_SQES + KVB_NOTES_ENTRIES * sizeof(struct kvb_sqe),
	      "note ring entries are SQEs");

int64_t kvb_region_layout(uint32_t sq_entries, uint32_t arg_size, struct kvb_region_hdr *h)
{
	uint64_t sqes, cqes, arg, total;

	if (!kvb_is_pow2(sq_entries) || sq_entries < KVB_SQ_MIN || sq_entries > KVB_SQ_MAX)
		return -EINVAL;
	if (arg_size > (64u << 20))
		return -EINVAL;
	memset(h, 0, sizeof(*h));
	h->magic = KVB_REGION_MAGIC;
	h->abi_major = KVB_ABI_MAJOR;
	h->abi_minor = KVB_ABI_MINOR;
	h->features = KVB_FEAT_NEED_WAKEUP | KVB_FEAT_NOTES | KVB_FEAT_HAZARDS;
	h->hdr_size = sizeof(*h);
	h->sq_entries = sq_entries;
	h->cq_entries = 2 * sq_entries;
	h->sq_tail_off = KVB_REGION_SQ_TAIL;
	h->sq_head_off = KVB_REGION_SQ_HEAD;
	h->sq_flags_off = KVB_REGION_SQ_FLAGS;
	h->cq_tail_off = KVB_REGION_CQ_TAIL;
	h->cq_head_off = KVB_REGION_CQ_HEAD;
	h->cq_flags_off = KVB_REGION_CQ_FLAGS;
	sqes = KVB_REGION_SQES;
	cqes = sqes + (uint64_t)sq_entries * sizeof(struct kvb_sqe);
	arg = cqes + (uint64_t)h->cq_entries * sizeof(struct kvb_cqe);
	arg = (arg + ARG_ALIGN - 1) & ~(uint64_t)(ARG_ALIGN - 1);
	arg_size = (arg_size + ARG_ALIGN - 1) & ~(ARG_ALIGN - 1);
	total = arg + arg_size + KVB_NOTES_BYTES + KVB_HZ_BYTES; /* [notes], [hazard] */
	h->sqes_off = (uint32_t)sqes;
	h->cqes_off = (uint32_t)cqes;
	h->arg_off = (uint32_t)arg;
	h->arg_size = arg_size;
	return (int64_t)total;
}

static int within(uint64_t off, uint64_t len, uint64_t size)
{
	return off <= size && len <= size - off;
}

int kvb_region_check(const struct kvb_region_hdr *h, uint64_t region_size)
{
	struct kvb_region_hdr want;
	int64_t size;

	if (h->magic != KVB_REGION_MAGIC || h->abi_major != KVB_ABI_MAJOR)
		return -EPROTO;
	if (h->hdr_size < sizeof(*h))
		return -EPROTO;
	/*
	 * Our geometry is a pure function of the two inputs: anything else is not ours. The
	 * region may end at the argument area: a broker of ABI 1.5 or older has no note ring.
	 */
	size = kvb_region_layout(h->sq_entries, h->arg_size, &want);
	if (size < 0)
		return -EPROTO;
	if (h->cq_entries != want.cq_entries || h->sqes_off != want.sqes_off ||
	    h->cqes_off != want.cqes_off || h->arg_off != want.arg_off ||
	    h->sq_tail_off != want.sq_tail_off || h->sq_head_off != want.sq_head_off ||
	    h->sq_flags_off != want.sq_flags_off || h->cq_tail_off != want.cq_tail_off ||
	    h->cq_head_off != want.cq_head_off || h->cq_flags_off != want.cq_flags_off)
		return -EPROTO;
	if (!within(h->arg_off, h->arg_size, region_size))
		return -EPROTO;
	if ((h->features & KVB_FEAT_NOTES) &&
	    !within(kvb_region_notes_off(h), KVB_NOTES_BYTES, region_size))
		return -EPROTO;
	/* The hazard table follows the note ring: one without the other is not ours. */
	if ((h->features & KVB_FEAT_HAZARDS) &&
	    (!(h->features & KVB_FEAT_NOTES) ||
	     !within(kvb_region_hz_off(h), KVB_HZ_BYTES, region_size)))
		return -EPROTO;
	return 0;
}

int64_t kvb_msg_body_min(uint16_t type)
{
	switch (type) {
	case KVB_MSG_HELLO:
		return KVB_MSG_HELLO_V0_SIZE; /* 1.0 clients; KVB_HELLOF_PLACE needs all of it */
	case KVB_MSG_NS_OPEN:
		return sizeof(struct kvb_layout);
	case KVB_MSG_BUF_REG:
		return sizeof(struct kvb_msg_buf_reg);
	case KVB_MSG_BUF_REG_GPU:
		return sizeof(struct kvb_msg_buf_reg_gpu);
	case KVB_MSG_BUF_UNREG:
	case KVB_MSG_VIEW_DESTROY:
	case KVB_MSG_DROP:
		return sizeof(struct kvb_msg_id);
	case KVB_MSG_VIEW_CREATE:
		return sizeof(struct kvb_msg_view_create);
	case KVB_MSG_BUF_REG_FD:
		return sizeof(struct kvb_msg_buf_reg_fd);
	case KVB_MSG_VIEW_CREATE2:
		return sizeof(struct kvb_msg_view_create2);
	case KVB_MSG_STATS:
		return 0;
	case KVB_MSG_NS_LIMIT:
		return sizeof(struct kvb_msg_ns_limit);
	case KVB_MSG_TENANT_SHARE:
		return sizeof(struct kvb_msg_tenant_share);
	default:
		return -1;
	}
}

int kvb_msg_check(const void *buf, size_t len)
{
	struct kvb_msg_hdr h;
	int64_t min;

	if (len < sizeof(h))
		return -EPROTO;
	memcpy(&h, buf, sizeof(h));
	if (h.magic != KVB_MSG_MAGIC || h.len != len)
		return -EPROTO;
	if (h.flags & KVB_MSGF_REPLY) {
		if (len < sizeof(h) + sizeof(struct kvb_msg_reply))
			return -EPROTO;
		return h.type > 0 && h.type < KVB_MSG__COUNT ? 0 : -EPROTO;
	}
	if (h.flags != 0)
		return -EPROTO;
	min = kvb_msg_body_min(h.type);
	if (min < 0 || len - sizeof(h) < (uint64_t)min || len > KVB_MSG_MAX)
		return -EPROTO;
	return 0;
}

/*
 * A NUL-terminated, non-empty string with nothing but NULs after it: identity hashes the whole
 * field, so garbage after the terminator would silently split one namespace into two.
 */
static int str_ok(const char *s, size_t max)
{
	size_t n = strnlen(s, max);

	if (n == 0 || n == max)
		return 0;
	while (++n < max)
		if (s[n])
			return 0;
	return 1;
}

uint32_t kvb_layout_parts(const struct kvb_layout *l)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < l->ncomponents && i < KVB_MAX_COMPONENTS; i++)
		n += l->comp[i].num_layers;
	return n;
}

int kvb_layout_check(const struct kvb_layout *l, uint64_t *page_bytes)
{
	uint64_t per_token = 0, layers = 0;

	if (!str_ok(l->model, sizeof(l->model)))
		return -EINVAL;
	if (l->kind != KVB_LAYOUT_MLA && l->kind != KVB_LAYOUT_MHA)
		return -EINVAL;
	if (l->tokens_per_page == 0 || l->tp_size == 0 || l->tp_rank >= l->tp_size)
		return -EINVAL;
	if (l->ncomponents == 0 || l->ncomponents > KVB_MAX_COMPONENTS)
		return -EINVAL;
	if (l->flags || l->resv[0] || l->resv[1] || l->resv[2])
		return -EINVAL;
	for (uint32_t i = 0; i < KVB_MAX_COMPONENTS; i++) {
		const struct kvb_component *c = &l->comp[i];

		if (i >= l->ncomponents) {
			/* Unused slots must be empty so that identity hashing is canonical. */
			static const struct kvb_component zero;

			if (memcmp(c, &zero, sizeof(zero)))
				return -EINVAL;
			continue;
		}
		if (!str_ok(c->name, sizeof(c->name)) || !c->num_layers ||
		    !c->bytes_per_token_layer)
			return -EINVAL;
		for (uint32_t j = 0; j < i; j++)
			if (!strncmp(c->name, l->comp[j].name, sizeof(c->name)))
				return -EINVAL;
		/* Each factor is < 2^32, so the product fits; the sum is bounded below. */
		per_token += (uint64_t)c->num_layers * c->bytes_per_token_layer;
		layers += c->num_layers;
		if (per_token > KVB_MAX_PAGE_BYTES)
			return -E2BIG;
	}
	if (layers > KVB_MAX_VIEW_PARTS)
		return -E2BIG;
	if (per_token * l->tokens_per_page > KVB_MAX_PAGE_BYTES ||
	    l->tokens_per_page > KVB_MAX_PAGE_BYTES)
		return -E2BIG;
	if (page_bytes)
		*page_bytes = per_token * l->tokens_per_page;
	return 0;
}

/* A page format: printable ASCII, NUL-terminated, zero after the NUL; "" allowed. */
static int format_ok(const char *s, size_t max)
{
	size_t n = strnlen(s, max);

	if (n == max)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (s[i] < 0x21 || s[i] > 0x7e)
			return 0;
	while (++n < max)
		if (s[n])
			return 0;
	return 1;
}

static int rank_ok(uint32_t size, uint32_t rank)
{
	return rank < (size ? size : 1);
}

int kvb_ident_check(const struct kvb_layout *l, const struct kvb_ns_ident *id)
{
	if (id->flags)
		return -EINVAL;
	for (size_t i = 0; i < sizeof(id->resv) / sizeof(id->resv[0]); i++)
		if (id->resv[i])
			return -EINVAL;
	for (uint32_t i = 0; i < KVB_MAX_COMPONENTS; i++) {
		if (id->dtype[i] >= KVB_DTYPE__COUNT)
			return -EINVAL;
		/* A type for a component that does not exist would split identities for nothing. */
		if (i >= l->ncomponents && id->dtype[i])
			return -EINVAL;
	}
	if (!format_ok(id->page_format, sizeof(id->page_format)))
		return -EINVAL;
	if (!rank_ok(id->pp_size, id->pp_rank) || !rank_ok(id->cp_size, id->cp_rank) ||
	    !rank_ok(id->dp_size, id->dp_rank))
		return -EINVAL;
	return 0;
}

void kvb_ident_norm(const struct kvb_ns_ident *id, struct kvb_ns_ident *out)
{
	if (id)
		*out = *id;
	else
		memset(out, 0, sizeof(*out));
	out->pp_size += !out->pp_size;
	out->cp_size += !out->cp_size;
	out->dp_size += !out->dp_size;
}

int kvb_ident_is_default(const struct kvb_ns_ident *id)
{
	struct kvb_ns_ident n, d;

	if (!id)
		return 1;
	kvb_ident_norm(id, &n);
	kvb_ident_norm(NULL, &d);
	/* dp is not identity: a replica's pages are the same bytes as any other replica's. */
	n.dp_size = d.dp_size;
	n.dp_rank = d.dp_rank;
	return !memcmp(&n, &d, sizeof(n));
}

int kvb_sqe_check(const struct kvb_sqe *sqe, uint32_t arg_size)
{
	uint64_t keys_end, out_end;

	if (sqe->resv0)
		return -EINVAL;
	if (sqe->flags &
	    ~(KVB_OPF_VIEW | KVB_SQEF_GET | KVB_SQEF_FILL | KVB_OPF_PARENT | KVB_SQEF_HELD))
		return -EINVAL;
	/* [hazard] A lease of the client's own: ACQUIRE or RELEASE, nothing else with it. */
	if ((sqe->flags & KVB_SQEF_HELD) &&
	    ((sqe->opcode != KVB_OP_ACQUIRE && sqe->opcode != KVB_OP_RELEASE) ||
	     sqe->flags != KVB_SQEF_HELD))
		return -EINVAL;
	/* A filled PUT copies from one host buffer of the client (wire.h): no view, no other op. */
	if ((sqe->flags & KVB_SQEF_FILL) &&
	    (sqe->opcode != KVB_OP_PUT || (sqe->flags & KVB_OPF_VIEW)))
		return -EINVAL;
	switch (sqe->opcode) {
	case KVB_OP_ACQUIRE:
	case KVB_OP_RELEASE:
		if ((sqe->flags & ~(KVB_SQEF_GET | KVB_SQEF_HELD)) || sqe->layer_first ||
		    sqe->layer_count)
			return -EINVAL;
		return 0;
	case KVB_OP_NOP:
	case KVB_OP_DELETE:
	case KVB_OP_PREFETCH:
		if (sqe->flags || sqe->layer_first || sqe->layer_count)
			return -EINVAL;
		return 0;
	case KVB_OP_PUT:
		if (sqe->flags & KVB_SQEF_GET)
			return -EINVAL;
		/* ABI 1.4: the parent's key in the arg area (wire.h). */
		if (sqe->flags & KVB_OPF_PARENT)
			return (uint64_t)sqe->parent_off + sizeof(kvb_key) <= arg_size ? 0
										       : -EINVAL;
		if (sqe->layer_first || sqe->layer_count)
			return -EINVAL; /* all or nothing */
		return 0;
	case KVB_OP_GET:
		/* ABI 1.5: KVB_SQEF_GET, a read the client did itself (wire.h): names no buffer. */
		if (sqe->flags & KVB_SQEF_GET)
			return sqe->flags != KVB_SQEF_GET || sqe->buf || sqe->off ||
					       sqe->layer_first || sqe->layer_count
				       ? -EINVAL
				       : 0;
		if ((sqe->flags & KVB_OPF_PARENT) ||
		    (!(sqe->flags & KVB_OPF_VIEW) && (sqe->layer_first || sqe->layer_count)))
			return -EINVAL;
		return 0;
	case KVB_OP_LOOKUP:
		if (sqe->flags || sqe->buf || sqe->off || sqe->layer_first || sqe->layer_count)
			return -EINVAL;
		for (int i = 0; i < 5; i++)
			if (sqe->batch.resv1[i])
				return -EINVAL;
		keys_end = (uint64_t)sqe->batch.arg_off +
			   (uint64_t)sqe->batch.count * sizeof(kvb_key);
		out_end = (uint64_t)sqe->batch.out_off + sqe->batch.count;
		if (keys_end > arg_size || out_end > arg_size)
			return -EINVAL;
		/* Keys must not overlap the tier bytes we write back. */
		if (sqe->batch.count && sqe->batch.out_off < keys_end &&
		    sqe->batch.arg_off < out_end)
			return -EINVAL;
		return 0;
	default:
		return -EINVAL;
	}
}

int kvb_default_socket(char *buf, size_t len)
{
	const char *env = getenv("KVB_SOCKET");
	size_t max = sizeof(((struct sockaddr_un *)0)->sun_path);
	int n;

	/* [socket-rule] No $XDG_RUNTIME_DIR: a service has none, a login shell has one, and the
	 * broker and its clients must not look in two places (kvb_socket_path, kvbroker.h). */
	if (env && *env)
		n = snprintf(buf, len, "%s", env);
	else
		n = snprintf(buf, len, "%s", KVB_SOCKET_DEFAULT);
	if (n < 0 || (size_t)n >= len || (size_t)n >= max)
		return -ENAMETOOLONG;
	return 0;
}

void kvb_msg_attach_fds(struct msghdr *mh, void *cbuf, const int *fds, uint32_t n)
{
	struct cmsghdr *c;

	if (!fds || !n)
		return; /* nothing to attach: mh stays without control data */
	memset(cbuf, 0, CMSG_SPACE(sizeof(int) * n));
	mh->msg_control = cbuf;
	mh->msg_controllen = CMSG_SPACE(sizeof(int) * n);
	c = CMSG_FIRSTHDR(mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int) * n);
	memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
}

int kvb_msg_take_fds(struct msghdr *mh, int *fds, uint32_t max, uint32_t *n)
{
	int err = mh->msg_flags & (MSG_TRUNC | MSG_CTRUNC) ? -EPROTO : 0;

	*n = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
		size_t k;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (*n < max) {
				fds[(*n)++] = fd;
			} else {
				close(fd);
				err = -EPROTO;
			}
		}
	}
	if (err)
		while (*n)
			close(fds[--*n]);
	return err;
}
