"""ModelBundle: one file per trained model (CRF or HMM), tagging dict/string/frame input, fixed labels."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from pipeline_helpers import make_sentence

from crf import CRF, HMM, FeatureExtractor, ModelBundle, ModelFileError, load_bundle
from crf import _chain as chain
from crf._persist import load_arrays, save_arrays
from crf.hmm import BundledHMM
from crf.model import BundledCRF

COLUMNS = ["w", "pos", "chunk"]


def _corpus(n: int, seed: int) -> list[list[tuple[str, str, str]]]:
    rng = np.random.default_rng(seed)
    return [make_sentence(rng) for _ in range(n)]


@pytest.fixture(scope="module")
def train():
    return _corpus(60, 0)


@pytest.fixture(scope="module")
def test_sentences():
    return _corpus(15, 1)


@pytest.fixture(scope="module")
def crf_bundle(train):
    extractor = FeatureExtractor(columns=COLUMNS, templates=["w[0]", "pos[0]", "pos[-1]|pos[0]", "pos[1]"])
    batch = extractor.fit_transform(train)
    model = CRF(max_iterations=40, c2=0.1).fit(batch, [[row[2] for row in s] for s in train])
    source = {"dataset": {"name": "toy", "columns": COLUMNS, "label": "chunk", "scheme": "IOB2"}}
    return ModelBundle(BundledCRF(extractor, model), scheme="IOB2", input_columns=["w", "pos"], source=source)


@pytest.fixture(scope="module")
def hmm_bundle(train):
    model = HMM(order=2).fit([[row[1] for row in s] for s in train], [[row[2] for row in s] for s in train])
    return ModelBundle(BundledHMM(model, "pos"), scheme="iob2", source={"dataset": {"label": "chunk"}})


def _dicts(sentences):
    return [[{"w": w, "pos": p} for w, p, _ in s] for s in sentences]


def test_crf_round_trip_matches_the_model(crf_bundle, test_sentences, tmp_path):
    path = tmp_path / "bundle.npz"
    crf_bundle.save(path)
    loaded = load_bundle(path)
    assert (loaded.kind, loaded.labels, loaded.scheme, loaded.input_columns) == ("crf", crf_bundle.labels, "iob2", ["w", "pos"])
    assert loaded.source == crf_bundle.source
    out = loaded.tag(_dicts(test_sentences))
    batch = crf_bundle.part.extractor.transform(test_sentences)
    model = crf_bundle.model
    assert [o["labels"] for o in out] == [list(p) for p in model.predict(batch)]
    marginals, _ = model.marginals(batch)
    codes = np.concatenate(model.predict_codes(batch)[0])
    np.testing.assert_allclose(np.concatenate([o["marginals"] for o in out]), marginals[np.arange(codes.size), codes], atol=1e-10)
    expected = model.predict_segments(batch)
    got = pd.DataFrame([dict(sequence=i, **s) for i, o in enumerate(out) for s in o["segments"]])
    np.testing.assert_array_equal(got[["sequence", "start", "end"]].to_numpy(), expected[["sequence", "start", "end"]].to_numpy())
    assert list(got["type"]) == list(expected["type"])
    np.testing.assert_allclose(got["confidence"], expected["confidence"], atol=1e-10)


def test_hmm_round_trip_matches_the_model(hmm_bundle, test_sentences, tmp_path):
    path = tmp_path / "hmm.npz"
    hmm_bundle.save(path)
    loaded = load_bundle(path)
    assert loaded.kind == "hmm" and loaded.input_columns == ["pos"]
    words = [[row[1] for row in s] for s in test_sentences]
    out = loaded.tag(words)  # one input column: plain strings
    assert [o["labels"] for o in out] == hmm_bundle.model.predict(words)
    marginals = hmm_bundle.model.marginals(words)
    codes = hmm_bundle.model.predict_codes(words)
    np.testing.assert_allclose(np.concatenate([o["marginals"] for o in out]), marginals[np.arange(codes.size), codes], atol=1e-10)
    assert out == loaded.tag([[{"pos": p} for p in s] for s in words])
    assert all(0 < seg["confidence"] <= 1 + 1e-12 for o in out for seg in o["segments"])


@pytest.mark.parametrize("order", [1, 2])
def test_hmm_segment_confidence_against_enumeration(order):
    """A tiny HMM of order 1 and 2: chunk confidence equals the summed probability of the labellings
    that contain the chunk (same start, end and type) with its tokens' predicted labels."""
    X = [["a", "b", "a"], ["b", "b"], ["a", "a", "b"]]
    y = [["B-X", "I-X", "O"], ["B-X", "O"], ["O", "B-X", "I-X"]]
    model = HMM(order=order, transition_smoothing="add-k", emission_smoothing="add-k", k=0.5).fit(X, y)
    bundle = ModelBundle(BundledHMM(model, "w"), scheme="iob2")
    words = ["a", "b", "b", "a"]
    (out,) = bundle.tag([words])
    emissions = model.emissions(words)
    L, table = len(model.classes_), model.log_transitions_
    paths = np.array(list(itertools.product(range(L), repeat=len(words))))
    scores = emissions[np.arange(len(words)), paths].sum(1)
    if order == 1:
        scores += table[L, paths[:, 0]] + table[paths[:, -1], L] + table[paths[:, :-1], paths[:, 1:]].sum(1)
    else:  # label L stands for the sentence boundary
        padded = np.hstack([np.full((len(paths), 2), L), paths, np.full((len(paths), 1), L)])
        scores += table[padded[:, :-2], padded[:, 1:-1], padded[:, 2:]].sum(1)
    probability = np.exp(scores - np.logaddexp.reduce(scores))
    from crf.metrics import chunks

    classes = np.array(model.classes_, dtype=object)
    predicted = np.array([model.classes_.index(label) for label in out["labels"]])
    assert out["segments"]
    for segment in out["segments"]:
        inside = slice(segment["start"], segment["end"])
        contains = [
            ((c["start"] == segment["start"]) & (c["end"] == segment["end"]) & (c["type"] == segment["type"])).any()
            and np.array_equal(p[inside], predicted[inside])
            for p, c in ((p, chunks([list(classes[p])])) for p in paths)
        ]
        assert segment["confidence"] == pytest.approx(probability[contains].sum(), abs=1e-10)


