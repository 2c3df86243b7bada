"""Starts a world-1 grpc group, then reports how glibc serves and frees a 16 MiB block.

Run as a script by tests/test_malloc_tuning.py, in a process of its own: malloc's
settings are process-wide. Prints one JSON line: the bytes that the block took from
mmap, and the bytes that stayed in the heap, free for reuse, after it was freed.
"""

from __future__ import annotations

import ctypes
import json
import sys

import torch
import torch.distributed as dist

import torch_grpc_pg

_FIELDS = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS.split()]


def main() -> None:
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    options = (
        torch_grpc_pg.Options(tune_malloc=False) if "--option-off" in sys.argv else None
    )
    dist.init_process_group(
        "grpc", store=dist.HashStore(), rank=0, world_size=1, pg_options=options
    )
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [1.0] * 4
    before = libc.mallinfo2()
    block = libc.malloc(16 << 20)
    during = libc.mallinfo2()
    libc.free(block)
    after = libc.mallinfo2()
    dist.destroy_process_group()
    mmapped = during.hblkhd - before.hblkhd
    kept = after.fordblks - before.fordblks
    print(json.dumps({"mmapped": mmapped, "kept_free": kept}))


if __name__ == "__main__":
    main()
