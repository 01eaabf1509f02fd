// SPDX-License-Identifier: MIT
/*
 * t_crc_src.c - a PUT's slot checksum (the page header a restarted broker checks, pagehdr.c)
 * folded into the copy ([crc-fused], crccopy.c, where the CPU has VPCLMULQDQ) or taken from
 * the copy's source (xfer.c [crc-src]) matches the slot: every page committed before a
 * SIGKILL is adopted by the next broker and served byte-exact, none is dropped as torn. Both
 * paths that take it are covered: a PUT from a registered buffer (an inline copy) and one
 * from plain memory (a filled PUT, checksummed chunk by chunk), each at 64 KiB (a slot the
 * page fills, copied with streaming stores: fastcopy.h [nt-fresh]), at 96,000 bytes (a 96 KiB
 * slot whose last 2,304 bytes are the slot's own) and at 70,016 bytes (the fused loop's last
 * 128 bytes copied and checksummed apart, then the 72 KiB slot's own 3,712), and a page of
 * 4,500,032 bytes over --copy-inline (a worker's copy split in parts, each folding its own
 * crc, copy_host.c [crc-worker]); a client rewriting its registered buffer right after each
 * PUT changes nothing that was stored.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reliab.h"

#define NPAGES 12
/* Over --copy-inline (4 MiB): a worker's copy, split in parts that each fold their crc
 * (copy_host.c [crc-worker]); its 4 KiB-rounded slot has 1,472 bytes of its own. */
#define BIG 4500032u

static const uint32_t page_bytes[] = {64u * 1024, 96000, 70016, BIG};

/* Pages of each size and source: fewer of the big one (one per 8 MiB slab). */
static int npages(uint32_t pb)
{
	return pb == BIG ? 3 : NPAGES;
}

static void layout_of(struct kvb_layout *l, uint32_t pb)
{
	harness_layout(l,
		       pb == 96000   ? "crc-odd"
		       : pb == 70016 ? "crc-tail"
		       : pb == BIG   ? "crc-big"
				     : "crc-64k",
		       KVB_LAYOUT_MLA, 64, 1, 0, 1, pb / 64);
}

static kvb_key key_of(uint32_t pb, int plain, int i)
{
	return harness_key(pb + (uint64_t)plain * 1000, (uint64_t)i);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	char sock[108];
	kvb_client *c;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "160M", "--slab", "8M");
	snprintf(sock, sizeof(sock), "%s", b->sock);
	c = harness_connect(b, "writer", 0);
	for (size_t p = 0; p < sizeof(page_bytes) / sizeof(page_bytes[0]); p++) {
		uint32_t pb = page_bytes[p], ns, bid;
		uint8_t *plain = malloc(pb), *reg;
		struct kvb_layout l;

		CHECK(plain != NULL);
		layout_of(&l, pb);
		CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
		reg = kvb_buf_alloc_host(c, (size_t)pb * 2, &bid);
		CHECK(reg != NULL);
		for (int i = 0; i < npages(pb); i++) {
			kvb_key kr = key_of(pb, 0, i), kp = key_of(pb, 1, i);
			uint8_t *src = reg + (size_t)(i % 2) * pb; /* new and reused sources */

			harness_fill(src, pb, &kr, 5);
			CHECK_RC(kvb_put(c, ns, kr, src, pb), 0);
			memset(src, 0xee, pb); /* stored already: must not show */
			harness_fill(plain, pb, &kp, 5);
			CHECK_RC(kvb_put(c, ns, kp, plain, pb), 0);
		}
		free(plain);
	}
	/* Committed, every one: no clean stop, the next broker adopts what the keeper holds. */
	rel_kill(b->pid);
	b->pid = 0;
	kvb_close(c); /* attached through the kill */
	b = harness_broker_start("--socket", sock, "--pool", "160M", "--slab", "8M");
	c = harness_connect(b, "reader", 0);
	for (size_t p = 0; p < sizeof(page_bytes) / sizeof(page_bytes[0]); p++) {
		uint32_t pb = page_bytes[p], ns;
		uint8_t *page = malloc(pb);
		struct kvb_layout l;
		int found = 0;

		CHECK(page != NULL);
		layout_of(&l, pb);
		CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
		for (int plain = 0; plain < 2; plain++)
			for (int i = 0; i < npages(pb); i++) {
				kvb_key k = key_of(pb, plain, i);
				int rc = kvb_get(c, ns, k, page, pb);

				CHECKF(rc == (int)pb,
				       "%u-byte page %d (%s): get %d after the restart", pb, i,
				       plain ? "plain" : "registered", rc);
				CHECK_OK(harness_verify(page, pb, &k, 5, "adopted page"));
				found++;
			}
		CHECK_EQ(found, 2 * npages(pb));
		free(page);
	}
	kvb_close(c);
	harness_log("every page committed before the kill adopted byte-exact (%d pages)",
		    2 * (3 * NPAGES + npages(BIG)));
	return H_PASS;
}
