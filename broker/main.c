// SPDX-License-Identifier: MIT
/*
 * main.c - kvbrokerd: its settings (options.c), then start-up in dependency order (lock, pool,
 * store, socket, loop) and
 * a clean shutdown on SIGTERM/SIGINT. Start-up refuses to run twice on the same socket (the
 * lock file, instance.c) or on a socket another broker answers on, and a new pool larger than
 * the machine can give it (pool_fits, memcap.c); a stale socket file from a crash is replaced.
 */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "broker.h"
#include "cli.h"
#include "instance.h"
#include "keeper.h"
#include "watch.h"
#include "orphan.h"
#include "sdnotify.h"
#include "copy_cuda.h"
#include "log.h"
#include "memcap.h"
#include "plan.h"
#include "parse.h"
#include "size.h"
#include "proto.h"
#include "metrics_http.h"
#include "options.h"
#include "text.h"

/* The signalfd is readable: SIGHUP is a no-op, the others stop the loop. */
static void on_signal(void *arg)
{
	struct broker *b = arg;
	struct signalfd_siginfo si;

	while (read(b->sigfd, &si, sizeof(si)) == sizeof(si)) {
		if (si.ssi_signo == SIGHUP) {
			log_info("SIGHUP: logs go to stderr, nothing to reopen");
			continue;
		}
		if (si.ssi_signo == SIGUSR2) {
			if (!b->keeper && !b->fdstore) {
				log_warn("SIGUSR2 from pid %u: no keeper holds the pool "
					 "(--no-pool-keep): nothing to hand over, running on",
					 si.ssi_pid);
				continue;
			}
			/* [handover] Exit keeping the pool: the keeper (or systemd's fd
			 * store) passes it on. */
			log_info("SIGUSR2 from pid %u: handing the pool over", si.ssi_pid);
			b->handover = 1;
			b->loop.stop = 1;
			continue;
		}
		log_info("signal %u from pid %u: draining and exiting", si.ssi_signo, si.ssi_pid);
		b->loop.stop = 1;
	}
}

/*
 * A ring client costs 6 fds (socket, pidfd, two doorbells, its record's region and ledger), any
 * connection 2: with the usual soft limit of 1024, some 170 clients would attach whatever
 * --max-clients says, and the rest would be refused. Raise the soft limit to what --max-clients
 * needs, up to the hard limit, and say so when even that is short (t_rel_overload: fd_limit).
 */
static void raise_nofile(uint32_t max_clients, uint32_t max_control)
{
	/* [records] ... and 2 more for its record (orphan.c) */
	rlim_t want = ((rlim_t)max_clients + max_control + CONN_SPARE) * 6 + 64;
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= want)
		return;
	rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur < want)
		log_warn("fd limit %llu: fewer than --max-clients %u clients can attach (raise "
			 "the hard limit, ulimit -Hn)",
			 (unsigned long long)rl.rlim_cur, max_clients);
}

static int setup_signals(void)
{
	sigset_t set;

	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigaddset(&set, SIGUSR2);
	if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
		return -errno;
	return signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
}

/*
 * Refuses a new pool larger than the machine can give the broker (memcap.c), before any arena
 * exists: past it, the prefault ends in the OOM killer with nothing in the log. With
 * --pool-overcommit a warning instead. Only a new pool: an adopted one is in memory already.
 * 0 or -ENOMEM (said in the log).
 */
