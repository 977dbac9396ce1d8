"""The HMM baseline: proper probabilities, decoding through the shared recursions against a
direct brute-force HMM, Baum-Welch monotonicity, persistence, and accuracy against NLTK's TnT."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import logsumexp

from crf import CRF, HMM, ModelFileError, SequenceBatch
from crf import _chain as chain
from crf._lattice import ngram_viterbi
from crf.hmm import valid_contexts

SETTINGS = [
    dict(order=1, transition_smoothing="add-k", emission_smoothing="add-k", k=0.3),
    dict(order=2, transition_smoothing="add-k", emission_smoothing="add-k", k=0.3),
    dict(order=1, transition_smoothing="interpolation", emission_smoothing="suffix"),
    dict(order=2, transition_smoothing="interpolation", emission_smoothing="suffix"),
    dict(order=2, transition_smoothing="interpolation", emission_smoothing="suffix", capitalization=True),
]


def sample_corpus(seed: int, n_sentences: int, n_labels: int = 3, n_words: int = 8, max_length: int = 7):
    """Sentences drawn from a random first-order HMM over words w0.. (some capitalised)."""
    rng = np.random.default_rng(seed)
    start = rng.dirichlet(np.ones(n_labels))
    transitions = rng.dirichlet(np.ones(n_labels) * 0.5, size=n_labels)
    emissions = rng.dirichlet(np.ones(n_words) * 0.3, size=n_labels)
    words = [f"w{i}" if i % 3 else f"W{i}" for i in range(n_words)]
    X, y = [], []
    for _ in range(n_sentences):
        length = int(rng.integers(1, max_length + 1))
        labels = [int(rng.choice(n_labels, p=start))]
        for _ in range(length - 1):
            labels.append(int(rng.choice(n_labels, p=transitions[labels[-1]])))
        X.append([words[rng.choice(n_words, p=emissions[label])] for label in labels])
        y.append([f"T{label}" for label in labels])
    return X, y


def direct_joint_log_probability(model: HMM, words, labels) -> float:
    """log p(x, y) read term by term from the model's tables, without the chain recursions."""
    H = model.n_hidden_
    table = model.log_transitions_
    emissions = model.emissions(words)
    context = [H] * model.order  # start symbols
    total = 0.0
    for position, label in enumerate(labels):
        total += table[tuple(context + [label])] + emissions[position, label]
        context = context[1:] + [label]
    return total + table[tuple(context + [H])]


