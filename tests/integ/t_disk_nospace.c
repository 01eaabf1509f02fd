// SPDX-License-Identifier: MIT
/*
 * t_disk_nospace.c - a start whose --disk-size does not fit the file system fails and leaves the
 * file system as it was. fallocate() that runs out of space keeps what it allocated (ext4: the
 * file stayed, as large as the free space, and the file system full). On a 48 MiB ext4 file
 * system (an image on a loop mount, /var/tmp) a start with --disk-size 256M must exit non-zero
 * and (1) remove the cache file it created, (2) cut a cache file it found back to its size, its
 * bytes intact; the free space afterwards is what it was before. Needs root, mkfs.ext4 and loop
 * mounts; skipped otherwise.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "harness.h"

static char img[128], mnt[128];
static int mounted;

static void cleanup(void)
{
	char cmd[512];

	if (mounted) {
		snprintf(cmd, sizeof(cmd), "umount %s 2>/dev/null || umount -l %s", mnt, mnt);
		if (system(cmd) != 0)
			fprintf(stderr, "# could not unmount %s\n", mnt);
	}
	if (mnt[0])
		rmdir(mnt);
	if (img[0])
		unlink(img);
}

static uint64_t free_bytes(void)
{
	struct statvfs sv;

	CHECK(statvfs(mnt, &sv) == 0);
	return (uint64_t)sv.f_bavail * sv.f_frsize;
}

/* Starts a broker on cache that must fail; returns its output (free it). */
static char *failed_start(const char *cache)
{
	char args[512], *out;
	int rc;

	snprintf(args, sizeof(args),
		 "--socket %s/sock --pool 32M --disk %s --disk-size 256M --log-level info", mnt,
		 cache);
	rc = harness_run_tool("kvbrokerd", args, &out);
	CHECKF(rc != 0, "a --disk-size larger than the file system started: %s", out);
	CHECKF(strstr(out, "reserving") != NULL, "no 'reserving' error in: %s", out);
	return out;
}

int main(int argc, char **argv)
{
	char cmd[512], cache[160], mine[160], *out;
	static uint8_t want[1 << 20], got[1 << 20];
	uint64_t before;
	struct stat st;
	int fd;

	harness_init(argc, argv);
	if (geteuid() != 0)
		harness_skip("not root: cannot mount a small file system");
	atexit(cleanup);
	snprintf(img, sizeof(img), "/var/tmp/kvbt-nospace-%d.img", (int)getpid());
	snprintf(mnt, sizeof(mnt), "/var/tmp/kvbt-nospace-%d.mnt", (int)getpid());
	CHECK(mkdir(mnt, 0700) == 0);
	snprintf(cmd, sizeof(cmd), "truncate -s 48M %s && mkfs.ext4 -q -F %s >/dev/null 2>&1", img,
		 img);
	if (system(cmd) != 0)
		harness_skip("mkfs.ext4 unavailable");
	snprintf(cmd, sizeof(cmd), "mount -o loop %s %s 2>/dev/null", img, mnt);
	if (system(cmd) != 0)
		harness_skip("cannot loop-mount an ext4 image here");
	mounted = 1;

	/* 1. A file this start creates goes when the start fails. */
	snprintf(cache, sizeof(cache), "%s/kvb.cache", mnt);
	before = free_bytes();
	out = failed_start(cache);
	CHECKF(access(cache, F_OK) != 0, "the failed start left %s behind: %s", cache, out);
	free(out);
	CHECKF(free_bytes() + (1u << 20) >= before, "free space %llu, before %llu",
	       (unsigned long long)free_bytes(), (unsigned long long)before);
	harness_log("created file removed; free %llu of %llu bytes before",
		    (unsigned long long)free_bytes(), (unsigned long long)before);

	/* 2. A file it found is cut back to its size, its bytes untouched. */
	snprintf(mine, sizeof(mine), "%s/old.cache", mnt);
	for (size_t i = 0; i < sizeof(want); i++)
		want[i] = (uint8_t)(i * 7 + 3);
	fd = open(mine, O_CREAT | O_WRONLY | O_TRUNC, 0600);
	CHECK(fd >= 0 && write(fd, want, sizeof(want)) == (ssize_t)sizeof(want));
	CHECK(fsync(fd) == 0 && close(fd) == 0);
	before = free_bytes();
	out = failed_start(mine);
	free(out);
	CHECK(stat(mine, &st) == 0);
	CHECK_EQ(st.st_size, sizeof(want));
	fd = open(mine, O_RDONLY);
	CHECK(fd >= 0 && read(fd, got, sizeof(got)) == (ssize_t)sizeof(got));
	close(fd);
	CHECK(memcmp(want, got, sizeof(want)) == 0);
	CHECKF(free_bytes() + (1u << 20) >= before, "free space %llu, before %llu",
	       (unsigned long long)free_bytes(), (unsigned long long)before);
	harness_log("found file cut back to %lld bytes; free %llu of %llu bytes before",
		    (long long)st.st_size, (unsigned long long)free_bytes(),
		    (unsigned long long)before);
	return H_PASS;
}