static int pool_fits(struct broker *b, const struct pool_cfg *pc)
{
	struct numa_plan plan[POOL_MAX_PARTS];
	struct numa_topo topo;
	struct memcap_need need;
	struct memcap m;
	char size[32], can[32], why[1024], what[192], fix[160];
	int sized = strchr(pc->numa, ':') != NULL, n;
	double t0 = clock_now(), grew = t0;
	uint64_t max, best = 0;

	numa_topo_probe(&topo);
	/* [tenant-lend] Sparse partitions hold the pool's size in all, whatever their arenas. */
	n = pool_plan(pc->sparse ? &(struct pool_cfg){.size = pc->size, .numa = pc->numa} : pc,
		      &topo, plan);
	if (n < 0)
		return 0; /* pool_create says what is wrong with --numa */
	for (int first = 1;; first = 0) {
		struct timespec ts = {0, 50000000};

		memcap_probe(memcap_root(), &m);
		memcap_need(&m, pc->hugepage, plan, (uint32_t)n, &need);
		max = memcap_max_pool(&m, &need);
		if (need.total <= max || !b->freed_kept || b->cfg.pool_overcommit)
			break;
		/*
		 * [keep] A kept pool freed just before (adopt_kept) comes back to the machine only
		 * as its holder lets go: the keeper exits after it answers, systemd closes the fds
		 * after FDSTOREREMOVE, and the kernel frees a big pool's pages over seconds. So look
		 * again while the room still grows; once it stops for half a second, that is all.
		 */
		if (first || max > best) {
			best = max;
			grew = clock_now();
		}
		if (clock_now() - grew > 0.5 || clock_now() - t0 > 60)
			break;
		nanosleep(&ts, NULL);
	}
	memcap_explain(&m, &need, max, why, sizeof(why));
	text_bytes((double)need.total, size, sizeof(size));
	text_bytes((double)max, can, sizeof(can));
	if (sized)
		snprintf(what, sizeof(what), "--numa %s (%s in all)", pc->numa, size);
	else
		snprintf(what, sizeof(what), "--pool %s", size);
	if (need.total <= max) {
		log_info("pool: %s fits: this machine can give the broker %s (%s)", size,
			 max == MEMCAP_NONE ? "what it asks (no limit found)" : can, why);
		return 0;
	}
	if (max >= (1ull << 30))
		snprintf(fix, sizeof(fix), "use %s%lluG or less",
			 sized ? "--numa sizes adding up to " : "--pool ",
			 (unsigned long long)(max >> 30));
	else if (max >= (2ull << 20))
		snprintf(fix, sizeof(fix), "use %s%lluM or less",
			 sized ? "--numa sizes adding up to " : "--pool ",
			 (unsigned long long)(max >> 20));
	else
		snprintf(fix, sizeof(fix), "free memory first");
	if (b->cfg.pool_overcommit) {
		log_warn("%s: this machine can give the broker %s (%s): starting anyway "
			 "(--pool-overcommit)",
			 what, can, why);
		return 0;
	}
	log_error("%s: this machine can give the broker %s (%s): %s, or --pool-overcommit if you "
		  "know better",
		  what, can, why, fix);
	return -ENOMEM;
}

/*
 * Start-up phases, each timed into the log and the stats ("startup"): reserve (arenas created,
 * bound, sealed), prefault (parallel, per node), pin (the copy engines start, and a CUDA engine
 * registers the pool with the driver: xfer_init in main), then the socket listens (ready).
 * Nobody can attach before.
 */
