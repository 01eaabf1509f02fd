// SPDX-License-Identifier: MIT
/*
 * t_layers.c - the layering rule of the broker holds (tools/check-layers.sh): the RAM store,
 * the disk and remote tiers and the copy engines name nothing of the request engine or of
 * sessions; only ops.c parks, resumes and completes ops. Run from the repository root, as
 * tests/run.sh does; skipped (77) elsewhere.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void)
{
	int rc;

	if (access("tools/check-layers.sh", R_OK)) {
		printf("not run from the repository root\n");
		return 77;
	}
	rc = system("sh tools/check-layers.sh");
	if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc)) {
		printf("FAIL: tools/check-layers.sh (exit %d)\n",
		       WIFEXITED(rc) ? WEXITSTATUS(rc) : -1);
		return 1;
	}
	printf("layers: tiers and copy engines know no request and no session\n");
	return 0;
}
