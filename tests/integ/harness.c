// SPDX-License-Identifier: MIT
/*
 * harness.c - the integration tests' harness: a real kvbrokerd per test on a private socket,
 * client processes, stats readers, deterministic page content and a raw protocol client.
 *
 * Process model: the test's main process starts the broker (fork + exec, stderr to a log under
 * the runner's log directory) and forks client children. Everything it starts dies with it: the
 * broker gets SIGTERM and children SIGKILL through PR_SET_PDEATHSIG, and an atexit handler stops
 * a broker still running and removes the temporary directory. A failed check in the main process
 * dumps the broker's log first, so a failure explains itself; a deadline alarm does the same for
 * a hang (with async-signal-safe calls only) before the runner's hard timeout would kill the test
 * silently.
 *
 * Page content is a counter-mode hash of (key, seed, offset), so any byte can be recomputed
 * without the buffer that produced it: a reader in another process verifies a page knowing only
 * its key and seed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

#include "clock.h"
#include "harness.h"
#include "proto.h"

#define MAX_BROKERS 128 /* t_pool_keep restarts one broker many times */
#define LOG_TAIL (64 * 1024)

static char h_argv0[PATH_MAX];
static char h_name[64] = "test";
static char h_logdir[PATH_MAX - 256]; /* room for "/NAME.broker-N.log" in a PATH_MAX */
static pid_t h_main_pid;
static uint64_t h_t0_ns;
/*
 * Brokers live here, not in the caller's frame: the atexit handler that stops them runs after
 * main() has returned, when a struct on main's stack is gone.
 */
static struct harness_broker h_broker_store[MAX_BROKERS];
static struct harness_broker *h_brokers[MAX_BROKERS];
static int h_nbrokers;

/* Only ever signal a process this harness forked (never 0, -1 or init). */
static int our_child(pid_t pid)
{
	return pid > 1 && pid != h_main_pid;
}

uint64_t harness_now_ns(void)
{
	return clock_ns();
}

uint64_t harness_now_ms(void)
{
	return harness_now_ns() / 1000000;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static int in_main(void)
{
	return getpid() == h_main_pid;
}

/* ---- logs ---- */

/* write(2) all of it; async-signal-safe. */
static void write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		p += w;
		n -= (size_t)w;
	}
}

static void write_str(int fd, const char *s)
{
	write_all(fd, s, strlen(s));
}

/* Copies the last LOG_TAIL bytes of path to fd with open/read/write only (async-signal-safe). */
static void dump_file(const char *path, int fd)
{
	char buf[4096];
	int in = open(path, O_RDONLY | O_CLOEXEC);
	off_t end;
	ssize_t n;

	if (in < 0) {
		write_str(fd, "(no broker log)\n");
		return;
	}
	end = lseek(in, 0, SEEK_END);
	if (end > LOG_TAIL) {
		lseek(in, end - LOG_TAIL, SEEK_SET);
		write_str(fd, "(... earlier lines cut ...)\n");
	} else {
		lseek(in, 0, SEEK_SET);
	}
	while ((n = read(in, buf, sizeof(buf))) > 0)
		write_all(fd, buf, (size_t)n);
	close(in);
}

void harness_broker_dump_log(const struct harness_broker *b)
{
	fflush(stdout);
	write_str(1, "======== broker log ");
	write_str(1, b->log);
	write_str(1, " ========\n");
	dump_file(b->log, 1);
	write_str(1, "======== end of broker log ========\n");
}

int harness_broker_log_has(const struct harness_broker *b, const char *text)
{
	FILE *f = fopen(b->log, "re");
	char line[4096];
	int found = 0;

	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, text) != NULL;
	fclose(f);
	return found;
}

void harness_log(const char *fmt, ...)
{
	va_list ap;
	uint64_t ms = (harness_now_ns() - h_t0_ns) / 1000000;

	printf("# %4llu.%03llu ", (unsigned long long)ms / 1000, (unsigned long long)ms % 1000);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
}

const char *harness_strerror(long long rc)
{
	if (rc >= 0)
		return "Success";
	if (rc < -4095)
		return "(not an errno)";
	return kvb_strerror((int)rc);
}

/* ---- failure, skip, clean-up ---- */

static void remove_dir(const char *dir)
{
	DIR *d;
	struct dirent *e;
	char p[PATH_MAX + 256];

	if (!dir[0])
		return;
	d = opendir(dir);
	if (d) {
		while ((e = readdir(d))) {
			if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
				continue;
			snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
			unlink(p);
		}
		closedir(d);
	}
	rmdir(dir);
}

/* Stops a broker without judging it: SIGTERM, up to 3 s, then SIGKILL. */
static void broker_kill(struct harness_broker *b)
{
	uint64_t end;

	if (!our_child(b->pid))
		return;
	kill(b->pid, SIGTERM);
	end = harness_now_ms() + 3000;
	while (harness_now_ms() < end) {
		if (waitpid(b->pid, &b->status, WNOHANG) == b->pid) {
			b->pid = 0;
			return;
		}
		sleep_ms(10);
	}
	kill(b->pid, SIGKILL);
	waitpid(b->pid, &b->status, 0);
	b->pid = 0;
}