static int start_pool(struct broker *b)
{
	struct pool_cfg pc = {.name = b->cfg.pool_name + 1,
			      .size = b->cfg.pool_bytes,
			      .numa = b->cfg.numa,
			      .hugepage = b->cfg.hugepage,
			      .prefault = b->cfg.prefault,
			      .keep = b->cfg.keep,
			      .dir = b->cfg.dir,
			      .slab_bytes = b->cfg.slab_bytes};
	double t = clock_now();
	int err = tenant_plan(&b->cfg.tenants, b->cfg.pool_bytes, &pc, &b->tt);

	if (!err && pc.sparse && (pc.hugepage == HP_MODE_2M || pc.hugepage == HP_MODE_1G)) {
		/* [tenant-lend] */
		log_error(
			"--hugepages %s with --tenants %s: tenant partitions lend their memory "
			"a slab at a time and give it back by punching holes, which hugetlb pages "
			"cannot do; use --hugepages auto or off",
			hugepage_name(pc.hugepage == HP_MODE_2M ? HP_2M : HP_1G),
			tenant_mode_name(b->cfg.tenants.mode));
		return -EINVAL;
	}
	if (!err)
		err = pool_fits(b, &pc);
	if (err)
		return err;
	err = pool_create(&b->pool, &pc);
	b->startup.reserve_s = clock_now() - t;
	if (!err && b->cfg.tenants.mode != TENANTS_NONE)
		log_info("tenants by %s: %u partitions", tenant_mode_name(b->cfg.tenants.mode),
			 b->pool.nparts);
	if (err) {
		log_error("pool (%llu MiB, --numa %s): %s%s", (unsigned long long)(pc.size >> 20),
			  pc.numa, strerror(-err),
			  err == -ENODEV   ? ": a listed node has no memory (see numactl -H)"
			  : err == -EINVAL ? ": bad --numa list"
			  : err == -ENOMEM ? ": the machine cannot hold the pool"
					   : "");
		return err;
	}
	log_info("pool: reserved %llu MiB in %u arena(s) in %.3f s",
		 (unsigned long long)(b->pool.total >> 20), b->pool.narenas, b->startup.reserve_s);
	if (b->cfg.hugepage == HP_MODE_COLLAPSE && !b->cfg.prefault)
		log_warn("pool: --hugepages collapse works at the prefault: with --no-prefault the "
			 "pool stays on 4 KiB pages");
	if (b->cfg.prefault && !b->pool.sparse) { /* [tenant-lend] sparse: slab by slab */
		t = clock_now();
		err = pool_prefault(&b->pool);
		b->startup.prefault_s = clock_now() - t;
		if (err) {
			log_error("pool: prefault: %s: the machine cannot hold the pool",
				  strerror(-err));
			return err;
		}
		log_info("pool: prefaulted %llu MiB in %.3f s (%.2f GiB/s)",
			 (unsigned long long)(b->pool.total >> 20), b->startup.prefault_s,
			 (double)b->pool.total / (1 << 30) / (b->startup.prefault_s + 1e-9));
	}
	return 0;
}

/* [keep] Lets go of a pool we were handed and will not use: who holds it frees it. */
static void drop_kept(struct broker *b, int fdstore, uint32_t nfds)
{
	b->freed_kept = 1; /* its memory comes back soon after (pool_fits) */
	if (fdstore)
		sdn_remove_pool(nfds ? nfds - 1 : 0);
	else
		keeper_release(&b->kl, 1);
}

/*
 * [owner] A live broker owns the pool kept for our socket: we must not start, whatever the
 * files say. Returns -EBUSY for main to exit with.
 */
static int owned_elsewhere(struct broker *b, pid_t owner)
{
	log_error("socket %s: its pool belongs to kvbrokerd pid %d, which runs (its socket or lock "
		  "file was removed or replaced meanwhile; it makes them again within a second): "
		  "not starting a second broker on one pool. Stop pid %d first, or replace it "
		  "with kvbrokerd --takeover",
		  b->cfg.socket_path, (int)owner, (int)owner);
	return -EBUSY;
}

/*
 * [owner] The keeper's fds, the pool's ownership with them. Under --takeover a broker that owns
 * the pool but holds no lock (its lock file was removed) is asked to hand it over, as one that
 * holds the lock is (main). A keeper of an earlier version knows no owner: it is retired once
 * we have its fds, and keep_pool starts one of ours.
 */
static int fetch_kept(struct broker *b, int *fds)
{
	double t0 = clock_now();
	int n = keeper_fetch(b->cfg.socket_path, fds, KEEPER_MAX_FDS, &b->kl);
	pid_t owner = b->kl.pid, none;

	if (n == -EBUSY && b->cfg.takeover && owner > 0) {
		log_info("takeover: asking kvbrokerd pid %d, which owns the pool, to hand it over",
			 (int)owner);
		if (kill(owner, SIGUSR2) < 0)
			log_warn("takeover: pid %d: %s", (int)owner, strerror(errno));
		while (n == -EBUSY && clock_now() - t0 < 60)
			n = keeper_fetch(b->cfg.socket_path, fds, KEEPER_MAX_FDS, &b->kl);
		owner = b->kl.pid;
	}
	if (n == -EBUSY)
		return owned_elsewhere(b, owner);
	if (n > 0 && b->kl.fd < 0 && keeper_free(b->cfg.socket_path, &none) == 0)
		log_info("adopt: retired a keeper of an earlier version: ours replaces it");
	return n;
}

