// SPDX-License-Identifier: MIT
/*
 * test_disk.c - how the disk tier chooses buffered I/O over O_DIRECT (disk_tmpfs_file): only a
 * regular file on tmpfs. A block device's node sits on devtmpfs, whose statfs f_type is tmpfs's,
 * and it must still go O_DIRECT (the regression: --disk /dev/nvme0n1 ran buffered). Checked on
 * made-up (mode, f_type) pairs and on real paths of this machine: a file in /dev/shm, a file in
 * the current directory, and every block device node in /dev.
 */
#include <dirent.h>
#include <linux/magic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cmocka.h>

#include "disk.h"

static void test_disk_blockdev_on_devtmpfs_is_direct(void **state)
{
	(void)state;
	assert_int_equal(disk_tmpfs_file(S_IFBLK | 0660, TMPFS_MAGIC), 0);
	assert_int_equal(disk_tmpfs_file(S_IFBLK | 0660, EXT4_SUPER_MAGIC), 0);
	assert_int_equal(disk_tmpfs_file(S_IFREG | 0600, TMPFS_MAGIC), 1);
	assert_int_equal(disk_tmpfs_file(S_IFREG | 0600, EXT4_SUPER_MAGIC), 0);
	assert_int_equal(disk_tmpfs_file(S_IFREG | 0600, XFS_SUPER_MAGIC), 0);
}

/* What path_open would decide for an existing path. */
static int decide(const char *path)
{
	struct statfs sf;
	struct stat st;

	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(statfs(path, &sf), 0);
	return disk_tmpfs_file(st.st_mode, (long)sf.f_type);
}

static void test_disk_real_paths(void **state)
{
	char shm[64], here[64];
	struct statfs sf;
	struct dirent *e;
	int nblk = 0;
	DIR *d;
	FILE *f;

	(void)state;
	snprintf(shm, sizeof(shm), "/dev/shm/kvb-test-disk-%d", (int)getpid());
	f = fopen(shm, "w");
	if (f && statfs("/dev/shm", &sf) == 0 && sf.f_type == TMPFS_MAGIC) {
		fclose(f);
		assert_int_equal(decide(shm), 1);
	} else if (f) {
		fclose(f);
	}
	unlink(shm);
	snprintf(here, sizeof(here), "kvb-test-disk-%d", (int)getpid());
	f = fopen(here, "w");
	assert_non_null(f);
	fclose(f);
	if (statfs(here, &sf) == 0 && sf.f_type != TMPFS_MAGIC)
		assert_int_equal(decide(here), 0);
	unlink(here);
	/* Every block device node here, on whatever /dev is (devtmpfs: tmpfs's f_type). */
	d = opendir("/dev");
	if (!d)
		return;
	while ((e = readdir(d))) {
		char p[300];
		struct stat st;

		snprintf(p, sizeof(p), "/dev/%s", e->d_name);
		if (lstat(p, &st) < 0 || !S_ISBLK(st.st_mode))
			continue;
		assert_int_equal(decide(p), 0);
		nblk++;
	}
	closedir(d);
	print_message("%d block device nodes in /dev, each classified O_DIRECT\n", nblk);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_disk_blockdev_on_devtmpfs_is_direct),
		cmocka_unit_test(test_disk_real_paths),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