@pytest.mark.parametrize("settings", SETTINGS)
def test_probabilities_sum_to_one(settings):
    X, y = sample_corpus(0, 60)
    model = HMM(**settings).fit(X, y)
    H = model.n_hidden_
    valid = valid_contexts(H, model.order)
    seen = model.transition_counts_.sum(axis=-1) > 0
    rows = np.exp(model.log_transitions_)[valid & seen]
    np.testing.assert_allclose(rows.sum(axis=-1), 1.0, atol=1e-12)
    assert np.all(rows[..., :H].sum(axis=-1) < 1.0)  # the end symbol has its share
    emitted = model.emission_counts_.sum(axis=0) > 0
    per_label = np.exp(model.log_emissions_[:-1]).sum(axis=0)
    if settings["emission_smoothing"] == "add-k":
        per_label = per_label + np.exp(model.log_emissions_[-1])  # the unknown-word symbol
    else:  # known words share 1 - P(unknown | label)
        per_label = per_label + model.unknown_given_label_
        suffix = np.exp(model.suffix_model_.log_probabilities)
        np.testing.assert_allclose(suffix.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(per_label[emitted], 1.0, atol=1e-12)


@pytest.mark.parametrize("settings", SETTINGS)
def test_viterbi_and_log_likelihood_match_a_direct_hmm(settings):
    X, y = sample_corpus(1, 80)
    model = HMM(**settings).fit(X, y)
    test_X = sample_corpus(2, 12, max_length=4)[0] + [["W0", "unseen", "w1"], ["Unseen"]]
    predicted = model.predict(test_X)
    per_sequence = model.log_likelihood(test_X, per_sequence=True)
    L = len(model.classes_)
    for words, path, log_p in zip(test_X, predicted, per_sequence):
        # every hidden label sequence (capitalisation halves included), scored directly
        paths = list(itertools.product(range(model.n_hidden_), repeat=len(words)))
        scores = np.array([direct_joint_log_probability(model, words, list(p)) for p in paths])
        assert log_p == pytest.approx(logsumexp(scores), abs=1e-9)
        best = paths[int(np.argmax(scores))]
        assert path == [model.classes_[h % L] for h in best]
    assert model.log_likelihood(test_X) == pytest.approx(per_sequence.sum())
    marginals = model.marginals(test_X)
    np.testing.assert_allclose(marginals.sum(axis=1), 1.0, atol=1e-9)


@pytest.mark.parametrize("order", [1, 2])
def test_sparse_viterbi_matches_dense_viterbi(order):
    """Decoding over the finite-emission states only gives the dense chain Viterbi's labels."""
    rng = np.random.default_rng(order)
    for _ in range(60):
        H = int(rng.integers(1, 6))
        lengths = rng.integers(1, 7, size=int(rng.integers(1, 6)))
        emissions = rng.normal(size=(int(lengths.sum()), H))
        emissions[rng.random(emissions.shape) < 0.5] = -np.inf
        table = np.round(rng.normal(size=(H + 1,) * (order + 1)), 1)  # rounded: some exact ties
        table[rng.random(table.shape) < 0.1] = -np.inf
        if order == 1:
            dense, scores = chain.viterbi(emissions, table[:H, :H], table[H, :H], table[:H, H], lengths)
        else:
            operator, start = chain.SecondOrderTransitions(table[:, :H, :H]), np.full((H + 1, H), -np.inf)
            start[H] = table[H, H, :H]
            states, scores = chain.viterbi(
                operator.state_emissions(emissions), operator, start.ravel(), table[:, :H, H].ravel(), lengths
            )
            dense = states % H
        possible = np.repeat(np.isfinite(scores), lengths)
        np.testing.assert_array_equal(ngram_viterbi(emissions, table, lengths)[possible], dense[possible])


def test_first_order_hmm_as_crf_weights():
    """An HMM is a CRF with one indicator attribute per word and log probabilities as weights."""
    X, y = sample_corpus(3, 100)
    model = HMM(order=1, transition_smoothing="add-k", emission_smoothing="add-k", k=0.5).fit(X, y)
    test_X = sample_corpus(4, 15)[0] + [["w1", "never-seen"]]
    words = [w for s in test_X for w in s]
    V = len(model.vocabulary_)
    ids = model.word_ids(words)
    ids[ids < 0] = V  # the unknown-word attribute
    batch = SequenceBatch(
        sp.csr_matrix((np.ones(ids.size), (np.arange(ids.size), ids)), shape=(ids.size, V + 1)),
        np.concatenate([[0], np.cumsum([len(s) for s in test_X])]),
    )
    L = len(model.classes_)
    crf = CRF()
    crf.classes_ = list(model.classes_)
    crf.n_attributes_ = V + 1
    crf.feature_index_ = None
    crf.attributes_ = None
    crf.state_weights_ = model.log_emissions_.copy()
    crf.transitions_ = model.log_transitions_[:L, :L].copy()
    crf.start_weights_ = model.log_transitions_[L, :L].copy()
    crf.end_weights_ = model.log_transitions_[:L, L].copy()
    # CRF.predict returns sklearn-crfsuite's object array of label lists
    assert [list(labels) for labels in crf.predict(batch)] == model.predict(test_X)
    np.testing.assert_allclose(crf.log_partition(batch), model.log_likelihood(test_X, per_sequence=True), atol=1e-10)
    for words_, log_p in zip(test_X, model.log_likelihood(test_X, per_sequence=True)):
        paths = itertools.product(range(L), repeat=len(words_))
        direct = logsumexp([direct_joint_log_probability(model, words_, list(p)) for p in paths])
        assert log_p == pytest.approx(direct, abs=1e-9)


@pytest.mark.parametrize("order", [1, 2])
def test_baum_welch_never_decreases_the_likelihood(order):
    X, y = sample_corpus(5, 40)
    unlabelled = sample_corpus(6, 150)[0]
    # k = 0 and no labelled counts in the M-step: the objective is the plain log-likelihood
    model = HMM(order=order, transition_smoothing="add-k", emission_smoothing="add-k", k=0.0).fit(X, y)
    seen = []
    model.baum_welch(unlabelled, iterations=15, tolerance=0.0, labelled_weight=0.0, callback=seen.append)
    likelihood = np.array([h.log_likelihood for h in model.em_history_])
    assert len(seen) == len(model.em_history_) >= 10
    np.testing.assert_allclose([h.objective for h in model.em_history_], likelihood)
    assert np.all(np.diff(likelihood) >= -1e-8 * np.abs(likelihood[1:]))
    assert likelihood[-1] > likelihood[0] + 1.0  # EM does improve on the supervised start
    assert model.log_likelihood(unlabelled) >= likelihood[-1] - 1e-8 * abs(likelihood[-1])
    # semi-supervised MAP-EM: the objective (likelihood + labelled joint + prior) never decreases
    model = HMM(order=order, transition_smoothing="add-k", emission_smoothing="add-k", k=0.5).fit(X, y)
    model.baum_welch(unlabelled, iterations=15, tolerance=0.0, labelled_weight=1.0)
    objective = np.array([h.objective for h in model.em_history_])
    assert np.all(np.diff(objective) >= -1e-8 * np.abs(objective[1:]))


def test_baum_welch_refuses_models_without_a_monotone_update():
    X, y = sample_corpus(7, 20)
    with pytest.raises(ValueError, match="add-k models only"):
        HMM().fit(X, y).baum_welch(X)


def test_save_load_round_trip_and_bad_files(tmp_path):
    X, y = sample_corpus(8, 60)
    test_X = sample_corpus(9, 20)[0] + [["Never", "seen", "words"]]
    for settings in SETTINGS:
        model = HMM(**settings).fit(X, y)
        path = tmp_path / "hmm.npz"
        model.save(path)
        loaded = HMM.load(path)
        assert loaded.predict(test_X) == model.predict(test_X)
        np.testing.assert_allclose(
            loaded.log_likelihood(test_X, per_sequence=True), model.log_likelihood(test_X, per_sequence=True)
        )
        assert loaded.get_params() == model.get_params()
        np.testing.assert_array_equal(loaded.log_emissions_, model.log_emissions_)  # bit for bit
        if model.suffix_model_ is not None:
            np.testing.assert_array_equal(loaded.suffix_model_.log_probabilities, model.suffix_model_.log_probabilities)
        meta, arrays = model.to_arrays()
        assert "log_emissions" not in arrays and "suffix_log_probabilities" not in arrays  # stored sparse
        # the dense tables of older files still load
        dense = {k: v for k, v in arrays.items() if not k.startswith(("known_emissions", "suffix_counts"))}
        dense["log_emissions"] = model.log_emissions_
        if model.suffix_model_ is not None:
            dense["suffix_log_probabilities"] = model.suffix_model_.log_probabilities
        assert HMM.from_arrays(meta, dense).predict(test_X) == model.predict(test_X)
    crf_path = tmp_path / "crf.npz"
    CRF(max_iterations=2).fit([[{"w": 1.0}], [{"v": 1.0}]], [["A"], ["B"]]).save(crf_path)
    with pytest.raises(ModelFileError, match="expected a 'crf.HMMTagger'"):
        HMM.load(crf_path)
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(ModelFileError):
        HMM.load(path)


def test_input_errors():
    with pytest.raises(ValueError, match="order must be 1 or 2"):
        HMM(order=3).fit([["a"]], [["A"]])
    for text in ("no", "false", 0.5):  # a string read as a switch would be true: the capitalised model, silently
        with pytest.raises(ValueError, match="capitalization must be True or False"):
            HMM(capitalization=text).fit([["a"]], [["A"]])
    for k in ("abc", float("inf"), float("nan")):
        with pytest.raises(ValueError, match="k must be a finite number >= 0"):
            HMM(k=k).fit([["a"]], [["A"]])
    for name, value in (("max_suffix", -1), ("max_suffix", True), ("rare_threshold", -2), ("block_elements", 0)):
        with pytest.raises(ValueError, match=f"{name} must be a "):  # max_suffix=-1 read memory never written
            HMM(**{name: value}).fit([["a"]], [["A"]])


def test_numpy_parameter_values_fit_save_and_load(tmp_path):
    """``np.int64`` and ``np.True_`` settings fitted, then ``save`` failed on JSON (round 26)."""
    X, y = [["a", "b", "c"], ["b", "c"]], [["A", "B", "A"], ["B", "A"]]
    model = HMM(order=np.int64(1), max_suffix=np.int64(3), capitalization=np.True_, emission_smoothing="suffix").fit(X, y)
    model.save(tmp_path / "m.npz")
    loaded = HMM.load(tmp_path / "m.npz")
    assert loaded.predict(X) == model.predict(X) and loaded.get_params()["max_suffix"] == 3
    with pytest.raises(ValueError, match="differ in length at sequence 1"):
        HMM().fit([["a"], ["b", "c"]], [["A"], ["B"]])
    with pytest.raises(ValueError, match="non-empty"):
        HMM().fit([[]], [[]])
    with pytest.raises(RuntimeError, match="not fitted"):
        HMM().predict([["a"]])
    with pytest.raises(ValueError, match="capitalization=True needs"):
        HMM(capitalization=True, emission_smoothing="add-k").fit([["a"]], [["A"]])


@pytest.mark.slow  # trains on the full EWT training set, twice on each side
def test_tnt_on_ewt_upos_is_at_least_as_accurate_as_nltk(shared_data):
    """The issue's bar: UD English EWT UPOS, same training data, both TnT variants of NLTK."""
    nltk_tnt = pytest.importorskip("nltk.tag.tnt")
    from crf.io import column, read_conllu

    folder = shared_data / "ud_english_ewt"
    train = read_conllu(folder / "en_ewt-ud-train.conllu")
    test = read_conllu(folder / "en_ewt-ud-test.conllu")
    X, y, X_test, y_test = column(train, 1), column(train, 3), column(test, 1), column(test, 3)
    gold = np.array([t for s in y_test for t in s], dtype=object)
    for capitalization in (False, True):
        ours = HMM(order=2, capitalization=capitalization).fit(X, y).score(X_test, y_test)
        reference = nltk_tnt.TnT(C=capitalization)
        reference.train([list(zip(w, t)) for w, t in zip(X, y)])
        theirs = np.mean(np.array([t for s in reference.tagdata(X_test) for _, t in s], dtype=object) == gold)
        assert ours >= theirs - 1e-12, (capitalization, ours, theirs)
        assert ours > 0.92


def test_strings_instead_of_token_lists_and_impossible_words_are_errors():
    hmm = HMM(order=1).fit([["the", "dog"]], [["D", "N"]])
    for bad in (["the dog"], "the dog"):
        with pytest.raises(TypeError, match="not strings: tokenise first"):
            hmm.predict(bad)
    mle = HMM(order=1, transition_smoothing="add-k", emission_smoothing="add-k", k=0).fit([["the", "dog"]], [["D", "N"]])
    with pytest.raises(ValueError, match="sequence 1, token 0: the word 'a' has probability 0 under every label"):
        mle.predict([["the", "dog"], ["a", "dog"]])
    assert mle.log_likelihood([["a", "dog"]]) == -np.inf  # p(x) = 0 is the right answer there
    assert mle.predict([["the", "dog"]]) == [["D", "N"]]


def test_integer_labels_keep_their_type_and_score(tmp_path):
    X, y = [["a", "b"], ["b", "a", "a"]] * 5, [[1, 2], [2, 1, 1]] * 5
    hmm = HMM(order=1, transition_smoothing="add-k", emission_smoothing="add-k", k=0.1).fit(X, y)
    assert hmm.classes_ == [1, 2] and hmm.predict(X[:1]) == [[1, 2]] and hmm.score(X, y) == 1.0
    hmm.save(tmp_path / "hmm.npz")
    assert HMM.load(tmp_path / "hmm.npz").predict(X[:1]) == [[1, 2]]


def test_a_model_whose_suffix_table_has_no_counts_saves_and_loads(tmp_path):
    """Models read from older dense files carry suffix probabilities without the counts behind them;
    saving one again must keep those probabilities (it raised AttributeError)."""
    import dataclasses

    words = [["The", "dog", "barks"], ["A", "cat", "sleeps"], ["The", "cat", "barks"]]
    tags = [["DT", "NN", "VB"], ["DT", "NN", "VB"], ["DT", "NN", "VB"]]
    model = HMM(order=2).fit(words, tags)
    model.suffix_model_ = dataclasses.replace(model.suffix_model_, counts=None)
    model.save(tmp_path / "dense.npz")
    loaded = HMM.load(tmp_path / "dense.npz")
    np.testing.assert_array_equal(loaded.suffix_model_.log_probabilities, model.suffix_model_.log_probabilities)
    assert loaded.predict([["The", "dog", "sleeps"]]) == model.predict([["The", "dog", "sleeps"]]) == [["DT", "NN", "VB"]]


def test_interpolation_with_all_weight_on_trigrams_has_no_nan_and_decodes():
    """Deterministic tiny data put every interpolation weight on the trigrams; unseen contexts then
    have probability 0 for every label (they were 0/0 = NaN, which crashed the lattice decoder)."""
    words = [["The", "dog", "barks"], ["A", "cat", "sleeps"], ["The", "cat", "barks"]]
    tags = [["DT", "NN", "VB"]] * 3
    model = HMM(order=2).fit(words, tags)
    assert model.interpolation_weights_[-1] == 1.0
    assert not np.isnan(model.log_transitions_).any()
    assert model.predict([["A", "wolf", "howls"]]) == [["DT", "NN", "VB"]]


def test_a_file_written_with_the_parameters_earlier_name_still_loads(tmp_path):
    from crf._persist import load_arrays, save_arrays

    model = HMM(block_elements=1000).fit([["a", "b"], ["b", "a"]], [["X", "Y"], ["Y", "X"]])
    model.save(tmp_path / "hmm.npz")
    meta, arrays = load_arrays(tmp_path / "hmm.npz", "crf.HMMTagger")
    meta["params"]["chunk_elements"] = meta["params"].pop("block_elements")
    save_arrays(tmp_path / "old.npz", "crf.HMMTagger", meta, arrays)
    loaded = HMM.load(tmp_path / "old.npz")
    assert loaded.block_elements == 1000 and loaded.predict([["a", "b"]]) == model.predict([["a", "b"]])
