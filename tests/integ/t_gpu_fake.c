// SPDX-License-Identifier: MIT
/*
 * t_gpu_fake.c - the GPU buffer paths end to end, across processes, against the fake CUDA
 * driver of tests/fake/libcuda.c (its "device memory" is shared host memory, so the broker's
 * copies land where the test can read them). Everything but the DMA is the real code: the
 * library's export (legacy IPC handle, cuMem POSIX fd), BUF_REG_GPU, the broker's handle cache,
 * range checks, views over GPU buffers, both copy paths, completion and closing.
 *
 *   - one cuMemAlloc allocation holding four layer buffers (a caching allocator's segment):
 *     registered as four buffers, opened once by the broker; view PUTs from it;
 *   - kvb_put()/kvb_get() of device pointers inside a registered GPU buffer;
 *   - a second process with cuMemCreate memory (exported as a POSIX fd) loads the pages into
 *     other slots, layer groups in order; when it exits its allocation is closed;
 *   - registration errors: past the allocation (-EFAULT), not device memory (-EINVAL);
 *   - unregistering every buffer of an allocation closes its handle;
 *   - a broker forced onto the kernel path (--gpu-path kernel) moves pages with it;
 *   - --max-bufs holds for GPU buffers as for host ones (regression: GPU registrations
 *     scanned the session's slots themselves, up to the compiled-in maximum);
 *   - GPU copies, which always complete later, are credited to their client (regression: the
 *     per-client counters missed every deferred op).
 *
 * The test re-executes itself with LD_LIBRARY_PATH naming the fake (the dynamic loader reads
 * it at start-up only); the brokers it starts inherit it. Skipped (77) without the CUDA
 * headers at build time.
 */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"
#include "gpu_fake.h"
#include "harness.h"

#ifdef KVB_HAVE_CUDA

#define TPP 16
#define LAYERS 4
#define BPT 256
#define NSLOTS 256 /* pages use slots [0, 128); a plain page goes at byte 32K of layer 1 */
#define NPAGES 8
#define SEED 9090
#define LAYER_BYTES ((size_t)NSLOTS * BPT)

static const struct gf_shape shape = {LAYERS, TPP, BPT, SEED};

static struct harness_broker *br;
static struct kvb_cuda_api *cu;
static size_t pb;

static kvb_client *attach(const char *name, uint32_t *ns)
{
	kvb_client *c = harness_connect(br, name, 0);
	struct kvb_layout l;

	harness_layout(&l, "test/gpu-fake", KVB_LAYOUT_MLA, TPP, 1, 0, LAYERS, BPT);
	CHECK_OK(kvb_ns_open(c, &l, ns, &pb));
	CHECK_EQ(pb, TPP * LAYERS * BPT);
	return c;
}

/* Registers the four layer buffers at layer[] and a view over them. */
static uint32_t gpu_view(kvb_client *c, uint32_t ns, uint8_t *const layer[LAYERS], uint32_t *bufs)
{
	struct kvb_view_part parts[LAYERS];
	uint32_t view;

	for (int l = 0; l < LAYERS; l++) {
		CHECK_OK(kvb_buf_register_gpu(c, layer[l], LAYER_BYTES, &bufs[l]));
		parts[l] = (struct kvb_view_part){.buf = bufs[l], .stride = BPT, .base = 0};
	}
	CHECK_OK(kvb_view_create(c, ns, parts, LAYERS, &view));
	return view;
}

/* The loading process: cuMemCreate memory, exported as a POSIX fd. */
static int vmm_loader(int idx, void *arg)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
	CUmemAccessDesc acc = {.location = prop.location,
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemGenericAllocationHandle h;
	uint8_t *layer[LAYERS];
	CUdeviceptr base;
	size_t gran, size;
	uint32_t ns, bufs[LAYERS], view;
	kvb_client *c;

	(void)idx, (void)arg;
	c = attach("vmm-loader", &ns);
	CHECK_EQ(cu->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
		 CUDA_SUCCESS);
	size = (LAYERS * LAYER_BYTES + gran - 1) / gran * gran;
	CHECK_EQ(cu->cuMemCreate(&h, size, &prop, 0), CUDA_SUCCESS);
	CHECK_EQ(cu->cuMemAddressReserve(&base, size, 0, 0, 0), CUDA_SUCCESS);
	CHECK_EQ(cu->cuMemMap(base, size, 0, h, 0), CUDA_SUCCESS);
	CHECK_EQ(cu->cuMemSetAccess(base, size, &acc, 1), CUDA_SUCCESS);
	for (int l = 0; l < LAYERS; l++)
		layer[l] = (uint8_t *)(uintptr_t)(base + l * LAYER_BYTES);
	memset(layer[0], 0, LAYERS * LAYER_BYTES);
	view = gpu_view(c, ns, layer, bufs);
	for (int p = 0; p < NPAGES; p++) {
		kvb_key k = harness_key(SEED, (uint64_t)p);
		int slot = NPAGES - 1 - p;

		CHECK_RC(kvb_view_get(c, view, k, (uint64_t)slot * TPP, 0, 2), (long long)pb);
		CHECK_RC(kvb_view_get(c, view, k, (uint64_t)slot * TPP, 2, 2), (long long)pb);
		gf_check(&shape, layer, p, slot, "loaded into cuMem memory");
	}
	kvb_close(c); /* the broker closes the allocation */
	return 0;
}