def test_dict_and_frame_inputs_agree_and_frame_keeps_rows(crf_bundle, test_sentences):
    out = crf_bundle.tag(_dicts(test_sentences))
    rows = [(f"s{i}", w, p) for i, s in enumerate(test_sentences) for w, p, _ in s]
    frame = pd.DataFrame(rows, columns=["sentence", "w", "pos"])
    frame.index = np.arange(len(frame))[::-1] * 3 + 7  # an index that is not 0..n-1
    frame["extra"] = 1.5
    tagged = crf_bundle.tag_frame(frame)
    assert tagged.index.equals(frame.index)
    pd.testing.assert_frame_equal(tagged[frame.columns], frame)
    assert list(tagged["label"]) == [label for o in out for label in o["labels"]]
    np.testing.assert_allclose(tagged["marginal"], [m for o in out for m in o["marginals"]])
    confidence = np.full(len(frame), np.nan)
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in test_sentences])])
    for i, o in enumerate(out):
        for seg in o["segments"]:
            confidence[offsets[i] + seg["start"] : offsets[i] + seg["end"]] = seg["confidence"]
    np.testing.assert_allclose(tagged["segment_confidence"], confidence)


def test_frame_sentences_must_be_contiguous(crf_bundle):
    frame = pd.DataFrame({"sentence": [1, 1, 2, 1], "w": ["the", "dog", "a", "cat"], "pos": ["DT", "NN", "DT", "NN"]})
    with pytest.raises(ValueError, match="contiguous"):
        crf_bundle.tag_frame(frame)


def test_missing_column_names_needed_and_given(crf_bundle):
    with pytest.raises(ValueError, match=r"missing \['pos'\].*given \['w'\]"):
        crf_bundle.tag([[{"w": "the"}, {"w": "dog"}]])
    with pytest.raises(ValueError, match=r"missing \['pos'\]"):
        crf_bundle.tag_frame(pd.DataFrame({"sentence": [0], "w": ["dog"]}))
    with pytest.raises(ValueError, match="plain strings"):
        crf_bundle.tag([["the", "dog"]])


