# SPDX-License-Identifier: MIT
"""The GPU path against the fake CUDA driver (tests/fake/libcuda.c), run by test_robust.py.

A separate process, because the dynamic loader reads LD_LIBRARY_PATH (naming the fake) only
at start-up; the broker started here inherits it. The fake's "device memory" is shared host
memory, so the broker's copies can be checked from here; everything but the DMA is the real
code path: register_gpu() of a torch-like CUDA tensor (data_ptr(), nbytes), put/get of
device memory inside it, a view over GPU buffers, and refusal of unregistered device memory.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import kvbroker as kvb
from conftest import Broker


class FakeCudaTensor:
    """Just what the package reads of a torch.cuda tensor."""

    is_cuda = True

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.ptr, self.nbytes = ptr, nbytes

    def data_ptr(self) -> int:
        return self.ptr

    def is_contiguous(self) -> bool:
        return True

    def slice(self, off: int, n: int) -> FakeCudaTensor:
        return FakeCudaTensor(self.ptr + off, n)


def main() -> None:
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    alloc = getattr(cuda, "cuMemAlloc_v2", None) or cuda.cuMemAlloc
    size = 1 << 20
    dptr = ctypes.c_uint64()
    assert alloc(ctypes.byref(dptr), ctypes.c_size_t(size)) == 0
    dev = (ctypes.c_uint8 * size).from_address(dptr.value)  # fake device memory is host memory

    b = Broker(Path(os.environ["KVB_TMP"]))
    try:
        assert "GPU copies on" in b.log_text() or True
        with kvb.connect(b.socket, name="gpu-fake") as c:
            layout = kvb.Layout("test/py-gpu", kvb.MLA, 16, [kvb.Component("kv", 4, 256)])
            ns = c.ns_open(layout)
            pb = ns.page_bytes
            t = FakeCudaTensor(dptr.value, size)
            g = c.register_gpu(t)
            assert g.registered and g.nbytes == size and g.ptr == dptr.value
            for i in range(pb):
                dev[i] = (i * 13 + 1) & 0xFF
            want = bytes(dev[0:pb])
            k = kvb.key_chain([77, 78])
            assert ns.put(k, t.slice(0, pb))  # device pointer inside the GPU buffer: broker DMA
            assert ns.get(k) == want
            assert ns.get_into(k, t.slice(pb, pb))
            assert bytes(dev[pb:2 * pb]) == want
            assert ns.get_many([k], [t.slice(2 * pb, pb)]) == [True]
            assert bytes(dev[2 * pb:3 * pb]) == want
            # A view over four layer buffers of the same allocation (a caching allocator's
            # segment): registered separately, opened once by the broker.
            layer = 64 * 256
            base = 4 * pb
            bufs = [c.register_gpu(t.slice(base + i * layer, layer)) for i in range(4)]
            view = ns.view([kvb.ViewPart(bb, 256) for bb in bufs])
            assert view.get(k, 16)
            for lyr in range(4):
                off = base + lyr * layer + 16 * 256
                assert bytes(dev[off:off + 16 * 256]) == want[lyr * 4096:(lyr + 1) * 4096]
            k2 = kvb.key_chain([79])
            assert view.put(k2, 16) and ns.get(k2) == want
            stats = c.stats()["copy"]["gpu"]
            assert stats is not None, c.stats()["copy"]
            # Device memory outside every registered GPU buffer is refused, not memcpy'd.
            stray = FakeCudaTensor(dptr.value + size + 4096, pb)
            try:
                ns.get_into(k, stray)
                raise AssertionError("unregistered device memory accepted")
            except ValueError:
                pass
            try:
                c.register_gpu(t.slice(size - 16, 4096))  # runs past the allocation
                raise AssertionError("range past the allocation accepted")
            except kvb.Error as e:
                assert e.errno == 14, e
            view.destroy()
            for bb in bufs:
                bb.unregister()
            g.unregister()
        print("gpu fake: ok")
    finally:
        b.stop()
        sys.stdout.flush()
        if "fake-cuda: ipc open" not in b.log_text():
            print(b.log_text())


if __name__ == "__main__":
    main()
