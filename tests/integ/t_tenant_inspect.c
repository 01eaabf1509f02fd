// SPDX-License-Identifier: MIT
/*
 * t_tenant_inspect.c - with every tenant partition bound (--tenants uid, all eight held by
 * eight uids with clients attached, more than the shares: they lend), a ninth uid is refused
 * -EUSERS with a line that says why and who
 * may still attach, and the operator (root, here also the broker's uid) still attaches a ring
 * client, for inspection: its STATS sees every tenant, it opens no namespace (-EACCES), and the
 * tenants' pages stay theirs. Root only (setpriv); skipped elsewhere.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define UID_A 4342 /* A and the seven after it hold the partitions */
#define UID_C 4350
#define NHOLD 8
#define PAGE (64u * 1024)

static void layout(struct kvb_layout *l)
{
	harness_layout(l, "inspect/model", KVB_LAYOUT_MLA, 16, 1, 0, 4, 1024);
}

/* hold: attach, store one page, stay until killed; try: attach, exit 3 when refused -EUSERS. */
static int client_main(const char *mode, const char *sock)
{
	struct kvb_opts o = {.socket_path = sock, .name = mode};
	struct kvb_layout l;
	kvb_client *c = NULL;
	uint8_t *buf;
	uint32_t ns;
	size_t pb;
	int rc = kvb_connect(&o, &c);
	kvb_key k = harness_key(getuid(), 0);

	if (!strcmp(mode, "try"))
		return rc == -EUSERS ? 3 : rc ? 4 : 0;
	CHECK_OK(rc);
	buf = malloc(PAGE);
	CHECK(buf != NULL);
	layout(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	harness_fill(buf, PAGE, &k, getuid());
	CHECK_EQ(kvb_put(c, ns, k, buf, PAGE), 0); /* stored */
	for (;;)
		pause();
}

static char dir[128], rundir[160], sockp[200];

static void remove_dirs(void)
{
	unlink(sockp);
	rmdir(rundir);
	rmdir(dir);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct group *g = getgrnam("users");
	struct kvb_opts o = {.socket_path = sockp, .name = "inspector"};
	struct kvb_layout l;
	kvb_client *ctl, *root = NULL;
	pid_t hold[NHOLD];
	uint32_t ns;
	size_t pb;
	char *js;

	if (argc == 4 && !strcmp(argv[1], "--client"))
		return client_main(argv[2], argv[3]);
	harness_init(argc, argv);
	if (geteuid() != 0)
		harness_skip("needs root to run clients as three uids");
	if (!g)
		g = getgrnam("nogroup");
	if (!g)
		harness_skip("no group 'users' or 'nogroup' to admit");
	snprintf(dir, sizeof(dir), "/tmp/kvbt-inspect-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	atexit(remove_dirs);
	CHECK_OK(chmod(dir, 0711));
	snprintf(rundir, sizeof(rundir), "%s/run", dir);
	snprintf(sockp, sizeof(sockp), "%s/sock", rundir);
	/* Two shares of 64 MiB, and eight tenants: their guarantees scaled down to 16 MiB. */
	b = harness_broker_start("--pool", "128M", "--tenants", "uid", "--tenant-share", "64M",
				 "--group", g->gr_name, "--socket", sockp, "--log-level", "info");
	o.flags = KVB_CONNECT_CONTROL;
	CHECK_OK(kvb_connect(&o, &ctl));
	for (int i = 0; i < NHOLD; i++)
		hold[i] = harness_start_as(UID_A + i, g->gr_gid, "hold", sockp, client_main);
	CHECK_EQ(harness_stat_wait(ctl, "clients", NHOLD, 10000), NHOLD);
	CHECK_EQ(harness_stat_wait(ctl, "pool.pages", NHOLD, 10000), NHOLD);

	harness_log("a ninth uid: refused, and told who may still attach");
	CHECK_EQ(harness_wait_exit(harness_start_as(UID_C, g->gr_gid, "try", sockp, client_main)),
		 3);
	CHECK(harness_broker_log_has(b, "every tenant share is taken"));
	CHECK(harness_broker_log_has(b, "may still attach to inspect"));

	harness_log("root: attached for inspection, every tenant in view, no namespace");
	o.flags = 0;
	CHECK_OK(kvb_connect(&o, &root));
	CHECK(harness_broker_log_has(b, "attached for inspection"));
	js = harness_stats(root);
	CHECK(strstr(js, "\"view\":\"all\"") != NULL);
	CHECK_EQ(harness_stat_u64(js, "clients"), NHOLD + 1);
	CHECK(strstr(js, "\"id\":4342") && strstr(js, "\"id\":4349")); /* tenants[] */
	free(js);
	layout(&l);
	CHECK_EQ(kvb_ns_open(root, &l, &ns, &pb), -EACCES);
	CHECK_EQ(kvb_ns_limit(root, "inspect/model", 1 << 20, 0), 0); /* an operator's call */
	CHECK_EQ(harness_stat(ctl, "pool.pages"), NHOLD);	      /* each tenant's one page */

	harness_log("the tenants leave: their shares stay bound, shown idle");
	for (int i = 0; i < NHOLD; i++) {
		kill(hold[i], SIGKILL);
		harness_wait_exit(hold[i]);
	}
	CHECK_EQ(harness_stat_wait(ctl, "clients", 1, 10000), 1); /* root's */
	usleep(100000);
	js = harness_stats(ctl);
	{
		cJSON *doc = cJSON_Parse(js);
		const cJSON *t;
		int idle = 0;

		cJSON_ArrayForEach(t, cJSON_GetObjectItem(doc, "tenants"))
		{
			CHECK_EQ(cJSON_GetObjectItem(t, "bound")->valuedouble, 1);
			idle += cJSON_GetObjectItem(t, "idle_s")->valuedouble >= 0.05;
		}
		CHECK_EQ(idle, NHOLD);
		cJSON_Delete(doc);
	}
	free(js);
	kvb_close(root);
	kvb_close(ctl);
	harness_broker_stop(b);
	return 0;
}