def test_empty_sentences_get_empty_results(crf_bundle, hmm_bundle):
    tokens = [{"w": "the", "pos": "DT"}, {"w": "dog", "pos": "NN"}, {"w": ".", "pos": "."}]
    both = crf_bundle.tag([[], tokens, []], fixed=[{}, {0: "B-NP"}, None])
    assert both[0] == both[2] == {"labels": [], "marginals": [], "segments": []}
    assert both[1] == crf_bundle.tag([tokens], fixed=[{0: "B-NP"}])[0]
    assert crf_bundle.tag([[]]) == [{"labels": [], "marginals": [], "segments": []}] and crf_bundle.tag([]) == []
    assert hmm_bundle.tag([[], ["DT", "NN", "."]])[0] == {"labels": [], "marginals": [], "segments": []}


def _brute_force(emissions, transitions, start, end, allowed):
    """Best path and node marginals over the allowed paths of one sequence, by enumeration."""
    T, L = emissions.shape
    paths = np.array([p for p in itertools.product(range(L), repeat=T) if all(allowed[t, p[t]] for t in range(T))])
    scores = start[paths[:, 0]] + end[paths[:, -1]] + emissions[np.arange(T), paths].sum(1)
    scores += transitions[paths[:, :-1], paths[:, 1:]].sum(1)
    probability = np.exp(scores - np.logaddexp.reduce(scores))
    marginals = np.zeros((T, L))
    for t in range(T):
        np.add.at(marginals[t], paths[:, t], probability)
    return paths[np.argmax(scores)], marginals


def test_fixed_labels_agree_with_enumeration(crf_bundle):
    sentence = [("the", "DT"), ("old", "JJ"), ("dog", "NN"), ("sees", "VB"), ("a", "DT")]
    tokens = [{"w": w, "pos": p} for w, p in sentence]
    model = crf_bundle.model
    batch = crf_bundle.part.extractor.transform([[(w, p, "O") for w, p in sentence]])
    emissions = np.asarray(batch.X @ model.state_weights_)
    labels = crf_bundle.labels
    for fixed in ({1: "B-NP"}, {0: "O", 3: "I-NP"}, {2: "B-VP", 4: "O"}):
        allowed = np.ones((len(sentence), len(labels)), dtype=bool)
        for t, label in fixed.items():
            allowed[t] = False
            allowed[t, labels.index(label)] = True
        best, marginals = _brute_force(emissions, model.transitions_, model.start_weights_, model.end_weights_, allowed)
        (out,) = crf_bundle.tag([tokens], fixed=[fixed])
        assert out["labels"] == [labels[i] for i in best]
        np.testing.assert_allclose(out["marginals"], marginals[np.arange(len(best)), best], atol=1e-10)
        for t, label in fixed.items():
            assert out["labels"][t] == label and out["marginals"][t] == pytest.approx(1.0)


def test_fixing_a_token_to_its_label_changes_only_its_marginal(crf_bundle, hmm_bundle, test_sentences):
    for bundle, sentences in ((crf_bundle, _dicts(test_sentences)), (hmm_bundle, [[r[1] for r in s] for s in test_sentences])):
        free = bundle.tag(sentences)
        fixed = [{2: o["labels"][2]} for o in free]
        constrained = bundle.tag(sentences, fixed=fixed)
        assert [o["labels"] for o in constrained] == [o["labels"] for o in free]
        for a, b in zip(free, constrained):
            assert b["marginals"][2] == pytest.approx(1.0)
            # p(y_t | x, y_2) differs from p(y_t | x) in general; the decoded path does not
            assert [s["type"] for s in a["segments"]] == [s["type"] for s in b["segments"]]


def test_fixed_label_errors(crf_bundle):
    tokens = [{"w": "the", "pos": "DT"}, {"w": "dog", "pos": "NN"}]
    with pytest.raises(ValueError, match="unknown label 'B-XX'"):
        crf_bundle.tag([tokens], fixed=[{0: "B-XX"}])
    with pytest.raises(ValueError, match="no token 5"):
        crf_bundle.tag([tokens], fixed=[{5: "O"}])


