# SPDX-License-Identifier: MIT
"""kvbroker as vLLM's KV offload tier: a v1 KV connector for vllm==0.33.0.

The package is split by role: connector.py (the class vLLM instantiates), scheduler.py
(lookups, load and store plans), worker.py (vLLM's KV memory, the step's transfers),
layouts.py (namespace identity, KV layouts mapped onto the canonical page), common.py
(metadata, statistics, the broker connection).

Launch vLLM with::

    --kv-transfer-config '{"kv_connector": "KVBrokerConnector",
                           "kv_connector_module_path": "kvbroker.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"socket": "/run/kvbroker/kvb.sock"}}'

Pages are keyed by kvbroker chain keys of the request's token ids, one per full vLLM block
(SGLang HiCache's get_hash_str chain), not by vLLM's own block hashes, so a vLLM and an SGLang
instance serving the same model with the same page size, KV dtype and parallel layout find
each other's pages. Everything else that decides whether two pages are the same bytes (model,
MLA/MHA, dtype, TP/PP ranks, components) is the namespace identity, not part of the key.

Scheduler side (scheduler.py): one batched LOOKUP per request gives the number of leading
blocks the broker holds; prompt blocks are stored in the step that computes them, the rest
at request_finished before vLLM frees them.

Worker side: each layer's KV layout is read from its attention backend and mapped onto the
canonical page (docs/protocol.md); layouts whose token rows are byte ranges (NHD) are
described to the broker as views, so the broker copies between its pool and vLLM's memory
itself; every other supported layout (HND, head-packed cells, vLLM-CPU's block format) moves
by a converting copy through a broker buffer: same page bytes. Unknown layouts are refused
at start-up, naming them. Hybrid models: full-attention groups are stored and loaded whole,
sliding-window and chunked-local groups per block, loading only the blocks vLLM keeps before
a hit's end, each group in its own namespace; a model with a Mamba/state group (no page per
block) is served without kvbroker, said once at start-up.

Failures never become wrong data: a miss, an error or a broker that died makes the blocks
"load errors" (get_block_ids_with_load_errors), which vLLM recomputes (the connector sets
kv_load_failure_policy to "recompute"). Without a broker vLLM serves as if no connector were
configured, and the connector reconnects by itself (at most every ``reconnect_s`` seconds).

kv_connector_extra_config keys (all optional):
  socket        broker socket (default $KVB_SOCKET, then kvbroker's default path)
  model         namespace model name (default: basename of the served model path)
  layer_groups  layer groups a load is split into, waited for one by one (default 4; 1: all
                layers at once before the first layer runs)
  op_timeout_ms how long to wait for the broker before a transfer counts as failed (10000)
  reconnect_s   least time between two reconnection attempts (1.0)
  retire_on_timeout  false: after a timeout, hold the blocks the broker may still write
                until it settles, instead of moving CPU KV onto a new memfd (true)
  zero_copy     false: never register or move vLLM's memory, copy through a buffer (true)
  save_prompt   false: store only at request end (true: prompt blocks as they are computed)
  keep_load_failure_policy  true: leave kv_load_failure_policy as configured (false)
  early_lookup  false: no LOOKUP at admission (on_new_request), only in the match (true)
  lookup_wait_ms     how long the match waits for an early LOOKUP still running before it
                     asks vLLM to come back next step (2)
  lookup_max_age_ms  an early answer older than this is asked again (500)
  async_load    true: loads outside the step ((n, True) from get_num_new_matched_tokens,
                finished_recving in get_finished); false: inside it, layer group by layer group
                while the model computes (false; always true with several KV cache groups)
  save_ring_mb  MiB of the broker buffer converting copies store and load through (64)
  events_tracked     stored pages remembered for BlockRemoved events (65536)
  events_recheck_s   least time between two re-checks of remembered pages (1.0)
  events_recheck_n   pages one re-check looks up at most (256)
  events_grace_s     a page stored more recently is not yet taken as gone (2.0)
  tp_rank / tp_size  override the tensor-parallel rank/size (tests; default: vLLM's)
"""

from kvbroker._layout import model_ns_name
from kvbroker.vllm.common import KVBrokerMetadata, KVBrokerPromMetrics, KVBrokerStats
from kvbroker.vllm.connector import KVBrokerConnector
from kvbroker.vllm.layouts import LayoutError, namespace_layouts, storage_namespace_seed

__all__ = [
    "KVBrokerConnector",
    "KVBrokerMetadata",
    "KVBrokerPromMetrics",
    "KVBrokerStats",
    "LayoutError",
    "model_ns_name",
    "namespace_layouts",
    "storage_namespace_seed",
]