/* Stores NPAGES from one cuMemAlloc allocation and checks them; returns the client. */
static kvb_client *store_pages(uint32_t *ns, uint8_t *layer[LAYERS], uint32_t *bufs, uint32_t *view)
{
	kvb_client *c = attach("gpu-storer", ns);
	CUdeviceptr seg;

	CHECK_EQ(cu->cuMemAlloc(&seg, LAYERS * LAYER_BYTES + 4096), CUDA_SUCCESS);
	/* Four layers inside one allocation, at an offset: pointers of a caching allocator. */
	for (int l = 0; l < LAYERS; l++)
		layer[l] = (uint8_t *)(uintptr_t)(seg + 4096 + l * LAYER_BYTES);
	*view = gpu_view(c, *ns, layer, bufs);
	CHECK_EQ(harness_stat(c, "copy.gpu.open_handles"), 1);
	for (int p = 0; p < NPAGES; p++) {
		gf_fill(&shape, layer, p, p);
		CHECK_RC(kvb_view_put(c, *view, harness_key(SEED, (uint64_t)p), (uint64_t)p * TPP),
			 0);
	}
	return c;
}

int main(int argc, char **argv)
{
	uint8_t *layer[LAYERS], *page, *dev_page;
	uint32_t ns, bufs[LAYERS], view, b2;
	char why[256];
	kvb_client *c;
	kvb_key k0 = harness_key(SEED, 0);

	gf_reexec(argv);
	harness_init(argc, argv);
	if (kvb_cuda_load(&cu, why, sizeof(why)) || cu->cuInit(0) != CUDA_SUCCESS)
		harness_fail(__FILE__, __LINE__, "the fake CUDA driver did not load: %s", why);
	br = harness_broker_start("--pool", "32M");
	CHECK(harness_broker_log_has(br, "GPU copies on: 1 device(s)"));

	harness_log("view PUTs from four layer buffers inside one cuMemAlloc allocation");
	c = store_pages(&ns, layer, bufs, &view);
	page = malloc(pb);
	CHECK(page != NULL);
	CHECK_RC(kvb_get(c, ns, k0, page, pb), (long long)pb);
	for (int l = 0; l < LAYERS; l++)
		for (int t = 0; t < TPP; t++)
			CHECK_EQ(page[((size_t)l * TPP + t) * BPT + 7],
				 gf_byte(&shape, 0, l, t, 7));
	CHECK(harness_broker_log_has(br, "fake-cuda: ipc open"));
	/* GPU copies always complete later: still counted for their client (regression). */
	CHECK_EQ(harness_stat(c, "client_list[name=gpu-storer].puts"), NPAGES);
	CHECK_EQ(harness_stat(c, "client_list[name=gpu-storer].bytes_in"), NPAGES * pb);

	harness_log("kvb_put/kvb_get of device pointers inside a registered GPU buffer");
	{
		kvb_key k = harness_key(SEED, 100);

		dev_page = layer[1] + 2 * pb; /* inside layer 1's buffer, past the pages' slots */
		harness_fill(dev_page, pb, &k, SEED);
		CHECK_RC(kvb_put(c, ns, k, dev_page, pb), 0);
		memset(dev_page, 0, pb);
		CHECK_RC(kvb_get(c, ns, k, dev_page, pb), (long long)pb);
		CHECK(harness_verify(dev_page, pb, &k, SEED, "device pointer GET") == 0);
		CHECK_GE(harness_stat(c, "copy.gpu.jobs_copy") +
				 harness_stat(c, "copy.gpu.jobs_kernel"),
			 NPAGES + 2);
	}

	harness_log("another process loads them into cuMem memory, layer groups in order");
	CHECK_EQ(harness_run_children(1, vmm_loader, NULL, 30000), 0);
	CHECK(harness_broker_log_has(br, "fake-cuda: vmm import"));
	CHECK_EQ(harness_stat_wait(c, "copy.gpu.open_handles", 1, 5000), 1);
	CHECK(harness_broker_log_has(br, "fake-cuda: vmm unmap"));

	harness_log("registration errors");
	CHECK_RC(kvb_buf_register_gpu(c, layer[3], LAYER_BYTES + 1, &b2), -EFAULT);
	CHECK_RC(kvb_buf_register_gpu(c, page, pb, &b2), -EINVAL);
	{
		/* A view mixing host and GPU buffers: refused at the op. */
		struct kvb_view_part parts[LAYERS];
		uint32_t hb, mixed;
		uint8_t *h = kvb_buf_alloc_host(c, LAYER_BYTES, &hb);

		CHECK(h != NULL);
		for (int l = 0; l < LAYERS; l++)
			parts[l] = (struct kvb_view_part){.buf = l ? bufs[l] : hb, .stride = BPT};
		CHECK_OK(kvb_view_create(c, ns, parts, LAYERS, &mixed));
		CHECK_RC(kvb_view_get(c, mixed, k0, 0, 0, 0), -EINVAL);
	}

	harness_log("unregistering every buffer of the allocation closes it");
	CHECK_OK(kvb_view_destroy(c, view));
	for (int l = 0; l < LAYERS; l++) {
		CHECK_EQ(harness_stat(c, "copy.gpu.open_handles"), 1);
		CHECK_OK(kvb_buf_unregister(c, bufs[l]));
	}
	CHECK_EQ(harness_stat(c, "copy.gpu.open_handles"), 0);
	CHECK(harness_broker_log_has(br, "fake-cuda: ipc close"));
	CHECK_EQ(harness_stat(c, "copy.gpu.errors"), 0);
	kvb_close(c);
	harness_broker_stop(br);

	harness_log("the kernel path");
	br = harness_broker_start("--pool", "32M", "--gpu-path", "kernel");
	c = store_pages(&ns, layer, bufs, &view);
	for (int l = 0; l < LAYERS; l++)
		memset(layer[l], 0, LAYER_BYTES);
	for (int p = 0; p < NPAGES; p++) {
		CHECK_RC(kvb_view_get(c, view, harness_key(SEED, (uint64_t)p), (uint64_t)p * TPP, 0,
				      0),
			 (long long)pb);
		gf_check(&shape, layer, p, p, "kernel path");
	}
	CHECK_EQ(harness_stat(c, "copy.gpu.jobs_kernel"), 2 * NPAGES);
	CHECK(harness_broker_log_has(br, "fake-cuda: kernel over 4 segments"));
	kvb_close(c);
	harness_broker_stop(br);

	harness_log("--max-bufs counts GPU buffers");
	br = harness_broker_start("--pool", "32M", "--max-bufs", "2");
	c = attach("max-bufs", &ns);
	{
		CUdeviceptr seg;
		uint32_t ids[3], hb;

		CHECK_EQ(cu->cuMemAlloc(&seg, 3 * LAYER_BYTES), CUDA_SUCCESS);
		for (int i = 0; i < 2; i++)
			CHECK_OK(kvb_buf_register_gpu(
				c, (uint8_t *)(uintptr_t)seg + (size_t)i * LAYER_BYTES, LAYER_BYTES,
				&ids[i]));
		CHECK_RC(kvb_buf_register_gpu(c, (uint8_t *)(uintptr_t)seg + 2 * LAYER_BYTES,
					      LAYER_BYTES, &ids[2]),
			 -EMFILE);
		CHECK(kvb_buf_alloc_host(c, 4096, &hb) == NULL);
		CHECK_OK(kvb_buf_unregister(c, ids[0]));
		CHECK_OK(kvb_buf_register_gpu(c, (uint8_t *)(uintptr_t)seg + 2 * LAYER_BYTES,
					      LAYER_BYTES, &ids[2]));
	}
	kvb_close(c);
	harness_broker_stop(br);
	free(page);
	return H_PASS;
}

#else

int main(int argc, char **argv)
{
	harness_init(argc, argv);
	harness_skip("built without the CUDA headers: no GPU paths to test");
}

#endif
