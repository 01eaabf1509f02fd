// SPDX-License-Identifier: MIT
/*
 * t_gpu_reconnect.c - GPU buffers are registered again when a client reconnects to a restarted
 * broker (client/cuda.c kvbc_gpu_again, conn.c [RECONNECT]), against the fake CUDA
 * driver of tests/fake/libcuda.c (its device memory is shared host memory; t_gpu_fake is the
 * model).
 *
 * A client registers four layer buffers inside one cuMemAlloc allocation (and a view over them),
 * a cuMemCreate buffer (exported as a POSIX fd) and a second cuMemAlloc buffer; it PUTs pages
 * from the view. The broker is SIGKILLed (its keeper holds the pool) and a call in the gap fails
 * fast with -ECONNRESET; the caller frees the second allocation meanwhile. A broker started on
 * the same socket adopts the pool; the client's next calls reconnect, and with the same ids:
 *   - view GETs into the GPU layers bring every page back byte-exact, and view PUTs work;
 *   - kvb_get/kvb_put of device pointers inside a registered buffer work;
 *   - the cuMem buffer, exported anew as a fresh fd, is loaded into;
 *   - the freed allocation's buffer alone is lost: -EBADF, and so is a view over it (which
 *     no longer keeps the client from reconnecting at all), the rest unaffected;
 *   - the new broker opened two allocations (not three), with no copy errors.
 * Skipped (77) without the CUDA headers at build time.
 */
#include <errno.h>
#include <libgen.h>
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
#define NTOK 512 /* token slots per layer: pages at [0, 17 x TPP), a plain page at 80 KiB */
#define NPAGES 8
#define SEED 7171
#define LAYER_BYTES ((size_t)NTOK * BPT)

static const struct gf_shape shape = {LAYERS, TPP, BPT, SEED};

static struct kvb_cuda_api *cu;
static size_t pb;

/* cuMemCreate memory of size bytes (rounded up to the granularity), mapped read-write. */
static uint8_t *vmm_alloc(size_t size)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
	CUmemAccessDesc acc = {.location = prop.location,
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemGenericAllocationHandle h;
	CUdeviceptr base;
	size_t gran;

	CHECK_EQ(cu->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
		 CUDA_SUCCESS);
	size = (size + gran - 1) / gran * gran;
	CHECK_EQ(cu->cuMemCreate(&h, size, &prop, 0), CUDA_SUCCESS);
	CHECK_EQ(cu->cuMemAddressReserve(&base, size, 0, 0, 0), CUDA_SUCCESS);
	CHECK_EQ(cu->cuMemMap(base, size, 0, h, 0), CUDA_SUCCESS);
	CHECK_EQ(cu->cuMemSetAccess(base, size, &acc, 1), CUDA_SUCCESS);
	return (uint8_t *)(uintptr_t)base;
}

/* Repeats a call while it fails -ECONNRESET (the broker is away), up to 10 s. */
#define UNTIL_BACK(rc, call)                                                                       \
	do {                                                                                       \
		uint64_t end_ = harness_now_ms() + 10000;                                          \
		while (((rc) = (call)) == -ECONNRESET && harness_now_ms() < end_)                  \
			rel_sleep_ms(5);                                                           \
	} while (0)

