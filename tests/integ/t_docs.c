// SPDX-License-Identifier: MIT
/*
 * t_docs.c - every command block of README.md and of the docs/ pages marked runnable
 * works as written.
 *
 * The work is tests/docs/run.sh's, which documents the convention (an HTML comment
 * "<!-- runnable -->" on the line before a ```sh or ```python block, $KVB_SOCKET and $KVB_BIN
 * set by the runner, a broker started for the blocks); this test finds the repository and
 * this build's programs and runs it: sh tests/docs/run.sh BUILD_DIR. A failing command is
 * reported by the runner as "FAIL FILE:LINE: COMMAND (exit N)", with the output before it.
 * Python blocks run where a Python with the kvbroker package and numpy is found (build/venv,
 * which `make test` creates for pytest, or $KVB_PYTHON), and are skipped with a line saying so
 * otherwise; python/tests/test_docs.py runs them in every `make pytest`.
 *
 * The repository: $KVB_SRC_DIR, else three levels above this binary (build/MODE/tests), else
 * the working directory (tests/run.sh runs from the root). Not found: skipped (77).
 */
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Is dir the repository root (it has the runner)? */
static int has_runner(const char *dir)
{
	char p[PATH_MAX];

	snprintf(p, sizeof(p), "%s/tests/docs/run.sh", dir);
	return access(p, R_OK) == 0;
}

int main(int argc, char **argv)
{
	char self[PATH_MAX], up[PATH_MAX + 16], build[PATH_MAX], src[PATH_MAX],
		runner[PATH_MAX + 32];
	const char *env = getenv("KVB_SRC_DIR");
	char *dir;
	pid_t pid;
	int st;

	(void)argc;
	snprintf(self, sizeof(self), "%s", argv[0]);
	dir = dirname(self);
	snprintf(up, sizeof(up), "%s/..", dir);
	if (!realpath(up, build)) {
		printf("t_docs: cannot resolve the build directory from %s\n", argv[0]);
		return 1;
	}
	snprintf(up, sizeof(up), "%s/../..", build);
	if (env && *env && has_runner(env))
		snprintf(src, sizeof(src), "%s", env);
	else if (realpath(up, src) && has_runner(src))
		;
	else if (getcwd(src, sizeof(src)) && has_runner(src))
		;
	else {
		printf("tests/docs/run.sh not found: run from the repository root or set "
		       "KVB_SRC_DIR\n");
		return 77;
	}
	snprintf(runner, sizeof(runner), "%s/tests/docs/run.sh", src);
	printf("# sh %s %s\n", runner, build);
	fflush(stdout);
	pid = fork();
	if (pid < 0) {
		perror("t_docs: fork");
		return 1;
	}
	if (pid == 0) {
		execlp("sh", "sh", runner, build, (char *)NULL);
		perror("t_docs: exec sh");
		_exit(127);
	}
	if (waitpid(pid, &st, 0) < 0) {
		perror("t_docs: waitpid");
		return 1;
	}
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	if (WIFEXITED(st))
		printf("t_docs: tests/docs/run.sh exited %d\n", WEXITSTATUS(st));
	else
		printf("t_docs: tests/docs/run.sh killed by signal %d\n", WTERMSIG(st));
	return 1;
}
