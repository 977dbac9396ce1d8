"""The same data, settings and seed give bit-identical results whatever the thread count."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.sparse as sp
from threadpoolctl import threadpool_info

from crf import CRF, SequenceBatch
from crf._objective import Objective, ParameterLayout, _blocks_of, block_count
from crf._parallel import single_threaded_blas
from crf._params import feature_index

N_LABELS = 4


def _corpus(seed: int = 0, n_sequences: int = 300, n_attributes: int = 60):
    """A learnable generated corpus: each label favours some attributes. (batch, label lists)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 15, size=n_sequences)
    total = int(lengths.sum())
    labels = rng.integers(0, N_LABELS, size=total)
    rows, cols = [], []
    for _ in range(4):  # four attributes per token, biased towards the label's own range
        own = labels * (n_attributes // N_LABELS) + rng.integers(0, n_attributes // N_LABELS, size=total)
        noise = rng.integers(0, n_attributes, size=total)
        rows.append(np.arange(total))
        cols.append(np.where(rng.random(total) < 0.6, own, noise))
    X = sp.csr_matrix((np.ones(4 * total), (np.concatenate(rows), np.concatenate(cols))), shape=(total, n_attributes))
    X.sum_duplicates()
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    names = np.array([f"L{i}" for i in range(N_LABELS)])
    y = [list(names[labels[a:b]]) for a, b in zip(offsets[:-1], offsets[1:])]
    return SequenceBatch(X, offsets), labels, y


def test_block_count_does_not_depend_on_threads():
    assert block_count(10, 5, 100) == 1
    assert block_count(250, 50, 100) == 4  # 3 blocks, rounded up to a multiple of 4
    assert block_count(900, 50, 100) == 12
    assert block_count(900, 6, 100) == 6  # at most one block per sequence


def test_blocks_cover_every_sequence_once_by_length_with_balanced_tokens():
    lengths = np.random.default_rng(3).integers(1, 40, size=500)
    groups = _blocks_of(lengths, 8)
    assert len(groups) == 8
    assert np.array_equal(np.sort(np.concatenate(groups)), np.arange(lengths.size))
    tokens = [int(lengths[g].sum()) for g in groups]
    assert max(tokens) - min(tokens) <= lengths.max()  # cut at the first sequence past each share
    for longer, shorter in zip(groups, groups[1:]):  # runs of lengths, longest first
        assert lengths[longer].min() >= lengths[shorter].max()
    assert [g.size for g in _blocks_of(np.array([5, 1, 1]), 4)] == [1, 1, 1]  # never an empty block


def test_an_objective_in_blocks_equals_one_block():
    batch, labels, _ = _corpus()
    params = ParameterLayout(batch.n_attributes, N_LABELS, feature_index(batch.X, labels, N_LABELS))
    theta = np.random.default_rng(2).normal(0, 0.5, params.size)
    with single_threaded_blas():
        whole = Objective(batch.X, batch.offsets, labels, params, n_threads=1, block_cells=10**9)
        split = Objective(batch.X, batch.offsets, labels, params, n_threads=2, block_cells=300)
        assert len(whole.blocks) == 1 and len(split.blocks) > 8
        (loss_whole, grad_whole), (loss_split, grad_split) = whole(theta), split(theta)
    assert loss_split == pytest.approx(loss_whole, rel=1e-12)
    np.testing.assert_allclose(grad_split, grad_whole, rtol=1e-10, atol=1e-10)


def test_objective_bit_identical_for_1_and_2_threads():
    batch, labels, _ = _corpus()
    params = ParameterLayout(batch.n_attributes, N_LABELS, feature_index(batch.X, labels, N_LABELS))
    theta = np.random.default_rng(1).normal(0, 0.5, params.size)
    results = []
    with single_threaded_blas():
        for threads in (1, 2):
            objective = Objective(batch.X, batch.offsets, labels, params, n_threads=threads, block_cells=500)
            assert len(objective.blocks) > 4
            results.append(objective(theta))
    assert results[0][0] == results[1][0]
    assert np.array_equal(results[0][1], results[1][1])


@pytest.mark.parametrize("c1, c2", [(0.0, 1.0), (0.5, 0.01)])
def test_fit_bit_identical_for_1_and_2_threads(monkeypatch, c1, c2):
    batch, _, y = _corpus()
    monkeypatch.setattr(Objective, "BLOCK_CELLS", 800)  # several blocks on a small corpus
    fits = [CRF(c1=c1, c2=c2, max_iterations=60, n_threads=threads).fit(batch, y) for threads in (1, 2)]
    one, two = fits
    assert one.n_iter_ == two.n_iter_
    assert np.array_equal(one.state_weights_, two.state_weights_)
    assert np.array_equal(one.transitions_, two.transitions_)
    assert np.array_equal(one.start_weights_, two.start_weights_) and np.array_equal(one.end_weights_, two.end_weights_)


def _blas_threads() -> list[int]:
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


def _in_a_thread(function) -> dict:
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(function()))
    thread.start()
    thread.join(20)
    return out


def test_blas_limit_around_worker_threads_and_after():
    """As in evaluate: the main thread holds single_threaded_blas around worker threads that enter
    it too. The limit holds throughout, the original comes back after, and a later block entered
    from another thread still takes effect (the main thread gave up control of the limit)."""
    original = _blas_threads()
    if not original or max(original) == 1:
        pytest.skip("BLAS runs one thread here already: nothing to tell apart")

    def nested() -> dict:
        with single_threaded_blas():
            return {"worker": _blas_threads()}

    with single_threaded_blas():
        inside = _in_a_thread(nested)
        inside["main"] = _blas_threads()
    after = _blas_threads()
    later = _in_a_thread(nested)
    assert inside == {"worker": [1] * len(original), "main": [1] * len(original)}
    assert after == original
    assert later == {"worker": [1] * len(original)}
    assert _blas_threads() == original