static void cleanup(void)
{
	if (!in_main())
		return;
	for (int i = 0; i < h_nbrokers; i++) {
		broker_kill(h_brokers[i]);
		remove_dir(h_brokers[i]->dir);
	}
	h_nbrokers = 0;
}

void harness_fail(const char *file, int line, const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	if (in_main())
		printf("FAIL %s:%d: ", file, line);
	else
		printf("FAIL [child %d] %s:%d: ", (int)getpid(), file, line);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
	if (!in_main())
		_exit(H_FAIL);
	for (int i = 0; i < h_nbrokers; i++) {
		struct harness_broker *b = h_brokers[i];

		if (b->pid > 0 && !harness_broker_alive(b))
			printf("broker pid %d had exited: %s %d\n", (int)-b->pid,
			       WIFSIGNALED(b->status) ? "signal" : "exit status",
			       WIFSIGNALED(b->status) ? WTERMSIG(b->status)
						      : WEXITSTATUS(b->status));
		harness_broker_dump_log(b);
	}
	exit(H_FAIL);
}

void harness_skip(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	printf("SKIP: ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
	if (!in_main())
		_exit(H_SKIP);
	exit(H_SKIP);
}

/*
 * The deadline alarm, and SIGTERM/SIGINT (the runner's timeout): dump the broker logs, stop the
 * brokers and clean up with async-signal-safe calls only (write, open, read, kill, waitpid,
 * nanosleep, unlink, rmdir, _exit). A broker gets 2 s to exit so its pool is not orphaned.
 */
static void on_deadline(int sig)
{
	if (getpid() != h_main_pid)
		_exit(H_FAIL);
	if (sig == SIGALRM)
		write_str(1,
			  "\nFAIL: test deadline passed (KVB_TEST_DEADLINE); broker logs follow\n");
	else
		write_str(1, "\nFAIL: terminated by a signal (the runner's timeout?); broker logs "
			     "follow\n");
	for (int i = 0; i < h_nbrokers; i++) {
		struct harness_broker *b = h_brokers[i];
		struct timespec ts = {.tv_nsec = 10 * 1000 * 1000};

		write_str(1, "======== broker log ========\n");
		dump_file(b->log, 1);
		write_str(1, "======== end of broker log ========\n");
		if (our_child(b->pid)) {
			int n = 0;

			kill(b->pid, SIGTERM);
			while (waitpid(b->pid, NULL, WNOHANG) != b->pid && ++n < 200)
				nanosleep(&ts, NULL);
			if (n == 200)
				kill(b->pid, SIGKILL);
		}
		unlink(b->sock);
		rmdir(b->dir);
	}
	_exit(H_FAIL);
}

void harness_init(int argc, char **argv)
{
	char tmp[PATH_MAX];
	const char *d = getenv("KVB_TEST_DEADLINE");
	unsigned deadline = 90;
	struct sigaction sa;

	(void)argc;
	h_main_pid = getpid();
	h_t0_ns = harness_now_ns();
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	snprintf(h_argv0, sizeof(h_argv0), "%s", argv[0]);
	snprintf(tmp, sizeof(tmp), "%s", argv[0]);
	snprintf(h_name, sizeof(h_name), "%s", basename(tmp));
	snprintf(tmp, sizeof(tmp), "%s", argv[0]);
	snprintf(h_logdir, sizeof(h_logdir), "%s/logs", dirname(tmp));
	if (mkdir(h_logdir, 0755) < 0 && errno != EEXIST)
		h_logdir[0] = 0;
	atexit(cleanup);
	if (d && *d)
		deadline = (unsigned)strtoul(d, NULL, 10);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_deadline;
	sigaction(SIGALRM, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	alarm(deadline);
	harness_log("%s: pid %d", h_name, (int)h_main_pid);
}

/* ---- the broker ---- */

static void broker_path(char *out, size_t len)
{
	const char *env = getenv("KVB_BROKERD");
	char tmp[PATH_MAX];

	if (env && *env) {
		snprintf(out, len, "%s", env);
		return;
	}
	snprintf(tmp, sizeof(tmp), "%s", h_argv0);
	snprintf(out, len, "%s/../bin/kvbrokerd", dirname(tmp));
}

int harness_broker_alive(struct harness_broker *b)
{
	if (!our_child(b->pid))
		return 0;
	if (waitpid(b->pid, &b->status, WNOHANG) == b->pid) {
		b->pid = -b->pid; /* remember who it was, but never signal it again */
		return 0;
	}
	return 1;
}

static int try_control_connect(const struct harness_broker *b)
{
	struct kvb_opts o = {
		.socket_path = b->sock, .name = "harness-probe", .flags = KVB_CONNECT_CONTROL};
	kvb_client *c = NULL;
	int rc = kvb_connect(&o, &c);

	if (rc == 0)
		kvb_close(c);
	return rc;
}

void (*harness_broker_preexec)(void *arg);
void *harness_broker_preexec_arg;

struct harness_broker *harness_broker_startv(const char *const *args)
{
	struct harness_broker *b;
	char path[PATH_MAX], tmpdir[100]; /* + "/sock" must fit a sun_path (108) */
	const char *argv[64];
	const char *tdir = getenv("TMPDIR");
	int argc = 0, have_pool = 0, logfd, rc = -1;
	uint64_t end;
	pid_t parent = getpid();

	CHECKF(h_nbrokers < MAX_BROKERS, "too many brokers in one test");
	b = &h_broker_store[h_nbrokers];
	memset(b, 0, sizeof(*b));
	broker_path(path, sizeof(path));
	if (access(path, X_OK) < 0)
		harness_fail(__FILE__, __LINE__, "kvbrokerd not found at %s (%s): build it first",
			     path, strerror(errno));

	/* mkdtemp under $TMPDIR or /tmp; the socket path must fit a sockaddr_un. */
	if (!tdir || !*tdir || strlen(tdir) > 60)
		tdir = "/tmp";
	snprintf(tmpdir, sizeof(tmpdir), "%s/kvbt-%.20s-XXXXXX", tdir, h_name);
	CHECKF(mkdtemp(tmpdir), "mkdtemp %s: %s", tmpdir, strerror(errno));
	snprintf(b->dir, sizeof(b->dir), "%s", tmpdir);
	snprintf(b->sock, sizeof(b->sock), "%s/sock", tmpdir);
	/* "--socket PATH" among the arguments: a broker on an existing socket (a restart). */
	for (const char *const *a = args; *a; a++)
		if (!strcmp(*a, "--socket") && a[1])
			snprintf(b->sock, sizeof(b->sock), "%s", a[1]);
	if (h_logdir[0])
		snprintf(b->log, sizeof(b->log), "%s/%s.broker%s%.0d.log", h_logdir, h_name,
			 h_nbrokers ? "-" : "", h_nbrokers);
	else
		snprintf(b->log, sizeof(b->log), "%s/broker.log", tmpdir);
	h_brokers[h_nbrokers++] = b;

	argv[argc++] = path;
	argv[argc++] = "--socket";
	argv[argc++] = b->sock; /* the same as a --socket among args, which comes later */
	for (const char *const *a = args; *a; a++) {
		CHECKF(argc < 60, "too many broker arguments");
		if (!strncmp(*a, "--pool", 6) && ((*a)[6] == 0 || (*a)[6] == '='))
			have_pool = 1;
		argv[argc++] = *a;
	}
	if (!have_pool) {
		argv[argc++] = "--pool";
		argv[argc++] = "128M";
	}
	argv[argc] = NULL;

	logfd = open(b->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	CHECKF(logfd >= 0, "open %s: %s", b->log, strerror(errno));
	{
		char cmd[2048];
		size_t off = 0;

		for (int i = 0; i < argc && off < sizeof(cmd) - 1; i++)
			off += (size_t)snprintf(cmd + off, sizeof(cmd) - off, "%s%s", i ? " " : "",
						argv[i]);
		harness_log("broker: %s", cmd);
	}
	fflush(stdout);
	fflush(stderr);
	b->pid = fork();
	CHECKF(b->pid >= 0, "fork: %s", strerror(errno));
	if (b->pid == 0) {
		int null = open("/dev/null", O_RDONLY);

		/* Die with the test, whatever kills it. */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent)
			_exit(127);
		if (null >= 0)
			dup2(null, 0);
		dup2(logfd, 1);
		dup2(logfd, 2);
		if (harness_broker_preexec)
			harness_broker_preexec(harness_broker_preexec_arg);
		execv(path, (char *const *)(uintptr_t)argv);
		dprintf(2, "harness: exec %s: %s\n", path, strerror(errno));
		_exit(127);
	}
	close(logfd);

	/* Start-up includes prefault and a disk scan; a loaded machine is slow at both. */
	end = harness_now_ms() + 60000;
	while (harness_now_ms() < end) {
		if (!harness_broker_alive(b))
			harness_fail(__FILE__, __LINE__,
				     "kvbrokerd exited during start-up: status 0x%x (exit %d)",
				     b->status, WIFEXITED(b->status) ? WEXITSTATUS(b->status) : -1);
		rc = try_control_connect(b);
		if (rc == 0)
			break;
		sleep_ms(10);
	}
	if (rc != 0)
		harness_fail(__FILE__, __LINE__,
			     "kvbrokerd not ready after 60 s: last connect %d (%s)", rc,
			     harness_strerror(rc));
	harness_log("broker pid %d ready on %s", (int)b->pid, b->sock);
	return b;
}

void harness_broker_stop(struct harness_broker *b)
{
	uint64_t t0 = harness_now_ms(), end = t0 + 5000;
	pid_t pid = b->pid;

	if (!our_child(pid))
		harness_fail(__FILE__, __LINE__, "broker %d is not running (status 0x%x)", -pid,
			     b->status);
	CHECKF(kill(pid, SIGTERM) == 0, "kill %d: %s", (int)pid, strerror(errno));
	for (;;) {
		if (waitpid(pid, &b->status, WNOHANG) == pid)
			break;
		if (harness_now_ms() >= end) {
			kill(pid, SIGKILL);
			waitpid(pid, &b->status, 0);
			b->pid = 0;
			harness_fail(__FILE__, __LINE__,
				     "kvbrokerd did not exit within 5 s of SIGTERM (killed)");
		}
		sleep_ms(5);
	}
	b->pid = 0;
	if (!WIFEXITED(b->status) || WEXITSTATUS(b->status) != 0) {
		if (WIFSIGNALED(b->status))
			harness_fail(__FILE__, __LINE__,
				     "kvbrokerd died of signal %d after SIGTERM",
				     WTERMSIG(b->status));
		harness_fail(__FILE__, __LINE__, "kvbrokerd exited with %d after SIGTERM, want 0",
			     WEXITSTATUS(b->status));
	}
	harness_log("broker stopped cleanly in %llu ms",
		    (unsigned long long)(harness_now_ms() - t0));
}

kvb_client *harness_connect(const struct harness_broker *b, const char *name, uint32_t sq_entries)
{
	struct kvb_opts o = {.socket_path = b->sock, .name = name, .sq_entries = sq_entries};
	kvb_client *c = NULL;
	int rc = kvb_connect(&o, &c);

	if (rc != 0)
		harness_fail(__FILE__, __LINE__, "kvb_connect(%s) as '%s': %d (%s)", b->sock,
			     name ? name : "", rc, harness_strerror(rc));
	CHECK(c != NULL);
	return c;
}

/* ---- stats ---- */

char *harness_stats(kvb_client *c)
{
	char *json = NULL;
	int rc = kvb_stats_json(c, &json);

	if (rc < 0)
		harness_fail(__FILE__, __LINE__, "kvb_stats_json: %d (%s)", rc,
			     harness_strerror(rc));
	CHECKF(json != NULL, "kvb_stats_json returned %d but no document", rc);
	return json;
}

/* The first element of array arr whose member key equals val (a number or a string). */
static const cJSON *stat_select(const cJSON *arr, const char *key, const char *val)
{
	const cJSON *it;

	cJSON_ArrayForEach(it, arr)
	{
		const cJSON *m = cJSON_GetObjectItemCaseSensitive(it, key);

		if (cJSON_IsNumber(m) && m->valuedouble == strtod(val, NULL))
			return it;
		if (cJSON_IsString(m) && !strcmp(m->valuestring, val))
			return it;
	}
	return NULL;
}

/* Follows a path like "namespaces[id=3].pages" from root; NULL when any step is missing. */
static const cJSON *stat_find(const cJSON *root, const char *path)
{
	const cJSON *cur = root;
	const char *p = path;
	char name[128];

	while (cur && *p) {
		size_t n = strcspn(p, ".[");

		if (n >= sizeof(name))
			return NULL;
		if (n) {
			memcpy(name, p, n);
			name[n] = 0;
			cur = cJSON_GetObjectItemCaseSensitive(cur, name);
			p += n;
		}
		while (cur && *p == '[') {
			const char *close = strchr(p, ']');
			char inner[128], *eq;

			if (!close || (size_t)(close - p - 1) >= sizeof(inner))
				return NULL;
			memcpy(inner, p + 1, (size_t)(close - p - 1));
			inner[close - p - 1] = 0;
			p = close + 1;
			eq = strchr(inner, '=');
			if (eq) {
				*eq = 0;
				cur = stat_select(cur, inner, eq + 1);
			} else {
				cur = cJSON_IsArray(cur) ? cJSON_GetArrayItem(cur, atoi(inner))
							 : NULL;
			}
		}
		if (*p == '.')
			p++;
	}
	return cur;
}

static void stat_fail(const char *json, const char *path, const char *why)
{
	printf("stats document:\n%.8192s\n", json);
	harness_fail(__FILE__, __LINE__, "stats path '%s': %s", path, why);
}

double harness_stat_f64(const char *json, const char *path)
{
	cJSON *root = cJSON_Parse(json);
	const cJSON *v;
	double d;

	if (!root)
		stat_fail(json, path, "the document is not valid JSON");
	v = stat_find(root, path);
	if (!v) {
		cJSON_Delete(root);
		stat_fail(json, path, "missing");
	}
	if (!cJSON_IsNumber(v)) {
		cJSON_Delete(root);
		stat_fail(json, path, "not a number");
	}
	d = v->valuedouble;
	cJSON_Delete(root);
	return d;
}

uint64_t harness_stat_u64(const char *json, const char *path)
{
	double d = harness_stat_f64(json, path);

	if (d < 0 || d > 18446744073709551615.0)
		stat_fail(json, path, "not a non-negative integer");
	return (uint64_t)d;
}

int harness_stat_has(const char *json, const char *path)
{
	cJSON *root = cJSON_Parse(json);
	int has = root && stat_find(root, path) != NULL;

	cJSON_Delete(root);
	return has;
}

uint64_t harness_stat(kvb_client *c, const char *path)
{
	char *json = harness_stats(c);
	uint64_t v = harness_stat_u64(json, path);

	free(json);
	return v;
}

uint64_t harness_stat_wait(kvb_client *c, const char *path, uint64_t want, int timeout_ms)
{
	uint64_t end = harness_now_ms() + (uint64_t)timeout_ms, v;

	for (;;) {
		v = harness_stat(c, path);
		if (v == want || harness_now_ms() >= end)
			return v;
		sleep_ms(10);
	}
}

/* ---- keys and content ---- */

/* splitmix64's finalizer: a bijective 64-bit mix. */
static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

#define GOLDEN 0x9e3779b97f4a7c15ull

kvb_key harness_key(uint64_t seed, uint64_t i)
{
	kvb_key k;
	uint64_t s = mix64(seed * GOLDEN + 0x1234567) ^ mix64(i + GOLDEN);

	for (int w = 0; w < 4; w++) {
		uint64_t v = mix64(s + (uint64_t)w * GOLDEN);

		memcpy(&k.b[w * 8], &v, 8);
	}
	return k;
}

void harness_key_chain(kvb_key *keys, size_t n, uint32_t tokens_per_page, uint64_t seed)
{
	uint32_t *tok = malloc(tokens_per_page * sizeof(*tok));
	uint64_t s = mix64(seed);

	CHECK(tok != NULL);
	for (size_t i = 0; i < n; i++) {
		for (uint32_t t = 0; t < tokens_per_page; t++)
			tok[t] = (uint32_t)(mix64(s++) % 152064); /* a plausible vocabulary */
		keys[i] = kvb_key_chain(i ? &keys[i - 1] : NULL, tok, tokens_per_page);
	}
	free(tok);
}

static uint64_t content_base(const kvb_key *key, uint64_t seed)
{
	uint64_t h = mix64(seed + GOLDEN), w;

	for (int i = 0; i < 4; i++) {
		memcpy(&w, &key->b[i * 8], 8);
		h = mix64(h ^ w);
	}
	return h;
}

static uint64_t content_word(uint64_t base, uint64_t idx)
{
	return mix64(base + idx * GOLDEN);
}

uint8_t harness_byte(const kvb_key *key, uint64_t seed, size_t off)
{
	uint64_t w = content_word(content_base(key, seed), off / 8);

	return (uint8_t)(w >> (8 * (off % 8)));
}

int harness_memfd_maps(void)
{
	char line[512];
	FILE *f = fopen("/proc/self/maps", "r");
	int n = 0;

	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, "memfd:kvbroker") != NULL;
	if (f)
		fclose(f);
	return n;
}

void harness_reap_n(kvb_client *c, struct kvb_completion *out, size_t n)
{
	size_t got = 0;

	while (got < n) {
		int rc = kvb_reap(c, out + got, n - got, 1, 5000);

		CHECKF(rc > 0, "kvb_reap: %d", rc);
		got += (size_t)rc;
	}
}

void harness_fill(void *buf, size_t len, const kvb_key *key, uint64_t seed)
{
	uint64_t base = content_base(key, seed);
	unsigned char *p = buf;
	size_t i = 0;

	for (; i + 8 <= len; i += 8) {
		uint64_t w = content_word(base, i / 8);

		memcpy(p + i, &w, 8);
	}
	if (i < len) {
		uint64_t w = content_word(base, i / 8);

		memcpy(p + i, &w, len - i);
	}
}

int harness_verify(const void *buf, size_t len, const kvb_key *key, uint64_t seed, const char *what)
{
	uint64_t base = content_base(key, seed);
	const unsigned char *p = buf;
	size_t i, first = SIZE_MAX, nbad = 0, nzero = 0;

	for (i = 0; i < len; i += 8) {
		uint64_t w = content_word(base, i / 8), g = 0;
		size_t n = len - i < 8 ? len - i : 8;

		memcpy(&g, p + i, n);
		if (n < 8)
			w &= (1ull << (8 * n)) - 1;
		if (g == w)
			continue;
		for (size_t j = 0; j < n; j++) {
			if (p[i + j] == (uint8_t)(w >> (8 * j)))
				continue;
			if (first == SIZE_MAX)
				first = i + j;
			nbad++;
			nzero += p[i + j] == 0;
		}
	}
	if (!nbad)
		return 0;
	printf("content mismatch in %s (key %s, seed %llu, %zu bytes): first at offset %zu: "
	       "got 0x%02x want 0x%02x; %zu bytes differ (%zu of them zero)\n",
	       what ? what : "page", harness_key_str(key), (unsigned long long)seed, len, first,
	       p[first], harness_byte(key, seed, first), nbad, nzero);
	return -1;
}

const char *harness_key_str(const kvb_key *key)
{
	static char bufs[4][17];
	static int n;
	char *s = bufs[n++ & 3];

	for (int i = 0; i < 8; i++)
		snprintf(s + 2 * i, 3, "%02x", key->b[i]);
	return s;
}

void harness_layout(struct kvb_layout *l, const char *model, uint32_t kind, uint32_t tpp,
		    uint32_t tp_size, uint32_t tp_rank, uint32_t layers, uint32_t bytes)
{
	memset(l, 0, sizeof(*l));
	snprintf(l->model, sizeof(l->model), "%s", model);
	l->kind = kind;
	l->tokens_per_page = tpp;
	l->tp_size = tp_size;
	l->tp_rank = tp_rank;
	harness_layout_add(l, "kv", layers, bytes);
}

void harness_layout_add(struct kvb_layout *l, const char *name, uint32_t layers, uint32_t bytes)
{
	struct kvb_component *c;

	CHECK(l->ncomponents < KVB_MAX_COMPONENTS);
	c = &l->comp[l->ncomponents++];
	memset(c, 0, sizeof(*c));
	snprintf(c->name, sizeof(c->name), "%s", name);
	c->num_layers = layers;
	c->bytes_per_token_layer = bytes;
}

/* ---- processes ---- */

pid_t harness_fork(int (*fn)(int idx, void *arg), int idx, void *arg)
{
	pid_t parent = getpid(), pid;

	fflush(stdout);
	fflush(stderr);
	pid = fork();
	CHECKF(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		int rc;

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(H_FAIL);
		/* The parent's handlers stop the broker; a child must just die. */
		signal(SIGTERM, SIG_DFL);
		signal(SIGINT, SIG_DFL);
		signal(SIGALRM, SIG_DFL);
		rc = fn(idx, arg);
		fflush(stdout);
		fflush(stderr);
		_exit(rc);
	}
	return pid;
}

int harness_wait(const pid_t *pids, int n, int timeout_ms, int *status)
{
	uint64_t end = harness_now_ms() + (uint64_t)timeout_ms;
	int left = n, failed = 0, st[256];
	char done[256] = {0};

	CHECK(n <= 256);
	while (left) {
		for (int i = 0; i < n; i++) {
			int s;

			if (done[i] || waitpid(pids[i], &s, WNOHANG) != pids[i])
				continue;
			done[i] = 1;
			left--;
			st[i] = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
		}
		if (!left)
			break;
		if (harness_now_ms() >= end) {
			for (int i = 0; i < n; i++) {
				if (done[i])
					continue;
				if (our_child(pids[i]))
					kill(pids[i], SIGKILL);
				waitpid(pids[i], NULL, 0);
				done[i] = 1;
				st[i] = -1;
			}
			break;
		}
		sleep_ms(2);
	}
	for (int i = 0; i < n; i++) {
		if (status)
			status[i] = st[i];
		if (st[i] == 0)
			continue;
		failed++;
		if (st[i] < 0)
			printf("child %d (pid %d) still running after %d ms: killed\n", i,
			       (int)pids[i], timeout_ms);
		else if (st[i] > 128)
			printf("child %d (pid %d) died of signal %d\n", i, (int)pids[i],
			       st[i] - 128);
		else
			printf("child %d (pid %d) exited with %d\n", i, (int)pids[i], st[i]);
	}
	return failed;
}

int harness_run_children(int n, int (*fn)(int idx, void *arg), void *arg, int timeout_ms)
{
	pid_t pids[256];

	CHECK(n <= 256);
	for (int i = 0; i < n; i++)
		pids[i] = harness_fork(fn, i, arg);
	return harness_wait(pids, n, timeout_ms, NULL);
}

void *harness_shared(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	CHECKF(p != MAP_FAILED, "mmap shared %zu: %s", len, strerror(errno));
	return p;
}

void harness_gate_init(struct harness_gate *g)
{
	CHECKF(pipe2(g->fd, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
}

void harness_gate_open(struct harness_gate *g, int n)
{
	char buf[256];

	memset(buf, 'g', sizeof(buf));
	while (n > 0) {
		ssize_t w = write(g->fd[1], buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf));

		CHECKF(w > 0, "gate write: %s", strerror(errno));
		n -= (int)w;
	}
}

void harness_gate_wait(struct harness_gate *g, int timeout_ms)
{
	struct pollfd p = {.fd = g->fd[0], .events = POLLIN};
	uint64_t end = harness_now_ms() + (uint64_t)timeout_ms;
	char c;

	/* Several processes may race for the one byte: poll, then a non-blocking read. */
	for (;;) {
		int left = (int)(end - harness_now_ms());
		int flags;
		ssize_t r;

		if ((int64_t)(end - harness_now_ms()) <= 0)
			harness_fail(__FILE__, __LINE__, "gate not opened within %d ms",
				     timeout_ms);
		if (poll(&p, 1, left) <= 0)
			continue;
		flags = fcntl(g->fd[0], F_GETFL);
		fcntl(g->fd[0], F_SETFL, flags | O_NONBLOCK);
		r = read(g->fd[0], &c, 1);
		fcntl(g->fd[0], F_SETFL, flags);
		if (r == 1)
			return;
	}
}

/* ---- the raw protocol client ---- */

static int raw_recv(struct harness_raw *r, void *buf, size_t len, int *fds, int *nfds,
		    int timeout_ms)
{
	union {
		char b[CMSG_SPACE(sizeof(int) * KVB_MAX_FDS)];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = ctl.b,
			    .msg_controllen = sizeof(ctl.b)};
	struct pollfd p = {.fd = r->sock, .events = POLLIN};
	ssize_t n;

	*nfds = 0;
	if (poll(&p, 1, timeout_ms) == 0)
		return -ETIMEDOUT;
	n = recvmsg(r->sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0)
		return -errno;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (fds && *nfds < (int)KVB_MAX_FDS)
				fds[(*nfds)++] = fd;
			else
				close(fd);
		}
	}
	if (n == 0)
		return -ECONNRESET;
	if (mh.msg_flags & MSG_TRUNC)
		return -EMSGSIZE;
	return (int)n;
}

