#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/fuzz/mkseeds.py - writes the seed corpus of every fuzz target (tests/fuzz/corpus/).

Seeds are valid or nearly valid inputs, so the fuzzer starts deep inside the parsers instead of
at their first check. The wire layouts mirror proto/wire.h (static_asserted there); run
`python3 tests/fuzz/mkseeds.py` after changing them and commit the result
(`python3 tests/fuzz/mkseeds.py slot` writes only fuzz_slot's, from broker/slot.h's layout).
"""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MSG_MAGIC = 0x4B56424D
REGION_MAGIC = 0x4B564252
HELLO, NS_OPEN, BUF_REG, BUF_UNREG, VIEW_CREATE, VIEW_DESTROY, STATS, BUF_REG_GPU = range(1, 9)
BUF_REG_FD, VIEW_CREATE2 = 9, 10  # ABI 1.2
DROP = 11  # ABI 1.3, as is the paged STATS body (struct kvb_msg_stats_page)
STATS_PAGE = 48 * 1024
NOP, PUT, GET, ACQUIRE, RELEASE, DELETE, LOOKUP, PREFETCH = range(8)


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def msg(mtype, body, seq=1, flags=0):
    return struct.pack("<IHHII", MSG_MAGIC, mtype, flags, 16 + len(body), seq) + body


def hello(sq=8, flags=0, abi=1):
    return struct.pack("<HHIII32s", abi, 0, flags, sq, 0, b"fuzz")


def ident(dtypes=(2,), fmt=b"", pp=(0, 0), cp=(0, 0), dp=(0, 0)):
    """struct kvb_ns_ident (96 bytes): dtype[4], page_format[32], pp/cp/dp size+rank, flags, resv[5]."""
    d = list(dtypes) + [0] * (4 - len(dtypes))
    return struct.pack("<4I32s6II5I", *d, fmt, pp[0], pp[1], cp[0], cp[1], dp[0], dp[1], 0,
                       0, 0, 0, 0, 0)


def comp(name, layers, bpt):
    return struct.pack("<16sIII", name, layers, bpt, 0)


def layout(model=b"fuzz/a", kind=1, tpp=16, comps=((b"kv", 2, 512),)):
    c = b"".join(comp(*x) for x in comps) + b"\0" * 28 * (4 - len(comps))
    return struct.pack("<64sIIIII", model, kind, tpp, 1, 0, len(comps)) + c + b"\0" * 16


# fuzz_ctl: [u8 flags][u16 len](u32 memfd size)[datagram]
def rec(dgram, fd_size=None, seals=0, extra_fd=False):
    flags = (1 if fd_size is not None else 0) | (seals << 1) | (0x10 if extra_fd else 0)
    out = struct.pack("<BH", flags, len(dgram))
    if fd_size is not None:
        out += struct.pack("<I", fd_size)
    return out + dgram


def sqe(op, ns=0, key=b"\0" * 32, buf=0, off=0, flags=0, ud=0, lf=0, lc=0):
    return struct.pack("<BBHIQ32sIHHQ", op, flags, 0, ns, ud, key, buf, lf, lc, off)


def lookup(ns, arg_off, count, out_off, ud=0):
    batch = struct.pack("<III20s", arg_off, count, out_off, b"")
    return struct.pack("<BBHIQ", LOOKUP, 0, 0, ns, ud) + batch + struct.pack("<IHHQ", 0, 0, 0, 0)


def ring(order, base, arg, rounds):
    out = struct.pack("<BIH", order, base, len(arg)) + arg
    for tail_lie, cq_back, sqes in rounds:
        out += struct.pack("<IIB", tail_lie, cq_back, len(sqes)) + b"".join(sqes)
    return out


# ---- slot: the disk format (broker/slot.h) ----
SLOT_MAGIC = 0x31544F4C5342564B
SUPER_MAGIC = 0x314B53494442564B


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


def slot_hdr(cache_id, gen, ns_ident, key, payload, version=1, flags=0):
    h = struct.pack("<QHHI16sQ32s32sII12s", SLOT_MAGIC, version, 128, flags, cache_id, gen,
                    ns_ident, key, len(payload), crc32c(payload), b"")
    return h + struct.pack("<I", crc32c(h))


def slot_super(cache_id, npaths=1, index=0, path_bytes=64 << 20):
    s = struct.pack("<QHHIIIQQ16sQ12s", SUPER_MAGIC, 1, 0, npaths, index, 0, path_bytes,
                    1 << 20, cache_id, 1764400000, b"")
    return s + struct.pack("<I", crc32c(s))


def slot_seeds():
    """fuzz_slot: [0] selector; header: id, max_len, flip bit, block, payload."""
    cid = bytes(range(16))
    payload = bytes((i * 7) & 0xFF for i in range(4096))

    def hdr_input(h, max_len=1 << 20, bit=77, pay=payload, cache=cid):
        return b"\0" + cache + struct.pack("<IH", max_len, bit) + h.ljust(4096, b"\0") + pay

    good = slot_hdr(cid, 42, b"n" * 32, b"k" * 32, payload)
    put("slot", "hdr-valid", hdr_input(good))
    put("slot", "hdr-valid-nopayload", hdr_input(good, pay=b""))
    put("slot", "hdr-too-long", hdr_input(good, max_len=4095))
    put("slot", "hdr-other-cache", hdr_input(good, cache=b"\xff" * 16))
    put("slot", "hdr-version2", hdr_input(slot_hdr(cid, 1, b"n" * 32, b"k" * 32, payload, 2)))
    put("slot", "hdr-torn", hdr_input(good[:64] + b"\0" * 64))
    put("slot", "hdr-magic-flip", hdr_input(bytes([good[0] ^ 4]) + good[1:]))
    put("slot", "hdr-empty", hdr_input(b""))
    put("slot", "super-valid", b"\1" + struct.pack("<H", 5) + slot_super(cid))
    put("slot", "super-4paths", b"\1" + struct.pack("<H", 600) + slot_super(cid, 4, 3, 1 << 30))
    put("slot", "super-bad-crc", b"\1\0\0" + slot_super(cid)[:76] + b"\0\0\0\0")
    put("slot", "crc-vector", b"\2123456789")


def main():
    if sys.argv[1:] == ["slot"]:
        slot_seeds()
        return
    slot_seeds()
    lay_a = layout()
    lay_b = layout(b"fuzz/b", 1, 4, ((b"kv", 3, 64), (b"idx", 2, 32)))
    # ---- ctl ----
    put("ctl", "hello", rec(msg(HELLO, hello())))
    put("ctl", "hello-control-stats", rec(msg(HELLO, hello(0, 1))) + rec(msg(STATS, b"", 2)))
    put("ctl", "hello-ns", rec(msg(HELLO, hello())) + rec(msg(NS_OPEN, lay_a, 2)))
    put("ctl", "hello-bufreg",
        rec(msg(HELLO, hello())) + rec(msg(BUF_REG, struct.pack("<QII", 65536, 1, 0), 2), 65536, 1)
        + rec(msg(BUF_UNREG, struct.pack("<II", 0, 0), 3)))
    parts = b"".join(struct.pack("<IIQ", 0, 256, o) for o in (0, 64, 128, 192, 224))
    put("ctl", "hello-view",
        rec(msg(HELLO, hello())) + rec(msg(NS_OPEN, lay_b, 2))
        + rec(msg(BUF_REG, struct.pack("<QII", 65536, 1, 0), 3), 65536, 1)
        + rec(msg(VIEW_CREATE, struct.pack("<II", 1, 5) + parts, 4))
        + rec(msg(VIEW_DESTROY, struct.pack("<II", 0, 0), 5)) + rec(msg(STATS, b"", 6)))
    put("ctl", "bufreg-unsealed",
        rec(msg(HELLO, hello())) + rec(msg(BUF_REG, struct.pack("<QII", 4096, 1, 0), 2), 4096, 0))
    put("ctl", "two-fds", rec(msg(HELLO, hello())) + rec(msg(STATS, b"", 2), 4096, 1, True))
    put("ctl", "bad-abi", rec(msg(HELLO, hello(8, 0, 2))))
    # ABI 1.2: NS_OPEN with identity, BUF_REG_FD at an unaligned offset, VIEW_CREATE2.
    put("ctl", "hello-ns-ident",
        rec(msg(HELLO, hello())) + rec(msg(NS_OPEN, lay_a + ident((2,), b"sglang:page_first",
                                                                   (2, 1), (2, 0), (4, 3)), 2))
        + rec(msg(NS_OPEN, lay_a + ident((1,)), 3)) + rec(msg(STATS, b"", 4)))
    put("ctl", "hello-bufregfd",
        rec(msg(HELLO, hello()))
        + rec(msg(BUF_REG_FD, struct.pack("<QQII", 100, 8192, 0, 0), 2), 65536, 1)
        + rec(msg(BUF_REG_FD, struct.pack("<QQII", 65000, 8192, 0, 0), 3), 65536, 1)
        + rec(msg(BUF_UNREG, struct.pack("<II", 0, 0), 4)))
    put("ctl", "bufregfd-unsealed",
        rec(msg(HELLO, hello())) + rec(msg(BUF_REG_FD, struct.pack("<QQII", 0, 4096, 0, 0), 2), 4096, 0))
    # KVB_BUF_REG_FD_FDCOPY (flags 1): the unsealed memfd is taken, copied through the fd.
    put("ctl", "bufregfd-fdcopy",
        rec(msg(HELLO, hello()))
        + rec(msg(BUF_REG_FD, struct.pack("<QQII", 100, 8192, 1, 0), 2), 65536, 0)
        + rec(msg(BUF_REG_FD, struct.pack("<QQII", 0, 65536, 1, 0), 3), 65536, 1)
        + rec(msg(BUF_UNREG, struct.pack("<II", 0, 0), 4)) + rec(msg(STATS, b"", 5)))
    parts2 = b"".join(struct.pack("<IIQQII", 0, 256, o, 256 * 4 * 2, 0, 0)
                      for o in (0, 64, 128, 192, 224))
    put("ctl", "hello-view2",
        rec(msg(HELLO, hello())) + rec(msg(NS_OPEN, lay_b, 2))
        + rec(msg(BUF_REG, struct.pack("<QII", 65536, 1, 0), 3), 65536, 1)
        + rec(msg(VIEW_CREATE2, struct.pack("<IIII", 1, 5, 0, 0) + parts2, 4))
        + rec(msg(VIEW_DESTROY, struct.pack("<II", 0, 0), 5)) + rec(msg(STATS, b"", 6)))
    # ABI 1.3: paged STATS (offset, max, flags) and DROP (id, resv); fuzz_ctl reads a DROP of
    # id 0 as its victim client's id.
    def page(off, mx=0, flags=0):
        return struct.pack("<QII", off, mx, flags)

    def drop(cid, resv=0):
        return struct.pack("<II", cid, resv)

    put("ctl", "stats-paged",
        rec(msg(HELLO, hello(0, 1))) + rec(msg(STATS, page(0), 2))
        + rec(msg(STATS, page(STATS_PAGE), 3)) + rec(msg(STATS, page(2 * STATS_PAGE), 4)))
    put("ctl", "stats-paged-small",
        rec(msg(HELLO, hello())) + rec(msg(NS_OPEN, lay_a, 2)) + rec(msg(STATS, page(0, 100), 3))
        + rec(msg(STATS, page(100, 100), 4)) + rec(msg(STATS, page(0, 1), 5)))
    put("ctl", "stats-paged-odd",
        rec(msg(HELLO, hello(0, 1))) + rec(msg(STATS, page(5), 2))
        + rec(msg(STATS, page(1 << 40), 3)) + rec(msg(STATS, page(0, 0xFFFFFFFF), 4))
        + rec(msg(STATS, page(0, 0, 1), 5)) + rec(msg(STATS, page(0)[:8], 6)))
    put("ctl", "drop-victim",
        rec(msg(HELLO, hello(0, 1))) + rec(msg(DROP, drop(0), 2)) + rec(msg(DROP, drop(0), 3))
        + rec(msg(STATS, page(0), 4)))
    put("ctl", "drop-odd",
        rec(msg(DROP, drop(0), 1)) + rec(msg(HELLO, hello())) + rec(msg(DROP, drop(0, 1), 2))
        + rec(msg(DROP, drop(0xFFFFFFFF), 3)) + rec(msg(DROP, drop(1), 4))
        + rec(msg(DROP, b"", 5)) + rec(msg(DROP, drop(0), 6)))
    # ---- ring ---- keys: PUT from buf 0 into ns 0 (a) and a view PUT on ns 1 (b)
    k1, k2 = bytes(range(32)), bytes(range(1, 33))
    arg = k1 + k2 + b"\0" * 64
    put("ring", "put-get-lookup", ring(0, 0, arg, [
        (0, 0, [sqe(NOP, ud=1), sqe(PUT, 0, k1, 0, 0, ud=2), sqe(GET, 0, k1, 0, 16384, ud=3),
                lookup(0, 0, 2, 64, ud=4)]),
        (0, 0, [sqe(ACQUIRE, 0, k1, ud=5), sqe(RELEASE, off=0xEE << 56, ud=6),
                sqe(RELEASE, off=0xEE << 56, ud=7), sqe(DELETE, 0, k1, ud=8)]),
    ]))
    put("ring", "view-put-get", ring(1, 0xFFFFFFF0, b"", [
        (0, 0, [sqe(PUT, 0, k2, 0, 0, flags=1, ud=1), sqe(GET, 0, k2, 0, 3, flags=1, ud=2, lf=1, lc=1),
                sqe(PREFETCH, 1, k2, ud=3)]),
    ]))
    put("ring", "view2-page-stride", ring(1, 7, b"", [
        (0, 0, [sqe(PUT, 0, k2, 1, 2, flags=1, ud=1), sqe(GET, 0, k2, 1, 5, flags=1, ud=2),
                sqe(GET, 0, k2, 1, 0, flags=1, ud=3, lf=0, lc=1)]),
    ]))
    # KVB_SQEF_FILL (2): filled PUTs, stored then EXISTED; refused on GET and with VIEW
    put("ring", "fill-put", ring(0, 0xFFFFFFFE, b"", [
        (0, 0, [sqe(PUT, 0, k2, 0, 0, flags=2, ud=1), sqe(PUT, 0, k2, 0, 0, flags=2, ud=2),
                sqe(GET, 0, k2, 0, 0, flags=2, ud=3), sqe(PUT, 0, k2, 0, 0, flags=3, ud=4),
                sqe(PUT, 1, k1, 1, 4096, flags=2, ud=5), sqe(GET, 1, k1, 1, 0, ud=6)]),
    ]))
    put("ring", "bad-tail", ring(0, 5, b"", [(0, 0, [sqe(NOP)]), (100, 0, [sqe(NOP)])]))
    put("ring", "bad-cq-head", ring(0, 5, b"", [(0, 0, [sqe(NOP)]), (0, 1000, [sqe(NOP)])]))
    put("ring", "acquire-many", ring(2, 0x7FFFFFFF, b"", [
        (0, 0, [sqe(PUT, 0, bytes([i]) * 32, 0, 0, ud=i) for i in range(8)]),
        (0, 0, [sqe(ACQUIRE, 0, bytes([i]) * 32, ud=i) for i in range(8)]),
    ]))
    # ---- proto ---- selector byte then bytes
    put("proto", "msg-hello", b"\0" + msg(HELLO, hello()))
    put("proto", "msg-reply", b"\0" + msg(HELLO, struct.pack("<iI", 0, 0), 1, 1))
    put("proto", "layout-a", b"\1" + lay_a)
    put("proto", "layout-b", b"\1" + lay_b)
    put("proto", "ident-default", b"\4" + lay_a + ident(()))
    put("proto", "ident-bf16-pp", b"\4" + lay_b + ident((2, 4), b"vllm:nhd", (4, 2), (1, 0), (2, 1)))
    hdr = struct.pack("<IHHIIIIIIIIIIIIII", REGION_MAGIC, 1, 0, 1, 64, 8, 16, 64, 128, 132, 192,
                      256, 260, 320, 832, 4096, 4096)
    put("proto", "region", b"\2" + struct.pack("<Q", 8192) + hdr)
    put("proto", "sqe-lookup", b"\3\0" + lookup(0, 0, 4, 128))
    put("proto", "sqe-put", b"\3\0" + sqe(PUT, 0, k1, 0, 0))
    put("proto", "sqe-put-fill", b"\3\0" + sqe(PUT, 0, k1, 0, 0, flags=2))


if __name__ == "__main__":
    main()