int main(int argc, char **argv)
{
	uint8_t *layer[LAYERS], *vmm, *doomed;
	uint32_t ns, bufs[LAYERS], view, vbuf, dbuf, dview;
	struct kvb_view_part parts[LAYERS];
	struct harness_broker *br;
	struct kvb_layout lay;
	CUdeviceptr seg, dseg;
	size_t hits = 0;
	kvb_key k0 = harness_key(SEED, 0);
	char sock[108], why[256];
	kvb_client *c;
	long long rc;

	(void)argc;
	gf_reexec(argv);
	harness_init(argc, argv);
	if (kvb_cuda_load(&cu, why, sizeof(why)) || cu->cuInit(0) != CUDA_SUCCESS)
		harness_fail(__FILE__, __LINE__, "the fake CUDA driver did not load: %s", why);
	br = harness_broker_start("--pool", "32M");
	snprintf(sock, sizeof(sock), "%s", br->sock);
	CHECK(harness_broker_log_has(br, "GPU copies on: 1 device(s)"));
	c = harness_connect(br, "gpu-reconnect", 0);
	harness_layout(&lay, "test/gpu-reconnect", KVB_LAYOUT_MLA, TPP, 1, 0, LAYERS, BPT);
	CHECK_OK(kvb_ns_open(c, &lay, &ns, &pb));
	CHECK_EQ(pb, TPP * LAYERS * BPT);

	/* Four layers inside one cuMemAlloc allocation, at an offset; a view over them. */
	CHECK_EQ(cu->cuMemAlloc(&seg, LAYERS * LAYER_BYTES + 4096), CUDA_SUCCESS);
	for (int l = 0; l < LAYERS; l++) {
		layer[l] = (uint8_t *)(uintptr_t)(seg + 4096 + l * LAYER_BYTES);
		CHECK_OK(kvb_buf_register_gpu(c, layer[l], LAYER_BYTES, &bufs[l]));
		parts[l] = (struct kvb_view_part){.buf = bufs[l], .stride = BPT, .base = 0};
	}
	CHECK_OK(kvb_view_create(c, ns, parts, LAYERS, &view));
	vmm = vmm_alloc(pb);
	CHECK_OK(kvb_buf_register_gpu(c, vmm, pb, &vbuf));
	CHECK_EQ(cu->cuMemAlloc(&dseg, pb), CUDA_SUCCESS);
	doomed = (uint8_t *)(uintptr_t)dseg;
	CHECK_OK(kvb_buf_register_gpu(c, doomed, pb, &dbuf));
	for (int l = 0; l < LAYERS; l++) /* a view over it alone: lost with it */
		parts[l] = (struct kvb_view_part){
			.buf = dbuf, .stride = BPT, .base = (uint64_t)l * TPP * BPT};
	CHECK_OK(kvb_view_create(c, ns, parts, LAYERS, &dview));
	{
		kvb_key k = harness_key(SEED, 60); /* the staging buffer exists before the kill */
		uint8_t *host = calloc(1, pb);

		CHECK(host != NULL);
		CHECK_RC(kvb_put(c, ns, k, host, pb), 0);
		free(host);
	}
	for (int p = 0; p < NPAGES; p++) {
		gf_fill(&shape, layer, p, p);
		CHECK_RC(kvb_view_put(c, view, harness_key(SEED, (uint64_t)p), (uint64_t)p * TPP),
			 0);
	}
	CHECK_EQ(harness_stat(c, "copy.gpu.open_handles"), 3);

	harness_log("kill -9 of the broker; a call in the gap fails fast");
	rel_kill(br->pid);
	br->pid = 0;
	CHECK_RC(kvb_lookup(c, ns, &k0, 1, &hits), -ECONNRESET);
	CHECK_RC(kvb_lookup(c, ns, &k0, 1, &hits), -ECONNRESET); /* no broker: at once */
	CHECK_EQ(cu->cuMemFree(dseg), CUDA_SUCCESS);		 /* the caller frees one */

	br = harness_broker_start("--socket", sock, "--pool", "32M");
	CHECK(harness_broker_log_has(br, "adopt: "));
	for (int l = 0; l < LAYERS; l++)
		memset(layer[l], 0, LAYER_BYTES);
	UNTIL_BACK(rc, kvb_view_get(c, view, k0, (uint64_t)NPAGES * TPP, 0, 0));
	CHECK_RC(rc, (long long)pb);
	gf_check(&shape, layer, 0, NPAGES, "view GET after the reconnect");
	for (int p = 1; p < NPAGES; p++) {
		CHECK_RC(kvb_view_get(c, view, harness_key(SEED, (uint64_t)p),
				      (uint64_t)(NPAGES + p) * TPP, 0, 0),
			 (long long)pb);
		gf_check(&shape, layer, p, NPAGES + p, "view GET after the reconnect");
	}

	harness_log("view PUT and device-pointer PUT/GET through the re-registered buffers");
	{
		kvb_key k = harness_key(SEED, 50), kd = harness_key(SEED, 51);
		uint8_t *dev_page = layer[2] + 80 * 1024; /* inside layer 2's buffer */

		gf_fill(&shape, layer, 50, 2 * NPAGES);
		CHECK_RC(kvb_view_put(c, view, k, (uint64_t)2 * NPAGES * TPP), 0);
		for (int l = 0; l < LAYERS; l++)
			memset(layer[l] + (size_t)2 * NPAGES * TPP * BPT, 0, TPP * BPT);
		CHECK_RC(kvb_view_get(c, view, k, (uint64_t)2 * NPAGES * TPP, 0, 0), (long long)pb);
		gf_check(&shape, layer, 50, 2 * NPAGES, "view PUT after the reconnect");
		CHECK((size_t)(dev_page + pb - layer[2]) <= LAYER_BYTES);
		harness_fill(dev_page, pb, &kd, SEED);
		CHECK_RC(kvb_put(c, ns, kd, dev_page, pb), 0);
		memset(dev_page, 0, pb);
		CHECK_RC(kvb_get(c, ns, kd, dev_page, pb), (long long)pb);
		CHECK_OK(harness_verify(dev_page, pb, &kd, SEED, "device pointer GET"));
	}

	harness_log("a PUT from unregistered memory (the staging buffer, registered again)");
	{
		kvb_key k = harness_key(SEED, 52);
		uint8_t *host = malloc(pb);

		CHECK(host != NULL);
		harness_fill(host, pb, &k, SEED);
		CHECK_RC(kvb_put(c, ns, k, host, pb), 0);
		memset(host, 0, pb);
		CHECK_RC(kvb_get(c, ns, k, host, pb), (long long)pb);
		CHECK_OK(harness_verify(host, pb, &k, SEED, "staged PUT"));
		free(host);
	}

	harness_log("the cuMem buffer, exported anew as an fd");
	memset(vmm, 0, pb);
	CHECK_RC(kvb_get(c, ns, k0, vmm, pb), (long long)pb);
	for (int l = 0; l < LAYERS; l++)
		for (int t = 0; t < TPP; t++)
			CHECK_EQ(vmm[((size_t)l * TPP + t) * BPT + 5], gf_byte(&shape, 0, l, t, 5));
	CHECK(harness_broker_log_has(br, "fake-cuda: vmm import"));

	harness_log("the freed allocation's buffer alone is lost");
	CHECK_RC(kvb_get(c, ns, k0, doomed, pb), -EBADF);
	CHECK_RC(kvb_view_get(c, dview, k0, 0, 0, 0), -EBADF);
	CHECK_RC(kvb_get(c, ns, k0, vmm, pb), (long long)pb); /* the rest unaffected */
	CHECK_EQ(harness_stat(c, "copy.gpu.open_handles"), 2);
	CHECK_EQ(harness_stat(c, "copy.gpu.errors"), 0);
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