static int raw_send_msg(struct harness_raw *r, uint16_t type, const void *body, size_t len, int fd)
{
	static char buf[KVB_MSG_MAX];
	struct kvb_msg_hdr h = {.magic = KVB_MSG_MAGIC,
				.type = type,
				.len = (uint32_t)(sizeof(h) + len),
				.seq = ++r->seq};
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {.iov_base = buf, .iov_len = sizeof(h) + len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

	if (sizeof(h) + len > sizeof(buf))
		return -EMSGSIZE;
	memcpy(buf, &h, sizeof(h));
	if (len)
		memcpy(buf + sizeof(h), body, len);
	if (fd >= 0) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.b;
		mh.msg_controllen = sizeof(ctl.b);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	if (sendmsg(r->sock, &mh, MSG_NOSIGNAL) < 0)
		return -errno;
	return 0;
}

int harness_raw_send(struct harness_raw *r, const void *buf, size_t len)
{
	return send(r->sock, buf, len, MSG_NOSIGNAL) < 0 ? -errno : 0;
}

/* Receives the reply to request seq of type; returns res, body (after the reply) in out. */
static int raw_reply(struct harness_raw *r, uint16_t type, void *out, size_t out_max,
		     size_t *out_len, int *fds, int *nfds)
{
	static char buf[KVB_MSG_MAX];
	struct kvb_msg_hdr h;
	struct kvb_msg_reply rep;
	int n, err;

	n = raw_recv(r, buf, sizeof(buf), fds, nfds, 5000);
	if (n < 0)
		return n;
	err = kvb_msg_check(buf, (size_t)n);
	if (err) {
		printf("raw client: malformed reply (%d bytes): %d\n", n, err);
		return -EBADMSG;
	}
	memcpy(&h, buf, sizeof(h));
	if (!(h.flags & KVB_MSGF_REPLY) || h.type != type || h.seq != r->seq) {
		printf("raw client: unexpected reply type %u flags %u seq %u (want %u, %u)\n",
		       h.type, h.flags, h.seq, type, r->seq);
		return -EBADMSG;
	}
	memcpy(&rep, buf + sizeof(h), sizeof(rep));
	n -= (int)(sizeof(h) + sizeof(rep));
	if (out_len)
		*out_len = (size_t)n;
	if (out)
		memcpy(out, buf + sizeof(h) + sizeof(rep),
		       (size_t)n < out_max ? (size_t)n : out_max);
	return rep.res;
}

int harness_raw_call(struct harness_raw *r, uint16_t type, const void *body, size_t len, int fd,
		     void *reply, size_t reply_max)
{
	int fds[KVB_MAX_FDS], nfds, res;

	res = raw_send_msg(r, type, body, len, fd);
	if (res)
		return res;
	res = raw_reply(r, type, reply, reply_max, NULL, fds, &nfds);
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	return res;
}

static void *map_fd(int fd, uint64_t size, int prot)
{
	struct stat st;
	void *p;

	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < size || size == 0)
		return NULL;
	p = mmap(NULL, size, prot, MAP_SHARED, fd, 0);
	return p == MAP_FAILED ? NULL : p;
}