/*
 * [keep] The pool kept for this socket, adopted (1), none (0: start cold), or -EBUSY: a live
 * broker owns it (keeper.c [owner]; its files were removed, or it was started outside this
 * unit), and we must not start. A pool that cannot be adopted (another slab size, a damaged
 * side table) is freed: the flags changed, so the operator asked for a new one.
 *
 * [fdstore] Precedence: fds systemd passed back (LISTEN_FDS, sdnotify.c) first, then a keeper.
 * The service manager outlives every broker and hands its store back on each start of the
 * unit, so under systemd it is the record of the pool; a keeper that also answers can only be
 * left from a run outside the unit (or before an upgrade to the fd store) and is freed, so that
 * one pool, not two, stays pinned in RAM. A keeper's pool adopted under a manager that has a
 * store moves into the store (keep_pool), and the keeper is retired.
 */
static int adopt_kept(struct broker *b)
{
	int fds[KEEPER_MAX_FDS], n = sdn_listen_pool(fds, KEEPER_MAX_FDS), err, fdstore = n > 0;
	const char *from = fdstore ? "systemd's fd store" : "the keeper";
	double t = clock_now();
	pid_t owner;

	if (fdstore) {
		err = keeper_free(b->cfg.socket_path, &owner);
		if (!err)
			log_warn("a keeper also held a pool for %s: freed it (systemd's fd store "
				 "has precedence)",
				 b->cfg.socket_path);
		if (err == -EBUSY)
			return owned_elsewhere(b, owner);
	} else {
		n = fetch_kept(b, fds);
		if (n == -EBUSY)
			return -EBUSY;
	}
	if (n == -ENOENT || n == 0)
		return 0;
	if (n < 0) {
		log_warn("keeper of %s: %s: starting with a new pool", b->cfg.socket_path,
			 strerror(-n));
		return 0;
	}
	if (!b->cfg.keep) {
		log_info("--no-pool-keep: freeing the pool a previous broker left (%s)", from);
		for (int i = 0; i < n; i++)
			close(fds[i]);
		drop_kept(b, fdstore, (uint32_t)n);
		return 0;
	}
	err = pool_adopt(&b->pool, fds, (uint32_t)n, b->cfg.slab_bytes);
	if (err) {
		log_warn("the pool from %s (socket %s) cannot be adopted (%s%s): freeing it, "
			 "starting with a new pool",
			 from, b->cfg.socket_path, strerror(-err),
			 err == -EXDEV	  ? ": another --slab size"
			 : err == -EINVAL ? ": the fds are not the side table and arenas it "
					    "describes"
					  : "");
		drop_kept(b, fdstore, (uint32_t)n);
		return 0;
	}
	/* [tenant-part] The partitions come with the pool; --tenants must cut the same number. */
	{
		struct pool_cfg pc = {.size = b->cfg.pool_bytes};

		err = tenant_plan(&b->cfg.tenants, b->cfg.pool_bytes, &pc, &b->tt);
		if (err) {
			pool_close(&b->pool);
			return 0; /* start_pool says what is wrong */
		}
		if (b->tt.n != b->pool.nparts || pc.sparse != b->pool.sparse) {
			log_warn("the pool from %s (socket %s) has %u tenant partition(s), "
				 "--tenants wants %u: freeing it, starting with a new pool",
				 from, b->cfg.socket_path, b->pool.nparts, b->tt.n);
			pool_close(&b->pool);
			drop_kept(b, fdstore, (uint32_t)n);
			return 0;
		}
		log_info("adopt: %u arena(s) in %u tenant partition(s), from %s", b->pool.narenas,
			 b->pool.nparts, from);
	}
	b->startup.reserve_s = clock_now() - t;
	if (b->pool.total != b->cfg.pool_bytes)
		log_info("adopt: the kept pool is %llu MiB in %u arena(s) (--pool says %llu MiB): "
			 "kept as it is; --free-pool (or a clean stop) then a start resizes it",
			 (unsigned long long)(b->pool.total >> 20), b->pool.narenas,
			 (unsigned long long)(b->cfg.pool_bytes >> 20));
	b->keeper = !fdstore && b->kl.fd >= 0;
	b->fdstore = fdstore; /* the store still holds these fds: nothing to send again */
	return 1;
}

