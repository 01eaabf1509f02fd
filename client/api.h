/* SPDX-License-Identifier: MIT */
/*
 * api.h - include/kvbroker.h as the library's own sources see it. libkvbroker's objects are
 * compiled with -fvisibility=hidden (Makefile: KVB_EXPORT_API), so that the internals of
 * client/ and proto/ (kvbc_*, and proto's kvb_msg_*, kvb_layout_*, kvb_sqe_* ...) are hidden in
 * the archive too: an engine that links libkvbroker.a into its own shared object exports only
 * the API, as libkvbroker.so does by its version script. The public header's declarations are
 * made visible here; the definitions in client/ take their visibility from them. Every file of
 * client/ includes this instead of kvbroker.h (tests/integ/t_lib_exports.c checks the result).
 * The Python extension compiles the same sources without KVB_EXPORT_API: there everything
 * stays hidden behind its one PyInit symbol.
 */
#ifndef KVB_CLIENT_API_H
#define KVB_CLIENT_API_H

#ifdef KVB_EXPORT_API
#pragma GCC visibility push(default)
#endif
#include "kvbroker.h"
#ifdef KVB_EXPORT_API
#pragma GCC visibility pop
#endif

#endif /* KVB_CLIENT_API_H */
