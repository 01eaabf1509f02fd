// SPDX-License-Identifier: MIT
/*
 * t_gpu_tenants.c - GPU copies into a pool that lends (--tenants uid: sparse partitions whose
 * memory is taken and given back slab by slab), against the fake CUDA driver of
 * tests/fake/libcuda.c, which tracks pinned host memory and fails any copy that touches host
 * memory outside a registration, any overlapping registration and any unregister of memory
 * never registered (logged "fake-cuda: BUG"). The broker registers each slab as it is made and
 * unregisters it before its memory is given back ([slab-pin], store.c, copy_cuda.c):
 *   - GPU copies are on with --tenants; view PUTs from GPU layers and PUTs of device pointers
 *     are served back byte-exact into zeroed GPU memory; what is registered is exactly the
 *     slabs' memory (copy.gpu.pinned_bytes == pool.resident_bytes);
 *   - slabs given back (a host filler deleted, pages of another size reclaiming its empty
 *     slabs) are unregistered first: the registrations fall, the GPU pages stay exact;
 *   - a kill -9 and a restart adopt the pool and register every adopted slab at start-up: the
 *     reconnected client's GPU GETs are exact, and PUTs into new slabs work;
 *   - a driver that refuses to register: at a restart, the adopted slabs stay unregistered
 *     and GPU copies are off (GPU buffers -ENODEV, host copies served); in a new pool, the
 *     slab is not made, the PUT fails, counted (pool.slab_pin_failed) and logged, and the
 *     broker runs on;
 *   - no broker log holds a fake-cuda BUG line, and a clean stop leaves nothing pinned.
 * Skipped (77) without the CUDA headers at build time.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"
#include "gpu_fake.h"
#include "reliab.h"

#ifdef KVB_HAVE_CUDA

#define TPP 16
#define LAYERS 4
#define BPT 256
#define NTOK 2048 /* token slots per layer: GPU pages at [0, NGPU x TPP), reads at twice that */
#define NGPU 48
#define SEED 4545
#define LAYER_BYTES ((size_t)NTOK * BPT)
#define NFILL 2400 /* host pages of 16 KiB: 37.5 MiB of the 64 MiB pool, deleted again */
#define BIG (48u * 1024)
#define NBIG 900 /* 42 MiB of 48 KiB pages: they need the filler's empty slabs back */

static const struct gf_shape shape = {LAYERS, TPP, BPT, SEED};
static const char *const args[] = {"--pool", "64M", "--slab", "1M", "--tenants", "uid", NULL};

static struct kvb_cuda_api *cu;

/* A broker on sock (NULL: the harness's own socket). */
static struct harness_broker *start(const char *sock)
{
	const char *a[16] = {"--socket", sock};
	int n = 2;

	if (!sock)
		return harness_broker_startv(args);
	for (const char *const *p = args; *p; p++)
		a[n++] = *p;
	a[n] = NULL;
	return harness_broker_startv(a);
}

/* What is registered is exactly the slabs' memory, and the fake saw no misuse. */
static void check_pins(const struct harness_broker *br, kvb_client *c, const char *when)
{
	uint64_t pinned = harness_stat(c, "copy.gpu.pinned_bytes"),
		 resident = harness_stat(c, "pool.resident_bytes");

	harness_log("%s: %llu KiB pinned in %llu chunks (%llu registered, %llu unregistered)", when,
		    (unsigned long long)pinned >> 10,
		    (unsigned long long)harness_stat(c, "copy.gpu.pin_chunks"),
		    (unsigned long long)harness_stat(c, "copy.gpu.slab_pins"),
		    (unsigned long long)harness_stat(c, "copy.gpu.slab_unpins"));
	CHECKF(pinned == resident, "%s: %llu bytes registered, the slabs hold %llu", when,
	       (unsigned long long)pinned, (unsigned long long)resident);
	CHECK_EQ(harness_stat(c, "copy.gpu.pin_chunks"),
		 harness_stat(c, "copy.gpu.slab_pins") - harness_stat(c, "copy.gpu.slab_unpins"));
	CHECK_EQ(harness_stat(c, "copy.gpu.errors"), 0);
	CHECKF(!harness_broker_log_has(br, "fake-cuda: BUG"), "%s: the fake driver saw misuse",
	       when);
}

/* Every GPU page comes back exact into zeroed slots [NGPU, 2 x NGPU) x TPP. */
static void check_gpu_pages(kvb_client *c, uint32_t view, uint8_t *const *layer, const char *what)
{
	for (int l = 0; l < LAYERS; l++)
		memset(layer[l] + (size_t)NGPU * TPP * BPT, 0, (size_t)NGPU * TPP * BPT);
	for (int p = 0; p < NGPU; p++) {
		long long rc;
		uint64_t end = harness_now_ms() + 10000;

		/* After a restart the first calls find the broker away: they reconnect. */
		while ((rc = kvb_view_get(c, view, harness_key(SEED, (uint64_t)p),
					  (uint64_t)(NGPU + p) * TPP, 0, 0)) == -ECONNRESET &&
		       harness_now_ms() < end)
			rel_sleep_ms(5);
		CHECK_RC(rc, (long long)(TPP * LAYERS * BPT));
		gf_check(&shape, layer, p, NGPU + p, what);
	}
}