def test_tampered_bundle_is_rejected(crf_bundle, tmp_path):
    path = tmp_path / "bundle.npz"
    crf_bundle.save(path)
    meta, arrays = load_arrays(path, "crf.TaggerBundle")
    # rewrite one weight behind the checksum's back: copy the archive with the array changed
    import zipfile

    tampered = tmp_path / "tampered.npz"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(tampered, "w") as target:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename == "model/transitions.npy":
                data = data[:-8] + np.float64(123.0).tobytes()
            target.writestr(item, data)
    with pytest.raises(ModelFileError, match="checksum"):
        load_bundle(tampered)
    other = tmp_path / "other.npz"
    save_arrays(other, "crf.CRF", {}, {})
    with pytest.raises(ModelFileError, match="expected a 'crf.TaggerBundle'"):
        load_bundle(other)
    with pytest.raises(ModelFileError, match="no such model file"):
        load_bundle(tmp_path / "absent.npz")


def test_scheme_none_has_no_segments(train):
    model = HMM(order=1).fit([[r[0] for r in s] for s in train], [[r[1] for r in s] for s in train])
    bundle = ModelBundle(BundledHMM(model, "w"), scheme="none")
    words = ["the", "dog", "runs", "a", "cat", "."]
    (out,) = bundle.tag([words])
    assert out["labels"] == model.predict([words])[0] == ["DT", "NN", "VB", "DT", "NN", "."] and "segments" not in out
    frame = bundle.tag_frame(pd.DataFrame({"sentence": [0] * 6, "w": words}))
    assert "segment_confidence" not in frame and list(frame["label"]) == out["labels"]
    with pytest.raises(ValueError, match="unknown tagging scheme"):
        ModelBundle(BundledHMM(model, "w"), scheme="bilou")


def test_chain_viterbi_used_for_the_state_space(hmm_bundle):
    """Second-order HMM: the bundle's fixed-label decoding equals chain.viterbi on state masks."""
    words = ["DT", "NN", "VB", "DT", "JJ", "NN", "."]
    model = hmm_bundle.model
    (out,) = hmm_bundle.tag([words], fixed=[{4: "I-NP"}])
    transitions, start, end = model._chain_scores()
    emissions = transitions.state_emissions(model.emissions(words))
    allowed = np.ones((len(words), len(model.classes_)), dtype=bool)
    allowed[4] = np.array(model.classes_) == "I-NP"
    states, _ = chain.viterbi(emissions, transitions, start, end, [len(words)], allowed=transitions.state_emissions(allowed))
    assert out["labels"] == [model.classes_[s % len(model.classes_)] for s in states]


def test_closed_form_chunk_confidence_equals_the_constrained_recursion(crf_bundle, test_sentences):
    """First-order chains: ChunkWindows.log_probability (closed form) against
    chain.constrained_log_probability over the same windows, free and under fixed labels."""
    from crf.bundle import ChunkWindows

    model = crf_bundle.model
    batch = crf_bundle.part.extractor.transform(test_sentences)
    emissions = np.asarray(batch.X @ model.state_weights_)
    weights = (model.transitions_, model.start_weights_, model.end_weights_)
    L = len(crf_bundle.labels)
    for allowed in (None, np.random.default_rng(0).random((batch.n_tokens, L)) < 0.7):
        if allowed is not None:
            allowed[np.arange(batch.n_tokens), np.random.default_rng(1).integers(0, L, batch.n_tokens)] = True
        codes, _ = chain.viterbi(emissions, *weights, batch.lengths, allowed=allowed)
        posterior = chain.forward_backward(emissions, *weights, batch.lengths, keep_messages=True, allowed=allowed)
        masked = emissions if allowed is None else np.where(allowed, emissions, -np.inf)
        windows = ChunkWindows.of(codes, batch.offsets, crf_bundle.labels)
        assert len(windows.chunks) > 10
        closed = windows.log_probability(codes, posterior, masked, weights[0], weights[1])
        first, masks, window_offsets = windows.window_masks(codes, batch.offsets)
        recursion = chain.constrained_log_probability(
            posterior.log_alpha, posterior.log_beta, posterior.log_z, masked, weights[0], weights[1], batch.offsets,
            windows.chunks["sequence"].to_numpy(), first, masks, window_offsets,
        )  # fmt: skip
        np.testing.assert_allclose(closed, recursion, atol=1e-9)