int harness_raw_hello(struct harness_raw *r, const char *sock, uint16_t abi_major,
		      uint32_t sq_entries)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct kvb_msg_hello hello = {
		.abi_major = abi_major, .abi_minor = KVB_ABI_MINOR, .sq_entries = sq_entries};
	struct kvb_msg_hello_reply hr;
	size_t got = 0;
	int fds[KVB_MAX_FDS], nfds = 0, res;
	char *region;

	memset(r, 0, sizeof(*r));
	r->sock = r->sq_efd = r->cq_efd = -1;
	snprintf(hello.name, sizeof(hello.name), "raw-%d", (int)getpid());
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	r->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (r->sock < 0)
		return -errno;
	if (connect(r->sock, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return -errno;
	res = raw_send_msg(r, KVB_MSG_HELLO, &hello, sizeof(hello), -1);
	if (res)
		return res;
	memset(&hr, 0, sizeof(hr));
	res = raw_reply(r, KVB_MSG_HELLO, &hr, sizeof(hr), &got, fds, &nfds);
	if (res < 0) {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		return res;
	}
	if (got < offsetof(struct kvb_msg_hello_reply, arenas) || hr.narenas == 0 ||
	    hr.narenas > KVB_MAX_ARENAS || nfds != 3 + (int)hr.narenas) {
		printf("raw client: bad HELLO reply: %zu bytes, %u arenas, %d fds\n", got,
		       hr.narenas, nfds);
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		return -EBADMSG;
	}
	r->client_id = hr.client_id;
	r->sq_efd = fds[1];
	r->cq_efd = fds[2];
	r->region = map_fd(fds[0], hr.region_size, PROT_READ | PROT_WRITE);
	r->region_size = (size_t)hr.region_size;
	close(fds[0]);
	for (uint32_t i = 0; i < hr.narenas; i++) {
		r->arena[i] = map_fd(fds[3 + i], hr.arenas[i].size, PROT_READ);
		r->arena_size[i] = hr.arenas[i].size;
		close(fds[3 + i]);
		if (!r->arena[i])
			return -EBADMSG;
		r->narenas = i + 1;
	}
	if (!r->region)
		return -EBADMSG;
	memcpy(&r->hdr, r->region, sizeof(r->hdr));
	res = kvb_region_check(&r->hdr, r->region_size);
	if (res)
		return res;
	region = r->region;
	kvb_ring_init(&r->sq, (kvb_atomic_u32 *)(region + r->hdr.sq_head_off),
		      (kvb_atomic_u32 *)(region + r->hdr.sq_tail_off),
		      (kvb_atomic_u32 *)(region + r->hdr.sq_flags_off), region + r->hdr.sqes_off,
		      r->hdr.sq_entries, sizeof(struct kvb_sqe), 1);
	kvb_ring_init(&r->cq, (kvb_atomic_u32 *)(region + r->hdr.cq_head_off),
		      (kvb_atomic_u32 *)(region + r->hdr.cq_tail_off),
		      (kvb_atomic_u32 *)(region + r->hdr.cq_flags_off), region + r->hdr.cqes_off,
		      r->hdr.cq_entries, sizeof(struct kvb_cqe), 0);
	return 0;
}

int harness_raw_ns_open(struct harness_raw *r, const struct kvb_layout *l, uint32_t *ns,
			uint64_t *page_bytes)
{
	struct kvb_msg_ns_reply rep = {0};
	int res = harness_raw_call(r, KVB_MSG_NS_OPEN, l, sizeof(*l), -1, &rep, sizeof(rep));

	if (res >= 0) {
		*ns = rep.ns;
		if (page_bytes)
			*page_bytes = rep.page_bytes;
	}
	return res;
}

int harness_raw_buf_reg(struct harness_raw *r, size_t len, uint32_t *buf, void **map)
{
	struct kvb_msg_buf_reg req = {.len = len, .kind = KVB_BUF_HOST};
	struct kvb_msg_id rep = {0};
	int fd, res;
	void *p;

	fd = memfd_create("kvbt-raw-buf", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)len) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
		res = -errno;
		close(fd);
		return res;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		res = -errno;
		close(fd);
		return res;
	}
	res = harness_raw_call(r, KVB_MSG_BUF_REG, &req, sizeof(req), fd, &rep, sizeof(rep));
	close(fd);
	if (res < 0) {
		munmap(p, len);
		return res;
	}
	*buf = rep.id;
	*map = p;
	return res;
}

