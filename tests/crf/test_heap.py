"""Freed heap memory goes back to the operating system after a phase that freed much."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from crf import _parallel as heap


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


# run in a fresh process, where the heap's layout does not depend on the tests before: freeing a
# mapped 16 MiB array raises glibc's mmap threshold, so the 4 MiB arrays after it come from the
# heap; a 1 MiB array after each keeps their space from being handed back when they are freed
_FRAGMENT = """
import sys
import numpy as np
from crf import _parallel as heap


def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024


np.ones(2 << 20)
arrays, pins = [], []
for _ in range(24):  # 96 MiB, touched
    arrays.append(np.ones(1 << 19))
    pins.append(np.ones(1 << 17))
before = rss()
del arrays
held = rss()
heap.release_free_memory()
print(before, held, rss())
"""


@pytest.mark.skipif(not _DEFAULT_GLIBC, reason="glibc's default malloc on Linux only")
def test_release_free_memory_returns_freed_heap_arrays() -> None:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _FRAGMENT], cwd=root, capture_output=True, text=True, check=True)
    before, held, after = map(float, done.stdout.split())
    assert before - held < 16  # freeing alone gave (almost) nothing back
    assert held - after > 64  # the trim gave the 96 MiB back


def test_release_free_memory_is_harmless_to_repeat() -> None:
    values = np.arange(10.0)
    heap.release_free_memory()
    heap.release_free_memory()
    np.testing.assert_array_equal(values, np.arange(10.0))
