// SPDX-License-Identifier: MIT
/*
 * batch.c - running a batch of ops to completion on kvb_submit()/kvb_reap(): what put_many(),
 * get_many(), prefetch() and the views' batches are made of.
 *
 * kvb_reap() hands out any completion of the client's async ops, whoever submitted them, so
 * two threads reaping at once would take each other's. One batch_lock per client makes every
 * reaper (batches and the low-level reap()) take turns; a batch tags its ops' user_data with
 * KVBPY_TAG | index, and completions without the tag (the caller's own submit()) are stashed
 * for reap() to hand out first. The low-level submit() refuses user_data with the tag bit, so
 * the two never mix. Runs without the GIL; the lock is a plain mutex (no Python inside).
 *
 * A batch never hangs on a dead broker: kvb_reap() returns -ECONNRESET on the socket's
 * hang-up, and the batch returns it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvbpy.h"

#define REAP_MAX 64

static int stash_push(kvbpy_client *cl, const struct kvb_completion *c)
{
	if (cl->nstash == cl->stash_cap) {
		size_t cap = cl->stash_cap ? 2 * cl->stash_cap : 16;
		struct kvb_completion *s = realloc(cl->stash, cap * sizeof(*s));

		if (!s)
			return -ENOMEM;
		cl->stash = s;
		cl->stash_cap = cap;
	}
	cl->stash[cl->nstash++] = *c;
	return 0;
}

int kvbpy_batch_run(kvbpy_client *cl, struct kvb_op *ops, size_t n, const kvb_key *parents,
		    int32_t *res, uint32_t *flags)
{
	struct kvb_completion comp[REAP_MAX];
	size_t sent = 0, done = 0, want;
	int err = 0;

	if (!n)
		return 0;
	for (size_t i = 0; i < n; i++)
		ops[i].user_data = KVBPY_TAG | i;
	pthread_mutex_lock(&cl->batch_lock);
	while (done < n) {
		int r;

		if (sent < n) {
			int q = kvb_submit_parents(cl->c, ops + sent,
						   parents ? parents + sent : NULL, n - sent);

			if (q < 0) {
				err = q;
				n = sent; /* submit no more; drain what is in flight */
				if (done >= n)
					break;
			} else {
				sent += (size_t)q;
			}
		}
		/* q == 0 with nothing of ours in flight: the caller's ops fill the ring; reap. */
		want = sent - done;
		if (want > REAP_MAX)
			want = REAP_MAX;
		if (!want)
			want = 1;
		r = kvb_reap(cl->c, comp, REAP_MAX, want, -1);
		if (r < 0) {
			if (!err)
				err = r;
			break;
		}
		for (int i = 0; i < r; i++) {
			uint64_t ud = comp[i].user_data;

			if (ud & KVBPY_TAG) {
				size_t j = (size_t)(ud & ~KVBPY_TAG);

				if (j < sent) {
					res[j] = comp[i].res;
					flags[j] = comp[i].flags;
					done++;
				}
			} else if (stash_push(cl, &comp[i]) < 0 && !err) {
				err = -ENOMEM;
			}
		}
	}
	pthread_mutex_unlock(&cl->batch_lock);
	return err;
}
