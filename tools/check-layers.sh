#!/bin/sh
# SPDX-License-Identifier: MIT
#
# tools/check-layers.sh - the tiers and the copy engines know nothing of requests or sessions.
#
# Only the request engine (broker/ops.c, with xfer.c and session.c) parks, resumes and
# completes ops: the RAM store, the disk tier and the remote tier answer "here is the page",
# "miss" or "wait on this queue" (broker/waitq.h), and the CUDA engine opens the GPU
# allocations the control path decodes for it (broker/copy.h). This checks that the files of
# those layers name nothing of the request engine or of sessions: struct op, its CQE, ops_*(),
# session_*(), struct session; nor a control message (kvb_msg_*), which the control path
# decodes. Run from the repository root (make lint, t_layers).
# Exit 0 clean, 1 with each offending line printed.

set -u
files="broker/store.c broker/store.h broker/tier.c broker/tier.h broker/disk.c broker/disk.h
broker/slot.c broker/slot.h broker/remote.c broker/remote.h broker/remote_redis.c
broker/remote_value.c broker/remote_value.h broker/cslot.c broker/cslot.h broker/copy.h
broker/copy_host.c broker/copy_cuda.c broker/copy_cuda.h broker/waitq.h"
pattern='struct op\b|struct session\b|\bop->|\bops_[a-z_]+\(|\bsession_[a-z_]+\(|kvb_cqe|cqe\.res|kvb_msg_'

for f in $files; do
	if [ ! -f "$f" ]; then
		echo "check-layers: $f not found: run from the repository root" >&2
		exit 2
	fi
done
# shellcheck disable=SC2086
if grep -nE "$pattern" $files; then
	echo "check-layers: a tier or copy engine names the request engine or a session (above):" \
		"answer miss or wait on a queue (broker/waitq.h) and let ops.c park" >&2
	exit 1
fi
exit 0
