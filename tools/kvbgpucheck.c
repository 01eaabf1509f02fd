// SPDX-License-Identifier: MIT
/*
 * kvbgpucheck.c - the client side of the GPU check (tools/gpu-check.sh): real GPU buffers,
 * real CUDA IPC, a real broker. Loads libcuda.so.1 at run time like everything else here.
 *
 *   kvbgpucheck probe                      devices, or why there are none (exit 2)
 *   kvbgpucheck put   --socket S [--pages N] [--alloc legacy|vmm]
 *   kvbgpucheck get   --socket S [--pages N] [--alloc legacy|vmm]
 *   kvbgpucheck bench --socket S [--pages N] [--rounds R] [--label L]
 *
 * The KV cache is laid out as an engine serving Kimi-K2.5 keeps it: 61 per-layer buffers of
 * [token slot][576 bf16 = 1152 bytes], 64 tokens per page, so a page is 61 parts of 72 KiB.
 * --alloc legacy: one cuMemAlloc per layer (61 IPC handles); --alloc vmm: one cuMemCreate
 * allocation (POSIX fd handle type) holding all 61 layers, registered as 61 buffers inside it
 * (one fd, opened once by the broker).
 *
 * put: fills pages [0, N) on the device (kernel kvb_fill) and stores them with view PUTs.
 * get: loads them with view GETs into other slots (page p into slot N-1-p), first layers
 *      [0, 30) then [30, 61) (layer groups in order), and counts wrong bytes on the device
 *      (kernel kvb_check). Exit 0 only when every byte matches.
 * bench: broker DMA throughput: N fresh pages PUT per round (D2H), the stored N pages GET per
 *      round (H2D), R rounds each, pipelined through kvb_submit/kvb_reap; then the baseline,
 *      cuMemcpyAsync of the same bytes as one contiguous block between pinned host memory and
 *      the device, in this process. Prints one "RESULT ..." line.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"
#include "cli.h"
#include "clock.h"
#include "kvbroker.h"

#ifdef KVB_HAVE_CUDA

#define LAYERS 61
#define BPT 1152
#define TPP 64
#define SPLIT 30 /* get: layers [0, SPLIT) first, then the rest */

#ifdef KVB_GPUCHECK_FATBIN
__asm__(".section .rodata\n"
	".balign 64\n"
	".globl kvb_gpucheck_fatbin\n"
	".hidden kvb_gpucheck_fatbin\n"
	"kvb_gpucheck_fatbin:\n"
	".incbin \"" KVB_GPUCHECK_FATBIN "\"\n"
	".byte 0\n"
	".previous\n");
extern const unsigned char kvb_gpucheck_fatbin[] __attribute__((visibility("hidden")));
#endif

static struct kvb_cuda_api *cu;
static CUcontext ctx;
static CUdevice dev;
static CUfunction fn_fill, fn_check;

struct opts {
	const char *socket, *alloc, *label;
	unsigned pages, rounds;
};

struct kv {
	CUdeviceptr layer[LAYERS];
	uint64_t layer_bytes;
	CUmemGenericAllocationHandle vmm;
	CUdeviceptr vmm_base;
	size_t vmm_size;
	uint32_t view;
};

static void die(const char *what, CUresult r)
{
	fprintf(stderr, "kvbgpucheck: %s: %s\n", what, kvb_cuda_strerror(cu, r));
	exit(1);
}

