"""Freed heap memory goes back to the operating system after a phase that freed much."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from crf import heap


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS line")


# glibc's default allocator behaviour is what the test relies on: no tuning, no other allocator
_DEFAULT_GLIBC = (
    heap._malloc_trim() is not None
    and Path("/proc/self/status").exists()
    and "LD_PRELOAD" not in os.environ
    and not any(name.startswith("MALLOC_") or name.startswith("GLIBC_TUNABLES") for name in os.environ)
)


@pytest.mark.skipif(not _DEFAULT_GLIBC, reason="glibc's default malloc on Linux only")
def test_release_free_memory_returns_freed_heap_arrays() -> None:
    # freeing a mapped 16 MiB array raises glibc's mmap threshold, so the 4 MiB arrays below come
    # from the heap; a small array after each keeps their space from being handed back when freed
    np.ones(2 << 20)
    arrays, pins = [], []
    for _ in range(24):  # 96 MiB, touched
        arrays.append(np.ones(1 << 19))
        pins.append(np.ones(8000))
    del arrays
    held = _rss_mib()
    heap.release_free_memory()
    assert held - _rss_mib() > 64
    assert sum(pin.sum() for pin in pins) == 24 * 8000


def test_release_free_memory_is_harmless_to_repeat() -> None:
    values = np.arange(10.0)
    heap.release_free_memory()
    heap.release_free_memory()
    np.testing.assert_array_equal(values, np.arange(10.0))
