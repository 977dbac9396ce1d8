"""Workers: ordered results from the calling thread and its helpers, errors where they belong."""

from __future__ import annotations

import threading
import time

import pytest

from crf._parallel import Workers


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_results_come_in_item_order_whoever_computes_them(n_threads):
    threads = set()
    # the first n_threads items wait for each other: each is held by a different thread, so
    # every thread, the caller included, takes part
    together = threading.Barrier(n_threads, timeout=10)

    def slow_square(x: int) -> int:
        threads.add(threading.get_ident())
        if x < n_threads:
            together.wait()
        time.sleep(0.002 * (x % 3))  # items finish out of order
        return x * x

    with Workers(n_threads) as workers:
        assert workers.map(slow_square, range(20)) == [x * x for x in range(20)]
        assert list(workers.imap(slow_square, [7])) == [49]
    assert threading.get_ident() in threads and len(threads) == n_threads


def test_an_error_is_raised_at_its_item_after_the_results_before_it():
    def fail_at_five(x: int) -> int:
        if x == 5:
            raise ValueError("item five")
        return x

    with Workers(2) as workers:
        seen = []
        with pytest.raises(ValueError, match="item five"):
            for value in workers.imap(fail_at_five, range(10)):
                seen.append(value)
        assert seen == [0, 1, 2, 3, 4]


def test_a_caller_that_stops_reading_stops_the_helpers():
    calls = []
    released = threading.Event()

    def record(x: int) -> int:
        calls.append(x)
        if x >= 10:  # whoever takes these waits until the caller has stopped reading
            released.wait(timeout=5)
        return x

    with Workers(2) as workers:
        results = workers.imap(record, range(100))
        assert next(results) == 0
        results.close()
        released.set()
        time.sleep(0.05)
    assert len(calls) <= 12  # items 0-9, and at most one waiting item per thread


def test_an_interrupt_in_the_reading_thread_is_raised_at_once():
    caller = threading.get_ident()
    taken = []

    def interrupted(x: int) -> int:
        if threading.get_ident() == caller:
            taken.append(x)
            raise KeyboardInterrupt
        time.sleep(0.05)
        return x

    with Workers(2) as workers:
        with pytest.raises(KeyboardInterrupt):
            list(workers.imap(interrupted, range(6)))
    assert len(taken) == 1  # not stored as a result while the caller went on with more items


def test_an_iterator_read_after_close_is_computed_by_the_reader():
    with Workers(2) as workers:
        results = workers.imap(abs, [-1, -2, -3])
    assert list(results) == [1, 2, 3]
