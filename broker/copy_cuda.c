// SPDX-License-Identifier: MIT
/*
 * copy_cuda.c - placeholder
 */
#include <cjson/cJSON.h>
#include <errno.h>

#include "broker.h"
#include "copy_cuda.h"
#include "log.h"

struct copy_engine *copy_cuda_open(struct broker *b)
{
	(void)b;
	log_info("GPU copies off: built without CUDA headers");
	return NULL;
}

int gpu_buf_reg(struct broker *b, struct session *s, const struct kvb_msg_buf_reg_gpu *m, int fd,
		uint32_t *id)
{
	(void)b, (void)s, (void)m, (void)fd, (void)id;
	return -ENODEV;
}

void gpu_map_put(struct copy_engine *e, struct gpu_map *gm)
{
	(void)e, (void)gm;
}

cJSON *copy_cuda_stats_json(const struct broker *b)
{
	(void)b;
	return cJSON_CreateNull();
}
