"""Give the memory of large payloads back to the OS when they are freed.

glibc serves an allocation of 128 KiB or more from its own mmap, and returns it at free, until a
large block is freed: then it raises that threshold to the block's size (up to 32 MiB), and later
10 MB payloads come from the threads' heaps, where the gaps they leave are seldom returned. A
worker that echoed twenty 10 MB payloads held 770 MB that way with 100 MB live. A fixed threshold
keeps payloads of 1 MiB and more in their own mappings, at the cost of page faults on each (about
a millisecond per 10 MB) — small next to encoding them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc malloc.h
THRESHOLD = 1024 * 1024


def return_large_blocks(threshold: int = THRESHOLD) -> bool:
    """Fix glibc's mmap threshold for this process; True when it was set.

    Left alone when the operator chose one (MALLOC_MMAP_THRESHOLD_), and on other C libraries."""
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))