/*
 * [keep] Has the pool kept for the next broker: in systemd's fd store when the unit has one
 * ($FDSTORE large enough: FileDescriptorStoreMax=), else by a keeper process. Before any other
 * thread exists (keeper_spawn forks). A keeper's pool adopted under such a unit moves into the
 * store: the keeper is then told to exit.
 */
static void keep_pool(struct broker *b)
{
	int fds[KEEPER_MAX_FDS], err;
	uint32_t n = pool_handover_fds(&b->pool, fds);

	if (b->fdstore || !n)
		return;
	/* [records] Room for the pool and three fds for every client's record (orphan.c). */
	if (sdn_fdstore_ok(n + KEEPER_REC_FDS * (b->cfg.max_clients + b->cfg.max_control))) {
		err = sdn_store_pool(fds, n);
		if (!err) {
			log_info("pool kept in systemd's fd store (%u fds): no keeper", n);
			b->fdstore = 1;
			if (b->keeper && !keeper_release(&b->kl, 1))
				log_info("pool keeper retired: systemd's fd store holds the pool");
			b->keeper = 0;
			return;
		}
		log_warn("FDSTORE=1 on $NOTIFY_SOCKET: %s: a keeper keeps the pool instead",
			 strerror(-err));
	} else if (sdn_enabled() && !b->keeper) {
		log_info("$NOTIFY_SOCKET without $FDSTORE >= %u (FileDescriptorStoreMax=, systemd "
			 ">= 254): a keeper keeps the pool",
			 n);
	}
	if (b->keeper)
		return;
	err = keeper_spawn(b->cfg.socket_path, fds, n, &b->kl);
	if (err)
		log_warn("pool keeper: %s: the pool will not survive a crash", strerror(-err));
	b->keeper = !err;
}

/* kvbrokerd --free-pool: what --help promises. */
static int free_pool(struct broker *b)
{
	pid_t owner;
	int fd = instance_lock(b->cfg.socket_path, &owner), err;

	if (fd < 0) {
		log_error("socket %s: %s%s (pid %d): stop it instead, a clean stop frees its pool",
			  b->cfg.socket_path, strerror(-fd),
			  fd == -EBUSY ? ": a live kvbrokerd owns it" : "", (int)owner);
		return 1;
	}
	err = keeper_free(b->cfg.socket_path, &owner);
	if (err == -EBUSY)
		log_error("the pool kept for %s belongs to kvbrokerd pid %d, which runs (its lock "
			  "file was removed): stop it instead, a clean stop frees its pool",
			  b->cfg.socket_path, (int)owner);
	else if (err)
		log_error("no pool is kept for %s (%s)", b->cfg.socket_path, strerror(-err));
	else
		log_info("freed the pool kept for %s", b->cfg.socket_path);
	instance_unlock(b->cfg.socket_path, fd);
	return err ? 1 : 0;
}

/*
 * The socket's directory may not be made or written by this uid: most often a user without
 * root starting a broker on the default socket, in /run. Say what to do instead.
 */
static void socket_denied(const char *sock)
{
	log_error("socket %s: permission denied creating it, its lock file or its directory: run "
		  "as root (%s, the default, is in /run), or give --socket a path in a directory "
		  "you may write, e.g. --socket $XDG_RUNTIME_DIR/kvbroker.sock, and clients the "
		  "same path (KVB_SOCKET=PATH, kvbctl --socket PATH)",
		  sock, KVB_SOCKET_DEFAULT);
}

