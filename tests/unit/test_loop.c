// SPDX-License-Identifier: MIT
/*
 * test_loop.c - what wakes loop.c's busy-poll window after a sleep [told]. The loop runs in a
 * thread with hooks that count its rounds and find no work; once it sleeps, an event arrives:
 *   - on an fd registered as a doorbell of what the rounds poll (struct loop_fd .polled, an
 *     SQ's): the round after it finds nothing, and the loop sleeps again at once. It polled on
 *     for the whole window before, which a stream of notes sent on the SQ (a full note ring)
 *     paid with a fifth of a CPU;
 *   - on any other fd (a control socket): the window restarts, and the loop polls through it;
 *   - on the doorbell with work behind it: the window restarts too.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "loop.h"

#define WINDOW 0.05 /* s: long enough that rounds through it number in the thousands */

struct fake {
	struct loop l;
	struct loop_fd bell, ctl;
	int bell_fd, ctl_fd;
	uint32_t work;	 /* what the next poll reports */
	uint64_t polls;	 /* rounds */
	uint64_t sleeps; /* prepare_sleep calls */
	int quit;	 /* the next control event stops the loop (from its own thread) */
};

static uint64_t get(const uint64_t *v)
{
	return __atomic_load_n(v, __ATOMIC_ACQUIRE);
}

static uint32_t f_poll(void *arg)
{
	struct fake *f = arg;
	uint32_t w = __atomic_exchange_n(&f->work, 0, __ATOMIC_ACQ_REL);

	__atomic_add_fetch(&f->polls, 1, __ATOMIC_RELAXED);
	return w;
}

static int f_prepare_sleep(void *arg)
{
	struct fake *f = arg;

	__atomic_add_fetch(&f->sleeps, 1, __ATOMIC_RELAXED);
	return 1000000; /* microseconds */
}

static void f_wake(void *arg)
{
	(void)arg;
}

static void f_tick(void *arg, int slept)
{
	(void)arg;
	(void)slept;
}

static void drain(int fd)
{
	uint64_t v;

	(void)!read(fd, &v, sizeof(v));
}

static void on_bell(void *arg)
{
	drain(((struct fake *)arg)->bell_fd);
}

static void on_ctl(void *arg)
{
	struct fake *f = arg;

	drain(f->ctl_fd);
	if (__atomic_load_n(&f->quit, __ATOMIC_ACQUIRE))
		f->l.stop = 1;
}

static void *run(void *arg)
{
	struct fake *f = arg;

	return (void *)(intptr_t)loop_run(&f->l); /* asserted in the test's thread */
}

static void ring(int fd)
{
	uint64_t one = 1;

	assert_int_equal(write(fd, &one, sizeof(one)), sizeof(one));
}

static void sleep_s(double s)
{
	struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};

	nanosleep(&ts, NULL);
}

/* Waits until the loop is asleep: it went to sleep at least once, and no round ran for a while. */
static void asleep(struct fake *f)
{
	uint64_t p;

	for (int i = 0; i < 2000 && !get(&f->sleeps); i++)
		sleep_s(0.001);
	do {
		p = get(&f->polls);
		sleep_s(0.005);
	} while (get(&f->polls) != p);
}

/* Rounds the loop ran in the 20 ms after an event on fd, with work behind it or not. */
static uint64_t rounds_after(struct fake *f, int fd, uint32_t work)
{
	uint64_t p0;

	asleep(f);
	p0 = get(&f->polls);
	__atomic_store_n(&f->work, work, __ATOMIC_RELEASE);
	ring(fd);
	sleep_s(0.02);
	return get(&f->polls) - p0;
}

static void test_loop_doorbell_window(void **state)
{
	struct fake f = {0};
	struct loop_hooks h = {.poll = f_poll,
			       .prepare_sleep = f_prepare_sleep,
			       .wake = f_wake,
			       .tick = f_tick,
			       .arg = &f};
	pthread_t t;
	uint64_t bell, ctl, busy;
	void *rc;

	(void)state;
	assert_int_equal(loop_init(&f.l, WINDOW, &h), 0);
	f.bell_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	f.ctl_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	assert_true(f.bell_fd >= 0 && f.ctl_fd >= 0);
	f.bell = (struct loop_fd){.fn = on_bell, .arg = &f, .polled = 1};
	f.ctl = (struct loop_fd){.fn = on_ctl, .arg = &f};
	assert_int_equal(loop_add(&f.l, f.bell_fd, &f.bell), 0);
	assert_int_equal(loop_add(&f.l, f.ctl_fd, &f.ctl), 0);
	assert_int_equal(pthread_create(&t, NULL, run, &f), 0);

	bell = rounds_after(&f, f.bell_fd, 0);
	ctl = rounds_after(&f, f.ctl_fd, 0);
	busy = rounds_after(&f, f.bell_fd, 1);
	print_message(
		"rounds in 20 ms after: a bare doorbell %llu, a control event %llu, a doorbell "
		"with work %llu\n",
		(unsigned long long)bell, (unsigned long long)ctl, (unsigned long long)busy);
	/* Polled through the window: thousands of rounds (even under TSan, hundreds). */
	assert_true(ctl >= 100);
	assert_true(busy >= 100);
	/* Back to sleep: the rounds-first poll and the one after the events. */
	assert_true(bell <= 4);

	__atomic_store_n(&f.quit, 1, __ATOMIC_RELEASE);
	ring(f.ctl_fd);
	assert_int_equal(pthread_join(t, &rc), 0);
	assert_int_equal((intptr_t)rc, 0);
	close(f.bell_fd);
	close(f.ctl_fd);
	loop_fini(&f.l);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_loop_doorbell_window),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
