"""Handing freed heap memory back to the operating system.

glibc's malloc keeps memory that Python frees, and once a large array has been freed it serves
arrays up to that size from its heap instead of mapping them afresh (its dynamic mmap
threshold). Building the training objective frees many such arrays, and their space stays in
the process: on CoNLL-2000 about 90 MiB of freed memory lay in the heap when training began.
``malloc_trim`` gives it back. Elsewhere (macOS, Windows, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import time
from functools import lru_cache

logger = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def _malloc_trim():
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError, TypeError):  # not glibc, or no C library to load by name
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_memory() -> None:
    """Return the heap's free pages to the operating system (glibc only; a no-op elsewhere).
    Costs milliseconds: call it after a phase that freed much, not in a loop."""
    trim = _malloc_trim()
    if trim is not None:
        began = time.perf_counter()
        trim(0)
        logger.debug("malloc_trim took %.1f ms", 1e3 * (time.perf_counter() - began))
