"""Brown word clusters learned from unlabelled text, as bit-string paths.

Brown clustering (Brown et al. 1992) merges word classes greedily so that the mutual information
between the classes of adjacent words drops the least. This is the windowed variant of Liang
(2005): words are taken by decreasing frequency; the ``n_clusters`` most frequent start as one
class each; every further word enters as a new class and the best pair of the ``n_clusters + 1``
active classes is merged; when every word has entered, the remaining classes are merged down to
one. Those last merges make a binary tree over the final classes (the class kept on the ``0`` side,
the one absorbed on the ``1`` side); a word's *path* is the string of bits from the root to its
class (as Liang's ``wcluster`` writes them), so words that share a long prefix behave alike.
Prefixes of 4, 6, 10 and 20 bits are the usual features (Koo et al. 2008; Ratinov & Roth 2009; Turian et al. 2010).

The statistics are the bigram counts of the sentences, each framed by a boundary word that starts
and ends it (the empty string ``""``: sentence-initial and -final words get a context; it is
clustered like a word, takes one of the classes, and gets no path). They are a sparse matrix
counted over a stream of sentences in blocks: a pool larger than memory is read once, never held.
The merge losses of all active pairs are kept in an ``(m+1, m+1)`` matrix and updated after each
merge in ``O(m^2)`` (Liang's update: for the other pairs only the terms of the merged classes
change), by small Numba kernels that take logarithms of non-zero counts only.

Paths files use the format of Liang's ``wcluster``: ``path<TAB>word<TAB>count`` a line.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from .io import DataFormatError, atomic_write, decoded_lines

log = logging.getLogger(__name__)

BOUNDARY = ""  # the sentence boundary word of the counts (no path is given to it)

__all__ = ["BigramCounts", "brown_clusters", "count_bigrams", "read_paths", "write_paths", "path_prefixes"]


class BigramCounts:
    """Word counts and within-sentence bigram counts of a text pool.

    Attributes
    ----------
    words: (V,) str array, the vocabulary (in the order met, block by block); ``words[0]`` is the
        sentence boundary ``""``.
    counts: (V,) int64, how often each word occurs (the boundary: twice per sentence).
    bigrams: (V, V) CSR int64 matrix, ``bigrams[a, b]`` = how often ``b`` directly follows ``a``
        in a sentence framed by boundaries.
    """

    def __init__(self, words: np.ndarray, counts: np.ndarray, bigrams: sp.csr_matrix) -> None:
        self.words = words
        self.counts = counts
        self.bigrams = bigrams

    @property
    def n_tokens(self) -> int:
        """How many tokens the pool holds (the boundaries not counted)."""
        return int(self.counts[1:].sum())


def count_bigrams(sentences: Iterable[Sequence[str]], block_tokens: int = 200_000) -> BigramCounts:
    """Count words and within-sentence bigrams over a stream of sentences (lists of words).

    ``sentences`` may be a generator: it is read once, in blocks of about ``block_tokens`` tokens,
    and only the distinct words and distinct bigrams are kept. A sentence may also be a row list
    of a CoNLL file (tuples): then its first cell is the word.
    """
    index: dict[str, int] = {BOUNDARY: 0}
    counts = np.zeros(0, dtype=np.int64)
    bigrams: sp.csr_matrix | None = None
    tokens: list[str] = []
    starts: list[int] = []  # position in `tokens` of each sentence's first token

    def flush() -> None:
        nonlocal counts, bigrams
        if not tokens:
            return
        uniques, inverse = np.unique(np.asarray(tokens, dtype=object).astype(str), return_inverse=True)
        ids = np.fromiter((index.setdefault(u, len(index)) for u in uniques.tolist()), dtype=np.int64, count=uniques.size)
        codes = ids[inverse]
        size = len(index)
        grown = np.zeros(size, dtype=np.int64)
        grown[: counts.size] = counts
        counts = grown + np.bincount(codes, minlength=size)
        follows = np.ones(codes.size, dtype=bool)
        follows[np.asarray(starts, dtype=np.int64)] = False  # a sentence's first token follows nothing
        right = np.flatnonzero(follows)
        block = sp.csr_matrix((np.ones(right.size, dtype=np.int64), (codes[right - 1], codes[right])), shape=(size, size))
        if bigrams is not None:
            bigrams.resize((size, size))
            block = block + bigrams
        block.sum_duplicates()
        bigrams = block
        tokens.clear()
        starts.clear()

    for sentence in sentences:
        if len(sentence) == 0:
            continue
        starts.append(len(tokens))
        first = sentence[0]
        tokens.append(BOUNDARY)
        tokens.extend(sentence if isinstance(first, str) else (row[0] for row in sentence))
        tokens.append(BOUNDARY)
        if len(tokens) >= block_tokens:
            flush()
    flush()
    if len(index) == 1:
        raise ValueError("the text pool holds no words")
    words = np.array(list(index), dtype=str)
    return BigramCounts(words, counts, bigrams.tocsr())


# --- the merge losses ------------------------------------------------------------------------
# Counts, not probabilities: with N bigrams, the mutual information is sum(f) / N + log N where
# f(c, l, r) = c log(c / (l r)) over the class pairs' bigram counts c and the classes' left and right
# marginals l, r; a merge changes it by (change of sum f) / N. The kernels below only take logs of
# non-zero counts, so a rare word's mostly empty row costs little.


def _f(count: float, log_left: float, log_right: float) -> float:  # pragma: no cover - compiled
    return count * (np.log(count) - log_left - log_right) if count > 0.0 else 0.0


def _apply_term(P, left, right, active, gain, k, sign):  # pragma: no cover - compiled
    """gain[i, j] += sign * T(ij, k) for the active pairs i < j (neither is k): T the change of the
    terms with class k when classes i and j merge."""
    m = P.shape[0]
    log_lk, log_rk = np.log(left[k]) if left[k] > 0 else 0.0, np.log(right[k]) if right[k] > 0 else 0.0
    alone = np.zeros(m)
    for i in range(m):
        if active[i] and i != k:
            li = np.log(left[i]) if left[i] > 0 else 0.0
            ri = np.log(right[i]) if right[i] > 0 else 0.0
            alone[i] = _f(P[i, k], li, log_rk) + _f(P[k, i], log_lk, ri)
    for i in range(m):
        if not active[i] or i == k:
            continue
        for j in range(i + 1, m):
            if not active[j] or j == k:
                continue
            value = -alone[i] - alone[j]
            c = P[i, k] + P[j, k]
            if c > 0.0:
                value += c * (np.log(c) - np.log(left[i] + left[j]) - log_rk)
            d = P[k, i] + P[k, j]
            if d > 0.0:
                value += d * (np.log(d) - log_lk - np.log(right[i] + right[j]))
            gain[i, j] += sign * value


def _set_row(P, left, right, active, gain, x):  # pragma: no cover - compiled
    """gain[min(x, j), max(x, j)] = the change of sum f on merging classes x and j, from scratch,
    for every active j; -inf for the inactive ones."""
    m = P.shape[0]
    log_l = np.zeros(m)
    log_r = np.zeros(m)
    for i in range(m):
        log_l[i] = np.log(left[i]) if left[i] > 0 else 0.0
        log_r[i] = np.log(right[i]) if right[i] > 0 else 0.0
    rows = np.zeros(m)
    cols = np.zeros(m)
    for i in range(m):
        if not active[i]:
            continue
        for j in range(m):
            if active[j] and P[i, j] > 0.0:
                q = _f(P[i, j], log_l[i], log_r[j])
                rows[i] += q
                cols[j] += q
    for j in range(m):
        if j == x:
            continue
        a, b = min(x, j), max(x, j)
        if not active[j]:
            gain[a, b] = -np.inf
            continue
        old = rows[x] + rows[j] + cols[x] + cols[j]
        old -= _f(P[x, x], log_l[x], log_r[x]) + _f(P[x, j], log_l[x], log_r[j])
        old -= _f(P[j, x], log_l[j], log_r[x]) + _f(P[j, j], log_l[j], log_r[j])
        log_lxj, log_rxj = np.log(left[x] + left[j]), np.log(right[x] + right[j])
        new = _f(P[x, x] + P[x, j] + P[j, x] + P[j, j], log_lxj, log_rxj)
        for k in range(m):
            if not active[k] or k == x or k == j:
                continue
            new += _f(P[x, k] + P[j, k], log_lxj, log_r[k]) + _f(P[k, x] + P[k, j], log_l[k], log_rxj)
        gain[a, b] = new - old


_lock = threading.Lock()
_kernels: dict[str, object] = {}


def _kernel(name: str):
    """The kernel ``name`` compiled with Numba on first use (cached on disk); plain Python without
    Numba."""
    with _lock:
        if name not in _kernels:
            try:
                import numba
            except ImportError:  # pragma: no cover - numba is a dependency
                log.warning("numba is not installed: Brown clustering runs as plain Python (slow)")
                _kernels["_f"] = _f
                _kernels[name] = globals()[name]
            else:
                if "_f" not in _kernels:
                    _kernels["_f"] = numba.njit(cache=True, inline="always")(_f)
                    globals()["_f"] = _kernels["_f"]  # the compiled kernels call the compiled _f
                _kernels[name] = numba.njit(cache=True, nogil=True)(globals()[name])
    return _kernels[name]


class _Merger:
    """The active classes' bigram counts and the losses of merging each pair (upper triangle)."""

    def __init__(self, size: int) -> None:
        self.P = np.zeros((size, size))  # P[i, j]: bigrams class i -> class j among entered words
        self.left = np.zeros(size)  # occurrences of the class as a bigram's left word (all bigrams)
        self.right = np.zeros(size)
        self.active = np.zeros(size, dtype=bool)
        self.gain = np.full((size, size), -np.inf)  # change of sum f on merging i < j; -inf if not a pair
        self._term = _kernel("_apply_term")
        self._row = _kernel("_set_row")

    def _update(self, k: int, sign: float) -> None:
        self._term(self.P, self.left, self.right, self.active, self.gain, k, sign)

    def add(self, slot: int, into: np.ndarray, out: np.ndarray, loop: float, left: float, right: float) -> None:
        """A new class in ``slot`` with ``into[i]`` bigrams class i -> it, ``out[i]`` it -> class i."""
        self.P[:, slot], self.P[slot, :], self.P[slot, slot] = into, out, loop
        self.left[slot], self.right[slot] = left, right
        self._update(slot, 1.0)
        self.active[slot] = True
        self._row(self.P, self.left, self.right, self.active, self.gain, slot)

    def best(self) -> tuple[int, int]:
        flat = int(np.argmax(self.gain))
        return divmod(flat, self.gain.shape[0])

    def merge(self, a: int, b: int) -> None:
        """Merge class ``b`` into class ``a``; slot ``b`` becomes free."""
        self._update(a, -1.0)
        self._update(b, -1.0)
        P = self.P
        P[a, :] += P[b, :]
        P[:, a] += P[:, b]
        P[b, :] = 0.0
        P[:, b] = 0.0
        self.left[a] += self.left[b]
        self.right[a] += self.right[b]
        self.left[b] = self.right[b] = 0.0
        self.active[b] = False
        self.gain[b, :] = self.gain[:, b] = -np.inf
        self._update(a, 1.0)
        self._row(self.P, self.left, self.right, self.active, self.gain, a)


