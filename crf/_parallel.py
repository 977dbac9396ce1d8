"""The process's resources: independent pieces of work on several cores, and freed heap memory
handed back to the operating system.

NumPy's and SciPy's kernels release the GIL, so threads give real parallelism here. Each thread's
small matrix products must then run single-threaded in BLAS: otherwise every thread spawns its own
BLAS threads and they fight over the cores.

glibc's malloc keeps memory that Python frees, and once a large array has been freed it serves
arrays up to that size from its heap instead of mapping them afresh (its dynamic mmap threshold):
building the training objective frees many such arrays, whose space would otherwise stay in the
process while training runs. ``malloc_trim`` gives it back; elsewhere (macOS, Windows, musl)
:func:`release_free_memory` does nothing.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import lru_cache
from typing import TypeVar

import numpy as np
from threadpoolctl import ThreadpoolController

try:  # rebuilt only when modules were imported since (a new BLAS may have been loaded)
    from threadpoolctl import get_cached_controller
except ImportError:  # threadpoolctl before 3.8: one controller for the process
    get_cached_controller = lru_cache(maxsize=1)(ThreadpoolController)

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


def thread_count(requested: int | None) -> int:
    """``requested``, or the number of cores (at most 4) when None."""
    return int(requested) if requested else min(os.cpu_count() or 1, 4)


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    """BLAS limited to one thread inside the block. The limit is process-wide: enter the block in
    the thread that starts the worker threads, around all of them. threadpoolctl lets only one
    thread at a time set a process-wide limit (a block entered by another thread meanwhile does
    nothing), and it gives that right up when the outermost block of that thread ends. The
    controller is cached: finding the loaded libraries anew for every block would cost as much as
    tagging a few hundred tokens.

    Use it as ``with crf.single_threaded_blas(): ...``.

    Yields
    ------
    None
        The previous BLAS thread limit is restored when the block ends.
    """
    with get_cached_controller().limit(limits=1, user_api="blas"):
        yield


class Workers:
    """``n_threads`` threads mapping functions in order: the calling thread and a persistent pool
    of ``n_threads - 1`` helpers (none when 1). Callers wrap the whole job in
    :func:`single_threaded_blas`: entering it costs milliseconds.

    The caller works too rather than waiting: besides sparing a thread, this keeps the work's
    large temporary arrays in one malloc arena fewer (glibc gives each allocating thread its
    own, and keeps what they free), which lowers training's peak memory.
    """

    def __init__(self, n_threads: int) -> None:
        self.n_threads = n_threads
        self.pool = ThreadPoolExecutor(n_threads - 1) if n_threads > 1 else None

    def map(self, function: Callable[[T], R], items: Iterable[T]) -> list[R]:
        return list(self.imap(function, items))

    def imap(self, function: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """The results in order, as an iterator that computes them when read: the reading
        thread takes items in order beside the helpers, and hands over each result once it and
        those before it are done (so a caller folding them can drop each one before the last is
        computed). An exception is raised where its item's result would be; one that is not an
        ``Exception`` (KeyboardInterrupt) is raised at once in the reading thread."""
        items = list(items)
        if self.pool is None or len(items) <= 1:
            return map(function, items)
        return self._shared(function, items)

    def _shared(self, function: Callable[[T], R], items: list[T]) -> Iterator[R]:
        claims = itertools.count()  # next() on it is atomic: each item is taken once
        results: list = [None] * len(items)
        done = [threading.Event() for _ in items]
        abandoned = threading.Event()  # the caller stopped reading: take no more items

        def work_one(in_caller: bool) -> bool:
            i = next(claims)
            if i >= len(items) or abandoned.is_set():
                return False
            try:
                results[i] = (True, function(items[i]))
            except Exception as error:  # handed to the caller at item i
                results[i] = (False, error)
            except BaseException as error:
                if in_caller:
                    raise
                results[i] = (False, error)
            done[i].set()
            return True

        def helper() -> None:
            while work_one(in_caller=False):
                pass

        pool = self.pool  # None once closed: then the reading thread takes every item
        if pool is not None:
            for _ in range(min(self.n_threads - 1, len(items) - 1)):
                pool.submit(helper)
        try:
            for i in range(len(items)):
                while not done[i].is_set() and work_one(in_caller=True):
                    pass
                done[i].wait()
                ok, value = results[i]
                results[i] = None  # the caller owns it now
                if not ok:
                    raise value
                yield value
        finally:
            abandoned.set()
            results[:] = [None] * len(items)  # a stored error's traceback would keep them alive

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def contiguous_parts(offsets: np.ndarray, n_parts: int) -> list[tuple[int, int]]:
    """Split sequences ``0..N`` into at most ``n_parts`` contiguous ranges of similar token counts."""
    n = offsets.size - 1
    targets = np.linspace(0, offsets[-1], n_parts + 1)[1:-1]
    cuts = np.unique(np.concatenate([[0], np.searchsorted(offsets, targets), [n]]))
    return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


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
