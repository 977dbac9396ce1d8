"""Brown clusters (crf.clusters) and the cluster view of the feature extractor."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from crf.clusters import brown_clusters, brown_merges, count_bigrams, iter_words, path_prefixes, read_paths, write_paths
from crf.features import FeatureExtractor
from crf.io import DataFormatError

TINY = [s.split() for s in ["the cat runs", "the dog runs", "a cat sleeps", "a dog sleeps"]]


def test_tiny_corpus_merges_words_with_identical_contexts_first():
    # cat/dog, runs/sleeps and the/a have the same neighbours in proportion: merging either pair
    # keeps the mutual information (gain 0), any other merge loses some (the determiner, noun and
    # verb positions differ, and the sentence boundary "" precedes the determiners and follows the
    # verbs). Words enter by decreasing count, ties by the word.
    counts = count_bigrams(iter(TINY))
    words, merges, gains = brown_merges(counts, n_clusters=10)
    assert words.tolist() == ["", "a", "cat", "dog", "runs", "sleeps", "the"]
    assert merges.shape == (6, 2)
    first = [{str(words[a]), str(words[b])} for a, b in merges[:3]]
    assert sorted(map(sorted, first)) == [["a", "the"], ["cat", "dog"], ["runs", "sleeps"]]
    # by hand, over the 16 bigrams "" -> D -> N -> V -> "" (4 each) of the classes D = {a, the},
    # N = {cat, dog}, V = {runs, sleeps}: the mutual information is log 4; merging any two of the
    # four classes halves the choices one class has, -log 2 (a tie, to the lowest slots: "" and N);
    # then D and V fill the two places beside "" + N alike (0), and the last merge costs log 2
    assert np.allclose(gains, [0, 0, 0, -np.log(2), 0, -np.log(2)], atol=1e-12)
    assert {str(words[merges[3, 0]]), int(merges[3, 1])} == {"", 8}  # node 8: N, made by step 1
    paths = brown_clusters(TINY, n_clusters=10)
    for a, b in [("cat", "dog"), ("runs", "sleeps"), ("a", "the")]:
        assert paths[a][:-1] == paths[b][:-1] and paths[a] != paths[b]
    assert len(set(paths.values())) == 6 and set("".join(paths.values())) <= {"0", "1"}


def _mutual_information(assign, B, left, right):
    """sum_ij c_ij log(c_ij / (l_i r_j)) over the classes of the entered words (assign >= 0)."""
    k = assign.max() + 1
    entered = assign >= 0
    rows, cols = np.nonzero(B)
    keep = entered[rows] & entered[cols]
    P = np.zeros((k, k))
    np.add.at(P, (assign[rows[keep]], assign[cols[keep]]), B[rows[keep], cols[keep]])
    L = np.bincount(assign[entered], left[entered], minlength=k)
    R = np.bincount(assign[entered], right[entered], minlength=k)
    i, j = np.nonzero(P)
    return float(np.sum(P[i, j] * np.log(P[i, j] / (L[i] * R[j]))))


@pytest.mark.parametrize("window", [2, 4, 30])
def test_merges_match_brute_force_greedy_search(window):
    rng = np.random.default_rng(window)
    vocab = [f"w{i}" for i in range(10)]
    sentences = [[vocab[min(int(rng.zipf(1.6)) - 1, 9)] for _ in range(rng.integers(2, 9))] for _ in range(80)]
    counts = count_bigrams(sentences)
    words, merges, gains = brown_merges(counts, n_clusters=window)
    order = [counts.words.tolist().index(w) for w in words]
    B = counts.bigrams[order][:, order].toarray().astype(float)
    left, right = B.sum(axis=1), B.sum(axis=0)
    n = B.sum()
    classes: list[tuple[int, set[int]]] = []  # (tree node, words)
    step = 0

    def merge_best() -> None:
        nonlocal step
        assign = np.full(words.size, -1)
        for c, (_, members) in enumerate(classes):
            assign[list(members)] = c
        base = _mutual_information(assign, B, left, right)
        best = None
        for i, j in itertools.combinations(range(len(classes)), 2):
            merged = np.where(assign == j, i, assign)
            merged = np.where(merged > j, merged - 1, merged)
            gain = _mutual_information(merged, B, left, right) - base
            if best is None or gain > best[0] + 1e-9:
                best = (gain, i, j)
        gain, i, j = best
        assert {classes[i][0], classes[j][0]} == set(merges[step].tolist())
        assert gains[step] == pytest.approx(gain / n, abs=1e-9)
        classes[i] = (words.size + step, classes[i][1] | classes[j][1])
        del classes[j]
        step += 1

    for w in range(words.size):
        classes.append((w, {w}))
        if len(classes) == window + 1:
            merge_best()
    while len(classes) > 1:
        merge_best()
    assert step == words.size - 1


def test_counting_streams_in_chunks_and_min_count():
    sentences = TINY * 7
    whole = count_bigrams(sentences)
    blocked = count_bigrams((s for s in sentences), block_tokens=4)
    assert sorted(whole.words.tolist()) == sorted(blocked.words.tolist())
    a, b = np.argsort(whole.words), np.argsort(blocked.words)
    assert np.array_equal(whole.counts[a], blocked.counts[b])
    assert (whole.bigrams[a][:, a] != blocked.bigrams[b][:, b]).nnz == 0
    assert whole.bigrams.sum() == sum(len(s) + 1 for s in sentences)  # with the boundaries
    assert brown_clusters(blocked, n_clusters=3) == brown_clusters(iter(sentences), n_clusters=3)
    windowed = brown_clusters(sentences, n_clusters=4)  # final classes: {""}, {a, the}, {cat, dog}, {runs, sleeps}
    assert len(set(windowed.values())) == 3
    assert windowed["a"] == windowed["the"] and windowed["cat"] == windowed["dog"] and windowed["runs"] == windowed["sleeps"]
    rare = brown_clusters(TINY + [["zebra"]], n_clusters=3, min_count=2)
    assert "zebra" not in rare and "cat" in rare
    with pytest.raises(ValueError, match="no words"):
        count_bigrams([[], []])
    with pytest.raises(ValueError, match="min_count=9"):
        brown_clusters(TINY, min_count=9)


def test_paths_file_round_trip_and_errors(tmp_path):
    paths = brown_clusters(TINY, n_clusters=2)
    file = tmp_path / "paths.txt"
    write_paths(file, paths, {"the": 3})
    assert read_paths(file) == paths
    assert file.read_text().splitlines()[list(paths).index("the")].split("\t")[1:] == ["the", "3"]
    assert path_prefixes({"a": "0110", "b": "1"}, 2) == {"a": "01", "b": "1"}
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        read_paths(tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DataFormatError, match="empty.txt:1: .*no words"):
        read_paths(empty)
    for text, problem in [
        ("01\tcat\t2\n0x1\tdog\t1\n", ":2: path '0x1'"),
        ("01 cat 2\n", ":1: expected"),
        ("01\tcat\t2\n11\tcat\t1\n", ":2: word 'cat' is listed twice"),
        ("01\tcat\tmany\n", ":1: count"),
    ]:
        bad = tmp_path / "bad.txt"
        bad.write_text(text)
        with pytest.raises(DataFormatError, match=problem):
            read_paths(bad)
    with pytest.raises(ValueError, match="tab"):
        write_paths(tmp_path / "x.txt", {"a\tb": "0"})


def test_pool_files_stream_and_refuse_empty_or_missing(tmp_path):
    pool = tmp_path / "pool.txt"
    pool.write_text("-DOCSTART- -X- O\n\nthe DT\ncat NN\n\n\na DT\ndog NN\n")
    assert list(iter_words([pool])) == [["the", "cat"], ["a", "dog"]]
    ud = tmp_path / "pool.conllu"
    ud.write_text("# text = I'm here\n1-2\tI'm\t_\n1\tI\tI\n2\t'm\tbe\n3\there\there\n\n# x\n1\tOK\tok\n")
    assert list(iter_words([ud, pool])) == [["I", "'m", "here"], ["OK"], ["the", "cat"], ["a", "dog"]]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="empty.txt:1: the text pool file holds no words"):
        list(iter_words([pool, empty]))
    with pytest.raises(FileNotFoundError, match="nothere.txt"):
        list(iter_words([tmp_path / "nothere.txt"]))


def _extractor(file, **view):
    return FeatureExtractor(
        columns=["w", "y"],
        templates=["c2[-1]", "c2[0]", "c9[0]", "c2[0]|c9[1]"],
        views={
            "c2": {"column": "w", "fn": "cluster", "path": str(file), "n": 2},
            "c9": {"column": "w", "fn": "cluster", "path": str(file), **view},
        },
        bos_eos=False,
    )


def test_cluster_view_at_offsets_unknown_words_and_saved_state(tmp_path):
    file = tmp_path / "paths.txt"
    write_paths(file, {"the": "00", "a": "01", "cat": "100", "dog": "101", "runs": "11", "walks": "110"})
    train = [[("the", "O"), ("cat", "O"), ("runs", "O")], [("a", "O"), ("dog", "O")]]
    extractor = _extractor(file, n=0).fit(train)
    names = extractor.attribute_names()

    def attributes(sentences):
        batch = extractor.transform(sentences)
        return [sorted(names[batch.X.indices[batch.X.indptr[t] : batch.X.indptr[t + 1]]]) for t in range(batch.X.shape[0])]

    assert attributes(train[:1]) == [
        ["c2[0]=00", "c2[0]|c9[1]=00|100", "c9[0]=00"],
        ["c2[-1]=00", "c2[0]=10", "c2[0]|c9[1]=10|11", "c9[0]=100"],
        ["c2[-1]=10", "c2[0]=11", "c9[0]=11"],
    ]
    # a word without a path ("zebra") has no cluster value: no attribute, and neither do the template
    # cells that read it; "01|100" (a cat) was never seen in training, so it is no attribute either
    assert attributes([[("a", "O"), ("cat", "O"), ("zebra", "O")]]) == [
        ["c2[0]=01", "c9[0]=01"],
        ["c2[-1]=01", "c2[0]=10", "c9[0]=100"],
        ["c2[-1]=10"],
    ]
    # the saved state holds the look-up tables: the paths file is not read again
    state = extractor.state_arrays()
    file.unlink()
    restored = FeatureExtractor.from_state(extractor.config(), state)
    test = [[("dog", "O"), ("the", "O"), ("zebra", "O"), ("walks", "O")]]
    assert (restored.transform(test).X != extractor.transform(test).X).nnz == 0
    # "walks", unseen in training, gets the 2-bit cluster of "runs" through the saved table
    batch = restored.transform(test)
    walks = names[batch.X.indices[batch.X.indptr[3] : batch.X.indptr[4]]].tolist()
    assert "c2[0]=11" in walks
    assert restored.attribute_names().tolist() == names.tolist()


def test_cluster_view_refuses_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="view 'c2': a cluster view needs a 'path'"):
        FeatureExtractor(columns=["w"], templates=["c2[0]"], views={"c2": {"column": "w", "fn": "cluster", "n": 2}})
    with pytest.raises(ValueError, match="prefix length"):
        FeatureExtractor(columns=["w"], templates=["c[0]"], views={"c": {"column": "w", "fn": "cluster", "path": "p", "n": -1}})
    missing = _extractor(tmp_path / "none.txt", n=4)
    with pytest.raises(FileNotFoundError, match="none.txt"):
        missing.fit([[("the", "O")]])


def test_cluster_features_save_and_load_with_a_tagger_bundle(tmp_path):
    from crf import CRF, ModelBundle
    from crf.model import BundledCRF

    file = tmp_path / "paths.txt"
    write_paths(file, {"the": "00", "a": "01", "cat": "100", "dog": "101", "runs": "11", "sleeps": "110"})
    train = [[("the", "B-NP"), ("cat", "I-NP"), ("runs", "B-VP")], [("a", "B-NP"), ("dog", "I-NP")]] * 3
    extractor = FeatureExtractor(
        columns=["w", "chunk"],
        templates=["c[-1]", "c[0]", "c[1]"],
        views={"c": {"column": "w", "fn": "cluster", "path": str(file), "n": 2}},
    )
    model = CRF(max_iterations=30, c2=0.1).fit(extractor.fit_transform(train), [[r[1] for r in s] for s in train])
    bundle = ModelBundle(BundledCRF(extractor, model), scheme="IOB2", input_columns=["w"])
    bundle.save(tmp_path / "bundle")
    file.unlink()
    loaded = ModelBundle.load(tmp_path / "bundle")
    # "sleeps" never appeared in training: its cluster "11" (that of "runs") tags it as a verb chunk
    sentences = [["a", "cat", "sleeps"], ["the", "dog", "zebra"]]
    assert [t["labels"] for t in loaded.tag(sentences)] == [t["labels"] for t in bundle.tag(sentences)]
    assert loaded.tag(sentences)[0]["labels"] == ["B-NP", "I-NP", "B-VP"]