void harness_raw_doorbell(struct harness_raw *r)
{
	uint64_t one = 1;

	if (write(r->sq_efd, &one, sizeof(one)) != sizeof(one))
		printf("raw client: doorbell write: %s\n", strerror(errno));
}

int harness_raw_submit(struct harness_raw *r, const struct kvb_sqe *sqes, uint32_t n)
{
	int64_t space = kvb_ring_space(&r->sq);

	if (space < 0)
		return -EPROTO;
	if (n > space)
		n = (uint32_t)space;
	for (uint32_t i = 0; i < n; i++)
		memcpy(kvb_ring_prod_slot(&r->sq, i), &sqes[i], sizeof(sqes[i]));
	kvb_ring_publish(&r->sq, n);
	if (kvb_ring_needs_wakeup(&r->sq, KVB_SQ_NEED_WAKEUP))
		harness_raw_doorbell(r);
	return (int)n;
}

int harness_raw_reap(struct harness_raw *r, struct kvb_cqe *out, uint32_t max, uint32_t min,
		     int timeout_ms)
{
	uint64_t end = harness_now_ms() + (uint64_t)timeout_ms;
	uint32_t got = 0;

	for (;;) {
		int64_t avail = kvb_ring_avail(&r->cq);

		if (avail < 0)
			return -EPROTO;
		if (avail > max - got)
			avail = max - got;
		for (uint32_t i = 0; i < avail; i++)
			memcpy(&out[got + i], kvb_ring_cons_slot(&r->cq, i), sizeof(*out));
		kvb_ring_consume(&r->cq, (uint32_t)avail);
		got += (uint32_t)avail;
		if (got >= min || got == max || harness_now_ms() >= end)
			return (int)got;
		sleep_ms(1);
	}
}

