// SPDX-License-Identifier: MIT
/*
 * capi_shim.c - TEMPORARY weak stand-ins for the ABI 1.2 calls while branch capi implements
 * them; the real (strong) definitions in client/ win at link time. Deleted once merged.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvbroker.h"

#define WEAK __attribute__((weak))

WEAK kvb_key kvb_key_chain_eagle(const kvb_key *parent, const uint32_t *tokens, size_t npos)
{
	uint32_t *pairs = malloc(2 * npos * sizeof(uint32_t) + 1);
	kvb_key k;

	for (size_t i = 0; pairs && i < npos; i++) {
		pairs[2 * i] = tokens[i];
		pairs[2 * i + 1] = tokens[i + 1];
	}
	k = kvb_key_chain(parent, pairs, 2 * npos);
	free(pairs);
	return k;
}

WEAK int kvb_ns_open2(kvb_client *c, const struct kvb_layout *l, const struct kvb_ns_ident *id,
		      uint32_t *ns, size_t *page_bytes)
{
	static const struct kvb_ns_ident zero;

	if (id && memcmp(id, &zero, sizeof(zero)))
		return -EOPNOTSUPP;
	return kvb_ns_open(c, l, ns, page_bytes);
}

WEAK int kvb_buf_register_host_fd(kvb_client *c, int fd, uint64_t offset, size_t len, void *addr,
				  uint32_t flags, uint32_t *buf)
{
	(void)c, (void)fd, (void)offset, (void)len, (void)addr, (void)flags, (void)buf;
	return -EOPNOTSUPP;
}

WEAK int kvb_view_create2(kvb_client *c, uint32_t ns, const struct kvb_view_part2 *parts,
			  size_t nparts, uint32_t flags, uint32_t *view)
{
	struct kvb_view_part *p = calloc(nparts + 1, sizeof(*p));
	int err;

	if (!p)
		return -ENOMEM;
	for (size_t i = 0; i < nparts; i++) {
		if (parts[i].page_stride) {
			free(p);
			return -EOPNOTSUPP;
		}
		p[i] = (struct kvb_view_part){parts[i].buf, parts[i].stride, parts[i].base};
	}
	err = flags ? -EINVAL : kvb_view_create(c, ns, p, nparts, view);
	free(p);
	return err;
}

WEAK int kvb_completion_fd(kvb_client *c)
{
	(void)c;
	return -EOPNOTSUPP;
}
