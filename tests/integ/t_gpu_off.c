// SPDX-License-Identifier: MIT
/*
 * t_gpu_off.c - a machine without a GPU (no libcuda.so.1, or a build without the CUDA
 * headers): the broker starts anyway, logs that GPU copies are off and says so in its stats;
 * kvb_buf_register_gpu() fails with -ENODEV and a kvb_strerror() text that says what is
 * missing; a hand-made BUF_REG_GPU reaches the broker and is refused with -ENODEV, the session
 * carrying on. On a machine with a working CUDA driver and device the test skips (77): the GPU
 * check (tools/gpu-check.sh) covers that case.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

int main(int argc, char **argv)
{
	struct kvb_msg_buf_reg_gpu m;
	struct harness_broker *b;
	struct harness_raw raw;
	kvb_client *c;
	uint32_t buf = 12345;
	char *js;
	int rc;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "16M");
	if (!harness_broker_log_has(b, "GPU copies off"))
		harness_skip("the broker has GPU copies on: this machine has a GPU");
	c = harness_connect(b, "t_gpu_off", 0);

	rc = kvb_buf_register_gpu(c, (void *)(uintptr_t)0x7f0012340000ull, 1 << 20, &buf);
	CHECK_RC(rc, -ENODEV);
	CHECK_EQ(buf, 12345);
	CHECK(strstr(kvb_strerror(rc), "GPU") != NULL);
	printf("# kvb_buf_register_gpu: %s\n", kvb_strerror(rc));
	CHECK_RC(kvb_buf_register_gpu(c, NULL, 4096, &buf), -EINVAL);

	js = harness_stats(c);
	CHECK(strstr(js, "\"gpu\":null") != NULL);
	free(js);

	/* The broker's side, with a message no library would send here. */
	CHECK_OK(harness_raw_hello(&raw, b->sock, KVB_ABI_MAJOR, 0));
	memset(&m, 0, sizeof(m));
	m.kind = KVB_BUF_GPU_IPC;
	m.alloc_size = m.len = 1 << 20;
	CHECK_RC(harness_raw_call(&raw, KVB_MSG_BUF_REG_GPU, &m, sizeof(m), -1, NULL, 0), -ENODEV);
	/* Still attached after a refusal; a short one is malformed and ends the session. */
	CHECK_RC(harness_raw_call(&raw, KVB_MSG_BUF_REG_GPU, &m, sizeof(m), -1, NULL, 0), -ENODEV);
	(void)harness_raw_call(&raw, KVB_MSG_BUF_REG_GPU, &m, sizeof(m) - 8, -1, NULL, 0);
	CHECK(harness_raw_hung_up(&raw, 5000));
	harness_raw_close(&raw);

	kvb_close(c);
	harness_broker_stop(b);

	b = harness_broker_start("--pool", "16M", "--no-gpu");
	CHECK(harness_broker_log_has(b, "GPU copies off: --no-gpu"));
	harness_broker_stop(b);
	return H_PASS;
}