def _best_hidden_path(model: HMM, words: list[str], fixed: dict[int, str]) -> tuple[list[str], float, float]:
    """By enumeration over the HMM's hidden label sequences whose labels agree with ``fixed``:
    (labels of the best, its joint log probability, the runner-up's); hidden label h carries
    label h % L, and in the second-order table index H stands for the sentence boundary."""
    H, L, table = model.n_hidden_, len(model.classes_), model.log_transitions_
    n, emissions = len(words), model.emissions(words)
    paths = np.array(list(itertools.product(range(H), repeat=n)))
    for t, label in fixed.items():
        paths = paths[paths[:, t] % L == model.classes_.index(label)]
    scores = emissions[np.arange(n), paths].sum(1)
    if model.order == 2:
        padded = np.hstack([np.full((len(paths), 2), H), paths, np.full((len(paths), 1), H)])
        scores += table[padded[:, :-2], padded[:, 1:-1], padded[:, 2:]].sum(1)
    else:
        scores += table[H, paths[:, 0]] + table[paths[:, -1], H] + table[paths[:, :-1], paths[:, 1:]].sum(1)
    order = np.argsort(scores)[::-1]
    runner_up = scores[order[1]] if len(order) > 1 else -np.inf
    return [model.classes_[h % L] for h in paths[order[0]]], float(scores[order[0]]), float(runner_up)


@pytest.mark.parametrize(
    "order, settings",
    [
        (2, dict(transition_smoothing="add-k", emission_smoothing="add-k", k=0.5)),
        (2, dict()),  # TnT: a known word has probability 0 under the labels it was never seen with
        (2, dict(capitalization=True)),  # 2L hidden labels
        (1, dict(capitalization=True)),
    ],
)
def test_hmm_fixed_labels_agree_with_enumeration(order, settings):
    """``tag(fixed=...)`` of an HMM bundle is the best hidden path whose labels agree with the
    fixed ones; with none of nonzero probability (a TnT known word fixed to a label it was never
    seen with) the labels are None, not an arbitrary labelling that may break the fixed labels.
    Fixing a token to the label it has changes nothing."""
    rng = np.random.default_rng(order)
    labels, vocabulary = ["A", "B", "C"], ["x", "y", "z", "w", "Xa", "Yb", "going", "played"]
    X, y = [], []
    for _ in range(20):
        n = int(rng.integers(2, 6))
        X.append([str(w) for w in rng.choice(vocabulary, n)])
        y.append([str(t) for t in rng.choice(labels, n)])
    model = HMM(order=order, **settings).fit(X, y)
    bundle = ModelBundle(BundledHMM(model, "w"), scheme="none")
    impossible = 0
    for _ in range(60):
        n = int(rng.integers(1, 5))
        words = [str(w) for w in rng.choice(vocabulary + ["Unseen", "unseen"], n)]
        chosen = rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False)
        fixed = {int(t): str(rng.choice(labels)) for t in chosen}
        best, score, runner_up = _best_hidden_path(model, words, fixed)
        (out,) = bundle.tag([words], fixed=[fixed])
        if not np.isfinite(score):
            impossible += 1
            assert out["labels"] == [None] * n
            continue
        if not np.isclose(score, runner_up):  # a tie may go either way
            assert out["labels"] == best, (words, fixed)
        assert all(out["labels"][t] == label for t, label in fixed.items())
        (free,) = bundle.tag([words])
        t = int(rng.integers(n))
        (same,) = bundle.tag([words], fixed=[{t: free["labels"][t]}])
        assert same["labels"] == free["labels"]
        # the decode-only call decodes alike and scores the path as the enumeration does
        allowed = bundle._allowed([fixed], np.array([0, n]))
        quick = bundle.tag_arrays({"w": np.array(words, dtype=object)}, np.array([n]), allowed, marginals=False)
        assert [bundle.labels[c] for c in quick.codes] == out["labels"]
        assert quick.scores[0] == pytest.approx(score) and quick.segments is None and np.isnan(quick.marginals).all()
    if settings.get("emission_smoothing") == "add-k":
        assert impossible == 0
    elif order == 2 and not settings:
        assert impossible > 0  # the case is exercised