def brown_merges(counts: BigramCounts, n_clusters: int, min_count: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The merge sequence of windowed Brown clustering.

    Returns ``(words, merges, gains)``: ``words`` (V',) the clustered words (count >= ``min_count``)
    in order of entry (decreasing count, ties by the word); ``merges`` (V'-1, 2) int64, row ``t`` the
    tree nodes (kept, absorbed) merged at step ``t`` (nodes ``0 .. V'-1`` are the words, node
    ``V' + t`` is made by step ``t``); ``gains`` (V'-1,) the change of the adjacent-class mutual
    information (nats) of each merge (<= 0), measured on the bigrams among entered words.
    """
    if n_clusters < 1:
        raise ValueError(f"n_clusters={n_clusters}: must be at least 1")
    keep = np.flatnonzero(counts.counts >= min_count)
    if keep.size == 0:
        raise ValueError(f"no word occurs min_count={min_count} times in the text pool")
    order = keep[np.lexsort((counts.words[keep], -counts.counts[keep]))]
    words = counts.words[order]
    B = counts.bigrams[order][:, order].tocsr()
    n_bigrams = max(float(counts.bigrams.sum()), 1.0)
    left = np.asarray(counts.bigrams.sum(axis=1)).ravel()[order].astype(float)
    right = np.asarray(counts.bigrams.sum(axis=0)).ravel()[order].astype(float)
    Bt = B.T.tocsr()
    V = words.size
    size = min(n_clusters, V) + 1
    merger = _Merger(size)
    slot_of_word = np.full(V, -1, dtype=np.int64)
    node_of_slot = np.full(size, -1, dtype=np.int64)
    merges = np.zeros((max(V - 1, 0), 2), dtype=np.int64)
    gains = np.zeros(max(V - 1, 0))
    step = 0

    def merge_best() -> None:
        nonlocal step
        a, b = merger.best()
        gains[step] = merger.gain[a, b] / n_bigrams
        merges[step] = node_of_slot[a], node_of_slot[b]
        merger.merge(a, b)
        slot_of_word[slot_of_word == b] = a
        node_of_slot[a], node_of_slot[b] = V + step, -1
        step += 1

    for w in range(V):
        slot = int(np.flatnonzero(node_of_slot < 0)[0])
        out_cols, out_data = B.indices[B.indptr[w] : B.indptr[w + 1]], B.data[B.indptr[w] : B.indptr[w + 1]]
        in_rows, in_data = Bt.indices[Bt.indptr[w] : Bt.indptr[w + 1]], Bt.data[Bt.indptr[w] : Bt.indptr[w + 1]]
        out_slots, in_slots = slot_of_word[out_cols], slot_of_word[in_rows]
        out = np.bincount(out_slots[out_slots >= 0], out_data[out_slots >= 0], minlength=size).astype(float)
        into = np.bincount(in_slots[in_slots >= 0], in_data[in_slots >= 0], minlength=size).astype(float)
        loop = float(B[w, w])
        slot_of_word[w] = slot
        node_of_slot[slot] = w
        merger.add(slot, into, out, loop, left[w], right[w])
        if merger.active.sum() == size:
            merge_best()
        if (w + 1) % 5000 == 0:
            log.info("brown clustering: %d of %d words entered", w + 1, V)
    while merger.active.sum() > 1:
        merge_best()
    return words, merges, gains


def _paths(n_words: int, merges: np.ndarray, n_clusters: int) -> list[str]:
    """Each word's bit string (Liang's ``wcluster`` paths): the path from the root of the tree of
    the last ``min(n_clusters, n_words) - 1`` merges (those of the final classes; ``0`` the kept
    side) to the final class that holds the word. The words of one class share its path."""
    n_final = min(n_clusters, n_words) - 1
    if n_final == 0:
        return ["0"] * n_words
    prefix = [""] * (n_words + merges.shape[0])
    for t in range(merges.shape[0] - 1, -1, -1):  # from the root down: node n_words + t's children
        parent = prefix[n_words + t]
        final = t >= merges.shape[0] - n_final
        prefix[merges[t, 0]] = parent + "0" if final else parent
        prefix[merges[t, 1]] = parent + "1" if final else parent
    return prefix[:n_words]


def brown_clusters(
    sentences: Iterable[Sequence[str]] | BigramCounts, n_clusters: int = 100, min_count: int = 1
) -> dict[str, str]:
    """Brown clusters of the words of ``sentences`` (or of counts from :func:`count_bigrams`).

    Parameters
    ----------
    sentences: an iterable (a generator is fine: it is read once) of sentences, each a list of
        words or of token rows whose first cell is the word.
    n_clusters: the window ``m``, the number of classes kept while words enter (100 - 1000 is usual;
        the time grows about as ``V * m^2``).
    min_count: words seen fewer times get no path.

    Returns
    -------
    {word: bit-string path}, in order of decreasing word count (the boundary word left out); the
    words of one of the ``n_clusters`` final classes share its path.
    """
    counts = sentences if isinstance(sentences, BigramCounts) else count_bigrams(sentences)
    words, merges, _ = brown_merges(counts, n_clusters, min_count)
    paths = dict(zip(words.tolist(), _paths(words.size, merges, n_clusters)))
    paths.pop(BOUNDARY, None)
    return paths


# --- paths files ----------------------------------------------------------------------------


def write_paths(path: str | os.PathLike, clusters: dict[str, str], counts: dict[str, int] | None = None) -> None:
    """Write ``path<TAB>word<TAB>count`` lines (Liang's ``wcluster`` format), atomically.

    ``counts`` default to 1 for every word. Words holding a tab or a newline cannot be written."""
    lines = []
    for word, bits in clusters.items():
        if not word or any(c in word for c in "\t\n\r"):
            raise ValueError(f"word {word!r}: a paths file cannot hold an empty word or a word with a tab or newline")
        if not bits or set(bits) - {"0", "1"}:
            raise ValueError(f"word {word!r}: path {bits!r} is not a string of 0 and 1")
        lines.append(f"{bits}\t{word}\t{(counts or {}).get(word, 1)}\n")
    atomic_write(path, lambda handle: handle.write("".join(lines).encode("utf-8")))


def read_paths(path: str | os.PathLike) -> dict[str, str]:
    """Read a paths file (``path<TAB>word[<TAB>count]`` a line) into {word: path}.

    A missing or empty file, a line without a tab, a path that is not a bit string or a word
    listed twice raises an error naming the file (and the line)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such word-cluster paths file")
    if not path.is_file():
        raise DataFormatError(path, 1, "a word-cluster paths file is expected, not a folder or other non-file")
    clusters: dict[str, str] = {}
    for number, line in decoded_lines(path):
        if not line.strip():
            continue
        parts = line.rstrip("\r").split("\t")
        if len(parts) not in (2, 3):
            raise DataFormatError(path, number, f"expected 'path<TAB>word<TAB>count', got {len(parts)} tab-separated cells")
        bits, word = parts[0], parts[1]
        if not bits or set(bits) - {"0", "1"}:
            raise DataFormatError(path, number, f"path {bits!r} is not a string of 0 and 1")
        if not word:
            raise DataFormatError(path, number, "empty word")
        if len(parts) == 3 and not parts[2].strip().isdigit():
            raise DataFormatError(path, number, f"count {parts[2]!r} is not a whole number")
        if word in clusters:
            raise DataFormatError(path, number, f"word {word!r} is listed twice")
        clusters[word] = bits
    if not clusters:
        raise DataFormatError(path, 1, "the word-cluster paths file holds no words")
    return clusters


def path_prefixes(clusters: dict[str, str], n: int) -> dict[str, str]:
    """{word: the first ``n`` bits of its path} (the whole path when shorter; ``n=0``: whole)."""
    if n < 0:
        raise ValueError(f"prefix length {n}: must be >= 0")
    return {word: bits[:n] if n else bits for word, bits in clusters.items()}


def iter_words(paths: Sequence[str | os.PathLike]) -> Iterator[list[str]]:
    """The sentences of CoNLL-style files as word lists, streamed line by line: the first column
    (``-DOCSTART-`` lines skipped), or for ``.conllu`` files the FORM column of the word lines
    (comments, multiword tokens and empty nodes skipped). A file that is missing or holds no words
    raises an error naming it."""
    for file in paths:
        conllu = str(file).endswith((".conllu", ".conllu.gz"))
        words: list[str] = []
        seen = False
        for number, line in decoded_lines(file):
            if conllu:
                if line.startswith("#"):
                    continue
                parts = line.split("\t") if line.strip() else []
                if parts and not parts[0].isdigit():
                    continue  # a multiword token (3-4) or an empty node (8.1)
                if len(parts) == 1:
                    raise DataFormatError(file, number, "a CoNLL-U word line needs tab-separated ID and FORM")
                cells = parts[1:2]
            else:
                cells = line.split()
            if not cells:
                if words:
                    seen = True
                    yield words
                    words = []
                continue
            if cells[0] == "-DOCSTART-" and not conllu:
                continue
            words.append(cells[0])
        if words:
            seen = True
            yield words
        if not seen:
            raise DataFormatError(file, 1, "the text pool file holds no words")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m crf.clusters --out PATHS [--clusters M] [--min-count K] FILE...``: learn Brown
    clusters from the first column of CoNLL-style files (streamed) and write a paths file."""
    import argparse
    import time

    parser = argparse.ArgumentParser(prog="python -m crf.clusters", description=main.__doc__)
    parser.add_argument("files", nargs="+", help="text pool: CoNLL-style files (word in the first column), gzip or not")
    parser.add_argument("--out", required=True, help="the paths file to write (path<TAB>word<TAB>count)")
    parser.add_argument("--clusters", type=int, default=100, help="the window m: classes kept while words enter")
    parser.add_argument("--min-count", type=int, default=1, help="words seen fewer times get no path")
    args = parser.parse_args(argv)
    if args.clusters < 1:
        parser.error(f"--clusters {args.clusters}: must be at least 1")
    if args.min_count < 1:
        parser.error(f"--min-count {args.min_count}: must be at least 1")
    for file in args.files:
        if not Path(file).is_file():
            parser.error(f"{file}: no such file" if not Path(file).exists() else f"{file}: not a file")
    out = Path(args.out)
    if out.is_dir() or not out.parent.is_dir():
        parser.error(f"--out {out}: a folder" if out.is_dir() else f"--out {out}: no folder {out.parent}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    start = time.perf_counter()
    try:
        counts = count_bigrams(iter_words(args.files))
        counted = time.perf_counter()
        paths = brown_clusters(counts, n_clusters=args.clusters, min_count=args.min_count)
        done = time.perf_counter()
        write_paths(args.out, paths, dict(zip(counts.words.tolist(), counts.counts.tolist())))
    except (ValueError, OSError) as error:  # DataFormatError: a file and line; min_count leaving no word
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    log.info(
        "%d tokens, %d words, %d clustered with m=%d: counting %.1f s, clustering %.1f s; wrote %s",
        counts.n_tokens,
        counts.words.size - 1,
        len(paths),
        args.clusters,
        counted - start,
        done - counted,
        args.out,
    )


if __name__ == "__main__":
    main()