#define CK(call)                                                                                   \
	do {                                                                                       \
		CUresult r_ = (call);                                                              \
		if (r_ != CUDA_SUCCESS)                                                            \
			die(#call, r_);                                                            \
	} while (0)

/* Loads the driver and the first device; exit 2 with the reason when there is none. */
static void cuda_up(int need_kernels)
{
	char why[256];
	int n = 0;
	CUresult r;

	if (kvb_cuda_load(&cu, why, sizeof(why))) {
		fprintf(stderr, "kvbgpucheck: no GPU: %s\n", why);
		exit(2);
	}
	r = cu->cuInit(0);
	if (r == CUDA_SUCCESS)
		r = cu->cuDeviceGetCount(&n);
	if (r != CUDA_SUCCESS || n < 1) {
		fprintf(stderr, "kvbgpucheck: no GPU: %s\n",
			r != CUDA_SUCCESS ? kvb_cuda_strerror(cu, r) : "no CUDA device");
		exit(2);
	}
	CK(cu->cuDeviceGet(&dev, 0));
	CK(cu->cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cu->cuCtxSetCurrent(ctx));
	if (!need_kernels)
		return;
#ifdef KVB_GPUCHECK_FATBIN
	{
		CUmodule mod;

		CK(cu->cuModuleLoadData(&mod, kvb_gpucheck_fatbin));
		CK(cu->cuModuleGetFunction(&fn_fill, mod, "kvb_fill"));
		CK(cu->cuModuleGetFunction(&fn_check, mod, "kvb_check"));
	}
#else
	fprintf(stderr, "kvbgpucheck: built without nvcc: no fill/check kernels\n");
	exit(2);
#endif
}

static void alloc_legacy(struct kv *k)
{
	for (int l = 0; l < LAYERS; l++)
		CK(cu->cuMemAlloc(&k->layer[l], k->layer_bytes));
}

/* One cuMemCreate allocation, exportable as a POSIX fd, holding every layer. */
static void alloc_vmm(struct kv *k)
{
	CUmemAllocationProp prop = {
		.type = CU_MEM_ALLOCATION_TYPE_PINNED,
		.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
		.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
	};
	CUmemAccessDesc acc = {.location = prop.location,
			       .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	size_t gran = 0;

	CK(cu->cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	k->vmm_size = (LAYERS * k->layer_bytes + gran - 1) / gran * gran;
	CK(cu->cuMemCreate(&k->vmm, k->vmm_size, &prop, 0));
	CK(cu->cuMemAddressReserve(&k->vmm_base, k->vmm_size, 0, 0, 0));
	CK(cu->cuMemMap(k->vmm_base, k->vmm_size, 0, k->vmm, 0));
	CK(cu->cuMemSetAccess(k->vmm_base, k->vmm_size, &acc, 1));
	for (int l = 0; l < LAYERS; l++)
		k->layer[l] = k->vmm_base + (uint64_t)l * k->layer_bytes;
}

static kvb_client *attach(const struct opts *o, const char *name, uint32_t *ns, size_t *pb)
{
	struct kvb_opts ko = {.socket_path = o->socket, .name = name};
	struct kvb_layout l;
	kvb_client *c;
	int err;

	memset(&l, 0, sizeof(l));
	snprintf(l.model, sizeof(l.model), "moonshotai/Kimi-K2.5");
	l.kind = KVB_LAYOUT_MLA;
	l.tokens_per_page = TPP;
	l.tp_size = 8;
	l.ncomponents = 1;
	snprintf(l.comp[0].name, sizeof(l.comp[0].name), "kv");
	l.comp[0].num_layers = LAYERS;
	l.comp[0].bytes_per_token_layer = BPT;
	err = kvb_connect(&ko, &c);
	if (!err)
		err = kvb_ns_open(c, &l, ns, pb);
	if (err) {
		fprintf(stderr, "kvbgpucheck: broker at %s: %s\n",
			o->socket ? o->socket : "default", kvb_strerror(err));
		exit(1);
	}
	return c;
}

/* Registers every layer buffer and the view over them. */
static void make_view(kvb_client *c, uint32_t ns, struct kv *k)
{
	struct kvb_view_part parts[LAYERS];
	double t0 = clock_now();

	for (int l = 0; l < LAYERS; l++) {
		int err = kvb_buf_register_gpu(c, (void *)(uintptr_t)k->layer[l], k->layer_bytes,
					       &parts[l].buf);

		if (err) {
			fprintf(stderr, "kvbgpucheck: kvb_buf_register_gpu (layer %d): %s\n", l,
				kvb_strerror(err));
			exit(1);
		}
		parts[l].stride = BPT;
		parts[l].base = 0;
	}
	if (kvb_view_create(c, ns, parts, LAYERS, &k->view)) {
		fprintf(stderr, "kvbgpucheck: kvb_view_create failed\n");
		exit(1);
	}
	printf("registered %d GPU layer buffers in %.1f ms\n", LAYERS, (clock_now() - t0) * 1e3);
}

static kvb_key page_key(unsigned seed, unsigned p)
{
	uint32_t tok[2] = {seed, p};

	return kvb_key_chain(NULL, tok, 2);
}

static void launch(CUfunction fn, void **args)
{
	CK(cu->cuLaunchKernel(fn, 1024, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
}

/* Submits n view ops (PUT or GET of keys seed/p into slots) and reaps them all. */
static int run_ops(kvb_client *c, const struct kv *k, int opcode, unsigned seed, unsigned n,
		   int reverse, uint16_t lf, uint16_t lc, unsigned *existed)
{
	struct kvb_completion comp[64];
	unsigned sent = 0, done = 0, bad = 0;

	while (done < n) {
		while (sent < n) {
			unsigned p = sent;
			struct kvb_op op = {.opcode = (uint32_t)opcode,
					    .flags = KVB_OPF_VIEW,
					    .buf = k->view,
					    .key = page_key(seed, p),
					    .off = (uint64_t)(reverse ? n - 1 - p : p) * TPP,
					    .layer_first = lf,
					    .layer_count = lc,
					    .user_data = p};
			int rc = kvb_submit(c, &op, 1);

			if (rc < 0) {
				fprintf(stderr, "kvbgpucheck: kvb_submit: %s\n", kvb_strerror(rc));
				return -1;
			}
			if (rc == 0)
				break;
			sent++;
		}
		{
			int rc = kvb_reap(c, comp, 64, 1, 60000);

			if (rc < 0) {
				fprintf(stderr, "kvbgpucheck: kvb_reap: %s\n", kvb_strerror(rc));
				return -1;
			}
			for (int i = 0; i < rc; i++) {
				if (comp[i].res < 0 && !bad++)
					fprintf(stderr, "kvbgpucheck: page %llu: %s\n",
						(unsigned long long)comp[i].user_data,
						kvb_strerror(comp[i].res));
				if (existed && (comp[i].flags & KVB_CQEF_EXISTED))
					(*existed)++;
			}
			done += (unsigned)rc;
		}
	}
	return bad ? -1 : 0;
}

static void setup(const struct opts *o, const char *name, kvb_client **c, uint32_t *ns,
		  struct kv *k)
{
	size_t pb;

	memset(k, 0, sizeof(*k));
	k->layer_bytes = (uint64_t)o->pages * TPP * BPT;
	if (!strcmp(o->alloc, "vmm"))
		alloc_vmm(k);
	else
		alloc_legacy(k);
	*c = attach(o, name, ns, &pb);
	if (pb != (size_t)LAYERS * TPP * BPT) {
		fprintf(stderr, "kvbgpucheck: page of %zu bytes, want %d\n", pb,
			LAYERS * TPP * BPT);
		exit(1);
	}
	make_view(*c, *ns, k);
}

static int cmd_put(const struct opts *o)
{
	unsigned npages = o->pages, tpp = TPP, bpt = BPT, stride = BPT, existed = 0;
	int reverse = 0;
	kvb_client *c;
	uint32_t ns;
	struct kv k;
	double t0;

	cuda_up(1);
	setup(o, "gpucheck-put", &c, &ns, &k);
	for (unsigned l = 0; l < LAYERS; l++) {
		void *args[] = {&k.layer[l], &l, &npages, &tpp, &bpt, &stride, &reverse};

		launch(fn_fill, args);
	}
	CK(cu->cuCtxSynchronize());
	t0 = clock_now();
	if (run_ops(c, &k, KVB_OP_PUT, 1, npages, 0, 0, 0, &existed))
		return 1;
	printf("put %u pages (%u already stored) from %s GPU buffers in %.1f ms\n", npages, existed,
	       o->alloc, (clock_now() - t0) * 1e3);
	kvb_close(c);
	return 0;
}

static int cmd_get(const struct opts *o)
{
	unsigned npages = o->pages, tpp = TPP, bpt = BPT, stride = BPT;
	int reverse = 1;
	unsigned long long bad = 0, total = 0;
	CUdeviceptr dbad;
	kvb_client *c;
	uint32_t ns;
	struct kv k;
	double t0;

	cuda_up(1);
	setup(o, "gpucheck-get", &c, &ns, &k);
	CK(cu->cuMemAlloc(&dbad, sizeof(bad)));
	for (int l = 0; l < LAYERS; l++)
		CK(cu->cuMemsetD8Async(k.layer[l], 0, k.layer_bytes, NULL));
	CK(cu->cuCtxSynchronize());
	t0 = clock_now();
	/* Layer groups in order, as an engine overlapping load and compute would ask. */
	if (run_ops(c, &k, KVB_OP_GET, 1, npages, 1, 0, SPLIT, NULL) ||
	    run_ops(c, &k, KVB_OP_GET, 1, npages, 1, SPLIT, LAYERS - SPLIT, NULL))
		return 1;
	printf("got %u pages into %s GPU buffers in %.1f ms\n", npages, o->alloc,
	       (clock_now() - t0) * 1e3);
	for (unsigned l = 0; l < LAYERS; l++) {
		void *args[] = {&k.layer[l], &l, &npages, &tpp, &bpt, &stride, &reverse, &dbad};

		CK(cu->cuMemsetD8Async(dbad, 0, sizeof(bad), NULL));
		launch(fn_check, args);
		CK(cu->cuMemcpyDtoHAsync(&bad, dbad, sizeof(bad), NULL));
		CK(cu->cuCtxSynchronize());
		if (bad)
			fprintf(stderr, "kvbgpucheck: layer %u: %llu wrong bytes\n", l, bad);
		total += bad;
	}
	printf("compared on the device: %llu of %llu bytes wrong\n", total,
	       (unsigned long long)npages * LAYERS * TPP * BPT);
	kvb_close(c);
	return total ? 1 : 0;
}

/* GB/s of cuMemcpyAsync of bytes, one contiguous block, pinned host <-> device, rounds times. */
static double baseline(int h2d, uint64_t bytes, unsigned rounds)
{
	CUdeviceptr d;
	CUstream st;
	CUevent a, b;
	void *h;
	float ms = 0;

	CK(cu->cuMemHostAlloc(&h, bytes, CU_MEMHOSTALLOC_PORTABLE));
	CK(cu->cuMemAlloc(&d, bytes));
	CK(cu->cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
	CK(cu->cuEventCreate(&a, CU_EVENT_DEFAULT));
	CK(cu->cuEventCreate(&b, CU_EVENT_DEFAULT));
	memset(h, 1, bytes);
	for (unsigned r = 0; r <= rounds; r++) {
		if (r == 1) /* round 0 warms up */
			CK(cu->cuEventRecord(a, st));
		if (h2d)
			CK(cu->cuMemcpyHtoDAsync(d, h, bytes, st));
		else
			CK(cu->cuMemcpyDtoHAsync(h, d, bytes, st));
	}
	CK(cu->cuEventRecord(b, st));
	CK(cu->cuEventSynchronize(b));
	CK(cu->cuEventElapsedTime(&ms, a, b));
	cu->cuEventDestroy(a);
	cu->cuEventDestroy(b);
	cu->cuStreamDestroy(st);
	cu->cuMemFree(d);
	cu->cuMemFreeHost(h);
	return (double)bytes * rounds / (ms * 1e-3) / 1e9;
}

static int cmd_bench(const struct opts *o)
{
	uint64_t bytes = (uint64_t)o->pages * LAYERS * TPP * BPT;
	double t0, d2h, h2d, bd2h, bh2d;
	kvb_client *c;
	uint32_t ns;
	struct kv k;

	cuda_up(0);
	setup(o, "gpucheck-bench", &c, &ns, &k);
	/* Warm-up (and path calibration): one round of each. */
	if (run_ops(c, &k, KVB_OP_PUT, 1000, o->pages, 0, 0, 0, NULL) ||
	    run_ops(c, &k, KVB_OP_GET, 1000, o->pages, 0, 0, 0, NULL))
		return 1;
	t0 = clock_now();
	for (unsigned r = 0; r < o->rounds; r++)
		if (run_ops(c, &k, KVB_OP_PUT, 2000 + r, o->pages, 0, 0, 0, NULL))
			return 1;
	d2h = (double)bytes * o->rounds / (clock_now() - t0) / 1e9;
	t0 = clock_now();
	for (unsigned r = 0; r < o->rounds; r++)
		if (run_ops(c, &k, KVB_OP_GET, 2000, o->pages, 0, 0, 0, NULL))
			return 1;
	h2d = (double)bytes * o->rounds / (clock_now() - t0) / 1e9;
	kvb_close(c);
	bd2h = baseline(0, bytes, o->rounds);
	bh2d = baseline(1, bytes, o->rounds);
	printf("RESULT label=%s pages=%u page_bytes=%d d2h=%.2f h2d=%.2f base_d2h=%.2f "
	       "base_h2d=%.2f d2h_pct=%.0f h2d_pct=%.0f\n",
	       o->label, o->pages, LAYERS * TPP * BPT, d2h, h2d, bd2h, bh2d, 100 * d2h / bd2h,
	       100 * h2d / bh2d);
	return 0;
}

static int cmd_probe(void)
{
	int n = 0;

	cuda_up(0);
	CK(cu->cuDeviceGetCount(&n));
	printf("kvbgpucheck: %d CUDA device(s), using device 0\n", n);
	return 0;
}

#define GPUCHECK_USAGE                                                                             \
	"usage: kvbgpucheck probe|put|get|bench [--socket S] [--pages N] [--alloc legacy|vmm] "    \
	"[--rounds R] [--label L]"

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{"socket", required_argument, NULL, 's'},
		{"pages", required_argument, NULL, 'n'},
		{"alloc", required_argument, NULL, 'a'},
		{"rounds", required_argument, NULL, 'r'},
		{"label", required_argument, NULL, 'l'},
		{"version", no_argument, NULL, 'V'},
		{NULL, 0, NULL, 0},
	};
	struct opts o = {.alloc = "legacy", .label = "-", .pages = 64, .rounds = 4};
	const char *cmd;
	int ch;

	if (argc == 2 && !strcmp(argv[1], "--version")) {
		cli_version("kvbgpucheck");
		return 0;
	}
	if (argc == 2 && !strcmp(argv[1], "--help")) {
		printf("%s\n", GPUCHECK_USAGE);
		return 0;
	}
	if (argc < 2 || argv[1][0] == '-')
		return cli_usage_error("kvbgpucheck", "%s", GPUCHECK_USAGE);
	cmd = argv[1];
	optind = 2;
	while ((ch = cli_getopt(argc, argv, "", lo, "kvbgpucheck")) != -1) {
		switch (ch) {
		case 's':
			o.socket = optarg;
			break;
		case 'n':
			o.pages = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'a':
			o.alloc = optarg;
			break;
		case 'r':
			o.rounds = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'l':
			o.label = optarg;
			break;
		case 'V':
			cli_version("kvbgpucheck");
			return 0;
		default: /* cli_getopt() said what */
			return CLI_USAGE;
		}
	}
	if (!o.pages || !o.rounds)
		return cli_usage_error("kvbgpucheck", "--pages and --rounds take N > 0");
	if (!strcmp(cmd, "probe"))
		return cmd_probe();
	if (!strcmp(cmd, "put"))
		return cmd_put(&o);
	if (!strcmp(cmd, "get"))
		return cmd_get(&o);
	if (!strcmp(cmd, "bench"))
		return cmd_bench(&o);
	fprintf(stderr, "kvbgpucheck: unknown command %s\n", cmd);
	return 2;
}

#else

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "--version")) {
		cli_version("kvbgpucheck");
		return 0;
	}
	fprintf(stderr, "kvbgpucheck: built without the CUDA headers (CUDA_HOME): no GPU check\n");
	return 2;
}

#endif
