"""Workers: ordered results from the calling thread and its helpers, errors where they belong."""

from __future__ import annotations

import threading
import time

import pytest

from crf.parallel import Workers


@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_results_come_in_item_order_whoever_computes_them(n_threads):
    threads = set()

    def slow_square(x: int) -> int:
        threads.add(threading.get_ident())
        time.sleep(0.002 * (x % 3))  # items finish out of order
        return x * x

    with Workers(n_threads) as workers:
        assert workers.map(slow_square, range(20)) == [x * x for x in range(20)]
        assert list(workers.imap(slow_square, [7])) == [49]
    if n_threads > 1:
        assert threading.get_ident() in threads  # the caller works too
        assert len(threads) > 1


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

    def record(x: int) -> int:
        calls.append(x)
        time.sleep(0.01)
        return x

    with Workers(2) as workers:
        results = workers.imap(record, range(50))
        assert next(results) == 0
        results.close()
        time.sleep(0.05)
    assert len(calls) < 10