int main(int argc, char **argv)
{
	static struct broker b;
	struct loop_hooks hooks;
	struct list *pos, *tmp;
	pid_t owner;
	double t;
	int err, made_dir;

	if (argc == 4 && !strcmp(argv[1], "--keeper")) /* PATH: for ps; it asks its socket */
		return keeper_main(atoi(argv[2]));
	err = options_parse(argc, argv, &b.cfg);
	if (err)
		return err > 0 ? 0 : CLI_USAGE;
	list_init(&b.sessions);
	list_init(&b.graveyard);
	list_init(&b.orphans);
	b.run_id = orphan_run_id();
	b.listen_fd = b.loop.epfd = b.sigfd = b.kl.fd = -1;
	b.start_time = clock_now();
	/*
	 * Not dumpable: processes of our uid can then neither ptrace us nor reopen our fds through
	 * /proc/<pid>/fd, which would hand them a writable pool.
	 */
	prctl(PR_SET_DUMPABLE, 0);
	raise_nofile(b.cfg.max_clients, b.cfg.max_control);
	b.spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

	/* First, before any work: a second broker on this socket stops here. */
	err = instance_dir(b.cfg.socket_path, b.cfg.has_group, b.cfg.group);
	if (err < 0) {
		if (err == -EACCES || err == -EPERM)
			socket_denied(b.cfg.socket_path);
		else
			log_error("socket directory of %s: %s", b.cfg.socket_path, strerror(-err));
		return 1;
	}
	made_dir = err;
	b.lock_fd = instance_lock(b.cfg.socket_path, &owner);
	/*
	 * A broker killed while it started a keeper leaves a copy of its lock's fd in that child
	 * until the child's exec closes it (t_rel_crash saw it once): a dead owner's lock is
	 * waited for, briefly.
	 */
	for (int i = 0;
	     b.lock_fd == -EBUSY && owner > 0 && i < 300 && kill(owner, 0) < 0 && errno == ESRCH;
	     i++) {
		struct timespec ts = {0, 10000000};

		if (!i)
			log_info("socket %s: the lock of pid %d, which is gone, is still held: "
				 "waiting up to 3 s",
				 b.cfg.socket_path, (int)owner);
		nanosleep(&ts, NULL);
		b.lock_fd = instance_lock(b.cfg.socket_path, &owner);
	}
	if (b.lock_fd == -EBUSY && b.cfg.takeover && owner > 0 && !b.cfg.free_pool) {
		/* [handover] The running broker drains and exits; its lock goes last. */
		double t0 = clock_now();

		log_info("takeover: asking kvbrokerd pid %d to hand its pool over", (int)owner);
		if (kill(owner, SIGUSR2) < 0)
			log_warn("takeover: pid %d: %s", (int)owner, strerror(errno));
		while (b.lock_fd == -EBUSY && clock_now() - t0 < 60) {
			struct timespec ts = {0, 1000000};

			nanosleep(&ts, NULL);
			b.lock_fd = instance_lock(b.cfg.socket_path, &owner);
		}
		b.handover_wait_s = clock_now() - t0;
		log_info("takeover: the old broker was gone after %.3f s", b.handover_wait_s);
	}
	if (b.lock_fd == -EACCES || b.lock_fd == -EPERM) {
		socket_denied(b.cfg.socket_path);
		return 1;
	}
	if (b.lock_fd < 0) {
		log_error("socket %s: %s%s (lock file %s.lock, pid %d)", b.cfg.socket_path,
			  strerror(-b.lock_fd),
			  b.lock_fd == -EBUSY ? ": another kvbrokerd owns it" : "",
			  b.cfg.socket_path, (int)owner);
		return 1;
	}
	if (b.cfg.free_pool) {
		instance_unlock(b.cfg.socket_path, b.lock_fd);
		return free_pool(&b);
	}
	err = adopt_kept(&b);
	if (err < 0)
		goto out_pool;
	(void)orphan_load(&b); /* [orphans] before keep_pool may retire the keeper */
	if (!err) {
		err = start_pool(&b);
		if (err)
			goto out_pool;
	}
	if (b.cfg.keep)
		keep_pool(&b);	    /* before any other thread exists (a keeper forks) */
	b.pool.no_dir = !b.cfg.dir; /* [dir] an adopted pool's directory is wiped, then unused */
	err = store_init(&b.store, &b.pool, b.cfg.slab_bytes, b.cfg.high_wm, b.cfg.low_wm);
	if (err) {
		log_error("store: %s", strerror(-err));
		goto out_pool;
	}
	ops_init(&b); /* after store_init: it hooks the store's page-wake */
	if (b.pool.adopted) {
		err = adopt_pool(&b);
		if (err) {
			log_error("adopt: %s", strerror(-err));
			goto out_store;
		}
	}
	/* [tenant-lend] Guarantees are of what the slabs may hold: the pool less directories. */
	if (b.pool.sparse) {
		b.tt.budget = 0;
		for (uint32_t i = 0; i < KVB_MAX_ARENAS; i++)
			b.tt.budget += b.pool.budget[i];
	}
	(void)tenant_guarantees(&b.tt, 0);
	tenant_apply(&b.tt, &b.pool, &b.store);
	b.sigfd = setup_signals();
	rounds_hooks(&b, &hooks);
	if (b.sigfd < 0 || loop_init(&b.loop, b.cfg.poll_us * 1e-6, &hooks)) {
		log_error("start-up: out of resources");
		err = -ENOMEM;
		goto out_store;
	}
	b.bg = bg_start(); /* NULL: clients' memory is unmapped inline, never populated */
	/* [pin] The copy engines start; a CUDA engine registers the pool with the driver. */
	t = clock_now();
	err = xfer_init(&b);
	b.startup.pin_s = clock_now() - t;
	if (err) {
		log_error("copy engines: %s", strerror(-err));
		goto out_store;
	}
	log_info("pool: pinned in %.3f s (%s)", b.startup.pin_s,
		 b.gpu ? "registered with CUDA" : "no GPU copy engine: nothing to pin");
	/* A warm restart scans the cache file here: clients are answered only after it. */
	if (b.cfg.disk.paths) {
		err = tier_open(&b, &b.cfg.disk);
		if (err) {
			log_error("disk tier: %s", strerror(-err));
			goto out_store;
		}
	}
	if (b.cfg.remote.url) {
		/* Connects without waiting: until the cluster answers, remote lookups miss. */
		err = remote_open(&b, &b.cfg.remote);
		if (err) {
			log_error("--remote %s: %s", b.cfg.remote.url, strerror(-err));
			goto out_store;
		}
	}
	b.listen_fd = instance_listen(b.cfg.socket_path, b.cfg.has_group, b.cfg.group);
	if (b.listen_fd < 0) {
		err = b.listen_fd;
		log_error("socket %s: %s%s", b.cfg.socket_path, strerror(-err),
			  err == -EADDRINUSE ? ": another kvbrokerd answers there" : "");
		goto out_store;
	}
	/* After setup_signals(): the HTTP thread inherits the blocked signals. */
	if (b.cfg.metrics_listen[0]) {
		err = metrics_http_start(b.cfg.metrics_listen, &b.metrics);
		if (err) {
			log_error("--metrics-listen %s: %s", b.cfg.metrics_listen, strerror(-err));
			goto out_sock;
		}
		snprintf(b.metrics_addr, sizeof(b.metrics_addr), "%s",
			 metrics_http_addr(b.metrics));
		log_info("metrics: http://%s/metrics", b.metrics_addr);
		metrics_http_tick(&b);
	}
	b.on_listen = (struct loop_fd){.fn = session_on_listen, .arg = &b};
	b.on_signal = (struct loop_fd){.fn = on_signal, .arg = &b};
	err = loop_add(&b.loop, b.listen_fd, &b.on_listen);
	if (!err)
		err = loop_add(&b.loop, b.sigfd, &b.on_signal);
	if (err)
		goto out_sock;
	watch_start(&b);
	orphan_start(&b); /* [orphans] what the previous broker's clients lease, watched */
	b.startup.ready_s = clock_now() - b.start_time;
	log_info("kvbrokerd %s ready in %.3f s (reserve %.3f s, prefault %.3f s, pin %.3f s): "
		 "socket %s, pool %s %llu MiB in %u arena(s), %u slabs of %llu MiB, "
		 "copy engine %s (%u threads) + %s, poll %u us",
		 KVB_VERSION_STRING, b.startup.ready_s, b.startup.reserve_s, b.startup.prefault_s,
		 b.startup.pin_s, b.cfg.socket_path, b.cfg.pool_name,
		 (unsigned long long)(b.pool.total >> 20), b.pool.narenas, b.store.nslabs,
		 (unsigned long long)(b.cfg.slab_bytes >> 20), b.copy->name, b.cfg.copy_threads,
		 b.gpu ? b.gpu->name : "no GPU", b.cfg.poll_us);
	/* [fdstore] Type=notify: systemd counts the broker started from here. */
	if (sdn_enabled()) {
		char msg[400];

		snprintf(msg, sizeof(msg),
			 "READY=1\nSTATUS=serving %s: pool %llu MiB in %u arena(s)%s, kept by %s",
			 b.cfg.socket_path, (unsigned long long)(b.pool.total >> 20),
			 b.pool.narenas, b.pool.adopted ? " (adopted)" : "",
			 b.fdstore  ? "systemd's fd store"
			 : b.keeper ? "a keeper process"
				    : "nobody (dies with the broker)");
		err = sdn_send(msg, NULL, 0);
		if (err)
			log_warn("READY=1 on $NOTIFY_SOCKET: %s", strerror(-err));
	}
	err = loop_run(&b.loop);
	if (sdn_enabled())
		sdn_send(b.handover ? "STOPPING=1\nSTATUS=handing the pool over"
				    : "STOPPING=1\nSTATUS=draining, then freeing the pool",
			 NULL, 0);
	list_for_each_safe (pos, tmp, &b.sessions)
		session_destroy(&b, list_entry(pos, struct session, link), NULL);
	xfer_fini(&b); /* in-flight copies finish, their dead sessions' counts drop to 0 */
	tier_close(&b, ops_poll); /* writes what is only in RAM, completes parked ops */
	remote_close(&b);	  /* requests in flight are cancelled: their pages abort */
	session_reap(&b);
	log_info("stopped: %llu puts, %llu gets, %llu dedup, %llu evictions",
		 (unsigned long long)b.ctr.puts, (unsigned long long)b.ctr.gets,
		 (unsigned long long)b.ctr.dedup, (unsigned long long)b.store.st.evictions);
out_sock:
	metrics_http_stop(b.metrics);
	close(b.listen_fd);
	if (instance_is(b.cfg.socket_path, -1, &b.watch.sock)) /* ours, not a successor's */
		unlink(b.cfg.socket_path);
out_store:
	orphan_fini(&b); /* [orphans] their pins; handed over, their records stay kept */
	remote_close(&b);
	loop_fini(&b.loop);
	if (b.sigfd >= 0)
		close(b.sigfd);
	xfer_fini(&b);
	ops_fini(&b);  /* after the last op completed */
	bg_stop(b.bg); /* after the last session: its unmaps are queued */
	if (b.spare_fd >= 0)
		close(b.spare_fd);
	ns_table_fini(&b.nst);
	store_fini(&b.store);
out_pool:
	/* [keep] A clean exit (or a failed start) frees the pool: only a crash or a hand-over
	 * leaves it. Our end of the keeper's connection closes before the lock goes: a
	 * successor that takes the lock finds the pool without an owner. */
	if (b.handover)
		log_info("handed over: the pool stays with its keeper for the next broker");
	if (b.handover || !b.keeper)
		keeper_release(&b.kl, 0);
	else if (keeper_release(&b.kl, 1))
		log_warn("pool keeper of %s did not answer: free it with --free-pool",
			 b.cfg.socket_path);
	if (!b.handover && b.fdstore)
		sdn_remove_pool(b.pool.narenas); /* [fdstore] FDSTOREREMOVE=1 of each */
	pool_close(&b.pool);
	instance_unlock(b.cfg.socket_path, b.lock_fd);
	if (err && made_dir)
		instance_dir_remove(b.cfg.socket_path);
	return err ? 1 : 0;
}