/* The big pages, PUT from (put) or checked through (!put) one GPU page buffer. */
static void big_pages(kvb_client *c, uint32_t ns, uint8_t *dev, int put)
{
	for (uint32_t i = 0; i < NBIG; i++) {
		kvb_key k = harness_key(SEED + 2, i);

		if (put) {
			harness_fill(dev, BIG, &k, SEED + 2);
			CHECK_RC(kvb_put(c, ns, k, dev, BIG), 0);
		} else {
			memset(dev, 0, BIG);
			CHECK_RC(kvb_get(c, ns, k, dev, BIG), (long long)BIG);
			CHECK_OK(harness_verify(dev, BIG, &k, SEED + 2, "a big page's GPU GET"));
		}
	}
}

int main(int argc, char **argv)
{
	struct harness_broker *br;
	struct kvb_layout lay, big;
	struct kvb_view_part parts[LAYERS];
	uint32_t ns, nsb, bufs[LAYERS], bbuf, view;
	uint8_t *layer[LAYERS], *dev, *host;
	CUdeviceptr seg, bseg;
	char sock[108], why[256];
	size_t pb, pbb;
	kvb_client *c;

	(void)argc;
	gf_reexec(argv);
	harness_init(argc, argv);
	if (kvb_cuda_load(&cu, why, sizeof(why)) || cu->cuInit(0) != CUDA_SUCCESS)
		harness_fail(__FILE__, __LINE__, "the fake CUDA driver did not load: %s", why);
	br = start(NULL);
	snprintf(sock, sizeof(sock), "%s", br->sock);
	CHECK(harness_broker_log_has(br, "GPU copies on: 1 device(s)"));
	CHECK(harness_broker_log_has(br, "pool memory registered slab by slab"));
	CHECK(!harness_broker_log_has(br, "GPU copies off"));
	c = harness_connect(br, "gpu-tenants", 0);
	harness_layout(&lay, "test/gpu-tenants", KVB_LAYOUT_MLA, TPP, 1, 0, LAYERS, BPT);
	CHECK_OK(kvb_ns_open(c, &lay, &ns, &pb));
	CHECK_EQ(pb, TPP * LAYERS * BPT);
	harness_layout(&big, "test/gpu-tenants-big", KVB_LAYOUT_MLA, 64, 1, 0, 1, BIG / 64);
	CHECK_OK(kvb_ns_open(c, &big, &nsb, &pbb));
	CHECK_EQ(pbb, BIG);
	CHECK_EQ(harness_stat(c, "copy.gpu.pin_chunks"), 0); /* nothing pinned before a slab */

	harness_log("view PUTs from GPU layers into the sparse pool");
	CHECK_EQ(cu->cuMemAlloc(&seg, LAYERS * LAYER_BYTES), CUDA_SUCCESS);
	for (int l = 0; l < LAYERS; l++) {
		layer[l] = (uint8_t *)(uintptr_t)(seg + l * LAYER_BYTES);
		CHECK_OK(kvb_buf_register_gpu(c, layer[l], LAYER_BYTES, &bufs[l]));
		parts[l] = (struct kvb_view_part){.buf = bufs[l], .stride = BPT, .base = 0};
	}
	CHECK_OK(kvb_view_create(c, ns, parts, LAYERS, &view));
	for (int p = 0; p < NGPU; p++) {
		gf_fill(&shape, layer, p, p);
		CHECK_RC(kvb_view_put(c, view, harness_key(SEED, (uint64_t)p), (uint64_t)p * TPP),
			 0);
	}
	check_gpu_pages(c, view, layer, "a GPU view GET");
	CHECK(harness_stat(c, "copy.gpu.pin_chunks") >= 1);
	check_pins(br, c, "after the GPU PUTs");

	harness_log("a host filler made and deleted: its slabs stay, empty, registered");
	host = malloc(pb);
	CHECK(host != NULL);
	for (uint32_t i = 0; i < NFILL; i++) {
		kvb_key k = harness_key(SEED + 1, i);

		harness_fill(host, pb, &k, SEED + 1);
		CHECK_RC(kvb_put(c, ns, k, host, pb), 0);
	}
	for (uint32_t i = 0; i < NFILL; i++)
		CHECK_OK(kvb_delete(c, ns, harness_key(SEED + 1, i)));
	free(host);
	check_pins(br, c, "after the filler");
	CHECK_EQ(harness_stat(c, "copy.gpu.slab_unpins"), 0);

	harness_log("pages of another size from a GPU buffer take the empty slabs back");
	CHECK_EQ(cu->cuMemAlloc(&bseg, BIG), CUDA_SUCCESS);
	dev = (uint8_t *)(uintptr_t)bseg;
	CHECK_OK(kvb_buf_register_gpu(c, dev, BIG, &bbuf));
	big_pages(c, nsb, dev, 1);
	CHECKF(harness_stat(c, "copy.gpu.slab_unpins") >= 10,
	       "the filler's slabs went back with %llu unregistered",
	       (unsigned long long)harness_stat(c, "copy.gpu.slab_unpins"));
	CHECK(harness_stat(c, "pool.resident_bytes") <= 64ull << 20);
	check_pins(br, c, "after the reclaim");
	big_pages(c, nsb, dev, 0);
	check_gpu_pages(c, view, layer, "a GPU view GET after the reclaim");

	harness_log("kill -9 and a restart: the adopted slabs are registered at start-up");
	rel_kill(br->pid);
	br->pid = 0;
	br = start(sock);
	CHECK(harness_broker_log_has(br, "adopt: "));
	CHECK(harness_broker_log_has(br, "GPU copies on: 1 device(s)"));
	check_gpu_pages(c, view, layer, "a GPU view GET after the restart");
	CHECK_EQ(harness_stat(c, "copy.gpu.slab_unpins"), 0);
	CHECK(harness_stat(c, "copy.gpu.slab_pins") >= 40); /* 42+ MiB of 1 MiB slabs */
	check_pins(br, c, "after the restart");
	big_pages(c, nsb, dev, 0);
	for (int p = NGPU; p < 2 * NGPU; p++) { /* new pages, into new slabs too */
		gf_fill(&shape, layer, p, p - NGPU);
		CHECK_RC(kvb_view_put(c, view, harness_key(SEED, (uint64_t)p),
				      (uint64_t)(p - NGPU) * TPP),
			 0);
	}
	check_pins(br, c, "after PUTs into the adopted pool");

	harness_log("a restart whose driver will not register the adopted slabs: GPU copies off");
	rel_kill(br->pid);
	br->pid = 0;
	setenv("KVB_FAKE_CUDA_PIN_FAIL", "1", 1);
	br = start(sock);
	unsetenv("KVB_FAKE_CUDA_PIN_FAIL");
	CHECK(harness_broker_log_has(br, "adopt: "));
	CHECK(harness_broker_log_has(br, "GPU copies off: the GPU driver would not register the "
					 "slabs adopted"));
	{
		kvb_client *c2 = harness_connect(br, "gpu-tenants-off", 0);
		kvb_key k = harness_key(SEED + 2, 0);
		uint32_t b2;
		uint8_t *page = malloc(BIG);

		CHECK(page != NULL);
		CHECK_OK(kvb_ns_open(c2, &big, &nsb, &pbb));
		CHECK_RC(kvb_buf_register_gpu(c2, dev, BIG, &b2), -ENODEV);
		CHECK_RC(kvb_get(c2, nsb, k, page, BIG), (long long)BIG); /* host copies still */
		CHECK_OK(harness_verify(page, BIG, &k, SEED + 2, "a host GET, GPU copies off"));
		CHECK(harness_stat(c2, "pool.slab_pin_failed") >= 1);
		free(page);
		kvb_close(c2);
	}

	harness_log("one more restart with a willing driver, then a clean stop unpins all");
	rel_kill(br->pid);
	br->pid = 0;
	br = start(sock);
	check_gpu_pages(c, view, layer, "a GPU view GET after the third restart");
	check_pins(br, c, "after the third restart");
	kvb_close(c);
	harness_broker_stop(br);
	CHECK(!harness_broker_log_has(br, "fake-cuda: BUG"));
	CHECK(harness_broker_log_has(br, "fake-cuda: cuMemFreeHost 1048576 bytes (0 pinned)"));

	harness_log("a driver that will not register: the slab is not made, the broker runs on");
	setenv("KVB_FAKE_CUDA_PIN_FAIL", "1", 1);
	br = harness_broker_startv(args);
	unsetenv("KVB_FAKE_CUDA_PIN_FAIL");
	CHECK(harness_broker_log_has(br, "GPU copies on: 1 device(s)"));
	c = harness_connect(br, "gpu-tenants-nopin", 0);
	CHECK_OK(kvb_ns_open(c, &big, &nsb, &pbb));
	{
		kvb_key k = harness_key(SEED + 3, 0);
		uint8_t *page = malloc(BIG);
		int rc;

		CHECK(page != NULL);
		harness_fill(page, BIG, &k, SEED + 3);
		rc = kvb_put(c, nsb, k, page, BIG);
		CHECKF(rc < 0, "a PUT with no slab to go to: %d", rc);
		harness_log("the PUT: %d (%s)", rc, harness_strerror(rc));
		CHECK(harness_stat(c, "pool.slab_pin_failed") >= 1);
		CHECK_EQ(harness_stat(c, "pool.resident_bytes"), 0);
		free(page);
	}
	CHECK(harness_broker_log_has(br, "the GPU driver would not register a slab"));
	kvb_close(c);
	harness_broker_stop(br);
	return H_PASS;
}

#else

int main(int argc, char **argv)
{
	harness_init(argc, argv);
	harness_skip("built without the CUDA headers: no GPU paths to test");
}

#endif