kvb_atomic_u32 *harness_raw_word(struct harness_raw *r, uint32_t off)
{
	return (kvb_atomic_u32 *)((char *)r->region + off);
}

int harness_raw_hung_up(struct harness_raw *r, int timeout_ms)
{
	uint64_t end = harness_now_ms() + (uint64_t)timeout_ms;

	for (;;) {
		struct pollfd p = {.fd = r->sock, .events = POLLIN | POLLRDHUP};
		int left = (int)(end - harness_now_ms());
		char buf[256];

		if ((int64_t)(end - harness_now_ms()) < 0)
			return 0;
		if (poll(&p, 1, left) <= 0)
			continue;
		if (p.revents & (POLLHUP | POLLRDHUP | POLLERR))
			return 1;
		/* A stray message: drain it and keep waiting for the hang-up. */
		if (recv(r->sock, buf, sizeof(buf), MSG_DONTWAIT) == 0)
			return 1;
	}
}

void harness_raw_close(struct harness_raw *r)
{
	if (r->region)
		munmap(r->region, r->region_size);
	for (uint32_t i = 0; i < r->narenas; i++)
		if (r->arena[i])
			munmap((void *)(uintptr_t)r->arena[i], r->arena_size[i]);
	if (r->sock >= 0)
		close(r->sock);
	if (r->sq_efd >= 0)
		close(r->sq_efd);
	if (r->cq_efd >= 0)
		close(r->cq_efd);
	memset(r, 0, sizeof(*r));
	r->sock = r->sq_efd = r->cq_efd = -1;
}
