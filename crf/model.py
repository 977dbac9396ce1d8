"""The ``CRF`` estimator: fit, predict, marginals, segment confidence, save and load.

Modelled on sklearn-crfsuite's ``CRF`` so that its users can switch by changing an import. ``X``
is a list of sequences of token features (dicts or lists of attribute strings, as for
python-crfsuite) or a :class:`~crf.batch.SequenceBatch` from :class:`~crf.features.FeatureExtractor`;
``y`` is a list of label sequences.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from . import chain, metrics, optimize
from .batch import SequenceBatch
from .features import AttributeIndex
from .objective import Objective, ParameterLayout, observed_feature_index
from .parallel import Workers, contiguous_parts, single_threaded_blas, thread_count
from .persist import ModelFileError, arrays_to_strings, load_arrays, save_arrays, strings_to_arrays

_KIND = "crf.CRF"
_PARAMS = (
    "algorithm",
    "c1",
    "c2",
    "max_iterations",
    "num_memories",
    "epsilon",
    "period",
    "delta",
    "all_possible_states",
    "learning_rate",
    "batch_size",
    "random_state",
    "dev_every",
    "n_threads",
    "verbose",
)


class CRF:
    """Linear-chain conditional random field.

    Parameters (CRFsuite's meanings): ``algorithm`` ``"lbfgs"`` (L-BFGS with L2 ``c2`` and, when
    ``c1 > 0``, L1 with exact zeros) or ``"l2sgd"`` (SGD with L2); ``max_iterations`` (None: until
    another rule stops); ``epsilon``, ``period``, ``delta``: stopping rules; ``num_memories``:
    L-BFGS history; ``all_possible_states``: every attribute with every label (True) or only the
    pairs seen in training (False, CRFsuite's default); ``learning_rate``, ``batch_size``,
    ``random_state``: SGD; ``n_threads``: threads for the sparse products (None: all cores);
    ``dev_every``: evaluate on ``X_dev`` every k iterations;
    ``callback``: called with every :class:`~crf.optimize.IterationInfo`; ``verbose``: print
    progress.
    """

    def __init__(
        self,
        algorithm: str = "lbfgs",
        c1: float = 0.0,
        c2: float = 1.0,
        max_iterations: int | None = None,
        num_memories: int = 6,
        epsilon: float = 1e-5,
        period: int = 10,
        delta: float = 1e-5,
        all_possible_states: bool = False,
        learning_rate: float = 0.1,
        batch_size: int = 32,
        random_state: int = 0,
        dev_every: int = 10,
        n_threads: int | None = None,
        verbose: bool = False,
        callback: Callable[[optimize.IterationInfo], None] | None = None,
    ) -> None:
        self.algorithm = algorithm
        self.c1 = c1
        self.c2 = c2
        self.max_iterations = max_iterations
        self.num_memories = num_memories
        self.epsilon = epsilon
        self.period = period
        self.delta = delta
        self.all_possible_states = all_possible_states
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.random_state = random_state
        self.dev_every = dev_every
        self.n_threads = n_threads
        self.verbose = verbose
        self.callback = callback

    def get_params(self) -> dict:
        return {name: getattr(self, name) for name in _PARAMS}

    # --- inputs --------------------------------------------------------------------------

    def _batch(self, X, fitting: bool = False) -> SequenceBatch:
        if isinstance(X, SequenceBatch):
            if not fitting and X.n_attributes != self.n_attributes_:
                raise ValueError(f"batch has {X.n_attributes} attributes, the model was fitted on {self.n_attributes_}")
            return X
        if fitting:
            self.attribute_index_ = AttributeIndex().fit(X)
        elif getattr(self, "attribute_index_", None) is None:
            raise ValueError("this model was fitted on a SequenceBatch: pass a SequenceBatch")
        return self.attribute_index_.transform(X)

    def _label_codes(self, y, batch: SequenceBatch) -> np.ndarray:
        if len(y) != batch.n_sequences:
            raise ValueError(f"{batch.n_sequences} sequences in X but {len(y)} in y")
        for i, (labels, length) in enumerate(zip(y, batch.lengths)):
            if len(labels) != length:
                raise ValueError(f"sequence {i}: {length} tokens in X but {len(labels)} labels in y")
        flat = np.array([label for labels in y for label in labels], dtype=object)
        index = {label: i for i, label in enumerate(self.classes_)}
        codes = np.array([index.get(u, -1) for u in pd.unique(flat)])[pd.factorize(flat)[0]]
        return codes

    # --- training ------------------------------------------------------------------------

    def fit(self, X, y, X_dev=None, y_dev=None, attribute_names: Sequence[str] | None = None) -> CRF:
        """Train on ``X``, ``y``; with ``X_dev``/``y_dev``, report dev accuracy every
        ``dev_every`` iterations. ``attribute_names`` names the columns of a SequenceBatch."""
        began = time.perf_counter()
        batch = self._batch(X, fitting=True)
        if isinstance(X, SequenceBatch):
            self.attribute_index_ = None
            self.attributes_ = list(attribute_names) if attribute_names is not None else None
        else:
            self.attributes_ = list(self.attribute_index_.names())
        flat = [label for labels in y for label in labels]
        self.classes_ = list(pd.unique(np.array(flat, dtype=object)))
        self.n_attributes_ = batch.n_attributes
        codes = self._label_codes(y, batch)
        L = len(self.classes_)
        feature_index = None if self.all_possible_states else observed_feature_index(batch.X, codes, L)
        params = ParameterLayout(batch.n_attributes, L, feature_index)
        stopping = optimize.StoppingRule(self.max_iterations, self.epsilon, self.period, self.delta)
        dev_batch = None if X_dev is None else self._batch(X_dev)
        callback = self._iteration_callback(params, dev_batch, y_dev)
        theta0 = np.zeros(params.size)
        if self.algorithm not in ("lbfgs", "l2sgd"):
            raise ValueError(f"unknown algorithm {self.algorithm!r}: use 'lbfgs' or 'l2sgd'")
        if self.algorithm == "l2sgd" and self.c1:
            raise ValueError("l2sgd supports L2 only; set c1=0 or use algorithm='lbfgs'")
        with single_threaded_blas():
            if self.algorithm == "lbfgs":
                objective = Objective(batch.X, batch.offsets, codes, params, self.n_threads)
                result = optimize.lbfgs(objective, theta0, self.c1, self.c2, stopping, self.num_memories, callback)
                del objective  # its feature blocks are the largest allocation: free them first
            else:
                if stopping.max_iterations is None:
                    stopping.max_iterations = 100
                result = optimize.sgd(
                    batch.X,
                    batch.offsets,
                    codes,
                    params,
                    theta0,
                    self.c2,
                    stopping,
                    self.learning_rate,
                    self.batch_size,
                    self.random_state,
                    callback,
                )
        self._set_weights(params, result.theta)
        self.training_log_ = [
            {
                "iteration": i.iteration,
                "loss": i.loss,
                "gradient_norm": i.gradient_norm,
                "active_features": i.active_features,
                "elapsed": i.elapsed,
            }
            for i in result.history
        ]
        self.n_iter_ = result.iterations
        self.n_evaluations_ = result.evaluations
        self.stop_reason_ = result.stop_reason
        self.training_seconds_ = time.perf_counter() - began
        return self

    def _set_weights(self, params: ParameterLayout, theta: np.ndarray) -> None:
        state, transitions, start, end = params.split(theta)
        # sparse layouts get a fresh (A, L) array from split; dense ones a view of theta
        self.state_weights_ = state if params.feature_index is not None else state.copy()
        self.transitions_ = np.array(transitions)
        self.start_weights_ = np.array(start)
        self.end_weights_ = np.array(end)
        self.feature_index_ = params.feature_index

    def _iteration_callback(self, params, dev_batch, y_dev):
        def report(info: optimize.IterationInfo) -> None:
            if dev_batch is not None and self.dev_every and info.iteration % self.dev_every == 0:
                theta = getattr(info, "theta", None)
                if theta is not None:
                    self._set_weights(params, theta)
                    info.dev_predictions = self.predict(dev_batch)
                    info.dev_accuracy = metrics.token_accuracy(y_dev, info.dev_predictions)
            if self.verbose:
                dev = f" dev_acc={info.dev_accuracy:.2f}" if hasattr(info, "dev_accuracy") else ""
                print(
                    f"iter {info.iteration:4d} loss={info.loss:.4f} |g|={info.gradient_norm:.4g} "
                    f"active={info.active_features} {info.elapsed:.1f}s{dev}",
                    flush=True,
                )
            if self.callback is not None:
                self.callback(info)

        return report

    # --- inference -----------------------------------------------------------------------

    def _check_fitted(self) -> None:
        if not hasattr(self, "state_weights_"):
            raise RuntimeError("this CRF is not fitted yet; call fit() or CRF.load()")

    def emissions(self, X) -> tuple[np.ndarray, SequenceBatch]:
        """Emission scores (T, L) and the batch they belong to."""
        self._check_fitted()
        batch = self._batch(X)
        return np.asarray(batch.X @ self.state_weights_), batch

    def _weights(self):
        return self.transitions_, self.start_weights_, self.end_weights_

    def _split(self, flat, batch: SequenceBatch) -> list:
        return [flat[a:b] for a, b in zip(batch.offsets[:-1], batch.offsets[1:])]

    def predict(self, X) -> list[list[str]]:
        """Most likely label sequence (Viterbi) of every sequence."""
        labels, _ = self.predict_codes(X)
        classes = np.array(self.classes_, dtype=object)
        return [list(classes[part]) for part in labels]

    def predict_codes(self, X) -> tuple[list[np.ndarray], np.ndarray]:
        """Viterbi label indices per sequence and the path scores (N,).

        Contiguous parts of the batch are tagged on separate threads."""
        self._check_fitted()
        batch = self._batch(X)
        n_threads = thread_count(self.n_threads)

        def tag(part: tuple[int, int]):
            rows = slice(int(batch.offsets[part[0]]), int(batch.offsets[part[1]]))
            emissions = np.asarray(batch.X[rows] @ self.state_weights_)
            return chain.viterbi(emissions, *self._weights(), batch.lengths[part[0] : part[1]])

        with single_threaded_blas(), Workers(n_threads) as workers:
            parts = workers.map(tag, contiguous_parts(batch.offsets, n_threads))
        labels = np.concatenate([p[0] for p in parts])
        scores = np.concatenate([p[1] for p in parts])
        return self._split(labels, batch), scores

    def predict_single(self, xseq) -> list[str]:
        return self.predict([xseq])[0]

    def marginals(self, X) -> tuple[np.ndarray, SequenceBatch]:
        """Node marginals p(y_t = l | x) as a (T, L) array (columns in ``classes_`` order)."""
        emissions, batch = self.emissions(X)
        return chain.forward_backward(emissions, *self._weights(), batch.lengths).marginals, batch

    def predict_marginals(self, X) -> list[list[dict[str, float]]]:
        """Per token, a dict label -> marginal probability (sklearn-crfsuite's format)."""
        marginals, batch = self.marginals(X)
        rows = [dict(zip(self.classes_, row)) for row in marginals.tolist()]
        return self._split(rows, batch)

    def predict_marginals_single(self, xseq) -> list[dict[str, float]]:
        return self.predict_marginals([xseq])[0]

    def log_partition(self, X) -> np.ndarray:
        """log Z(x) of every sequence (N,)."""
        emissions, batch = self.emissions(X)
        return chain.log_partition(emissions, *self._weights(), batch.lengths)

    def sequence_probability(self, X, y) -> np.ndarray:
        """p(y | x) for every given labelling (N,)."""
        emissions, batch = self.emissions(X)
        codes = self._label_codes(y, batch)
        if np.any(codes < 0):
            raise ValueError("y contains labels the model does not know")
        gold = chain.sequence_scores(emissions, *self._weights(), batch.offsets, codes)
        return np.exp(gold - chain.log_partition(emissions, *self._weights(), batch.lengths))

    def span_probability(self, X, sequence: Sequence[int], start: Sequence[int], allowed: Sequence[np.ndarray]) -> np.ndarray:
        """Constrained forward-backward: p(y_t in allowed_t for the window of each query | x).

        Query k covers tokens ``start[k] : start[k] + len(allowed[k])`` of sequence
        ``sequence[k]``; ``allowed[k]`` is a (width, L) boolean mask over ``classes_``.
        Returns (K,) probabilities.
        """
        emissions, batch = self.emissions(X)
        posterior = chain.forward_backward(emissions, *self._weights(), batch.lengths, keep_messages=True)
        return np.exp(self._constrained(posterior, emissions, batch, sequence, start, allowed))

    def _constrained(self, posterior, emissions, batch, sequence, start, allowed) -> np.ndarray:
        if len(sequence) == 0:
            return np.zeros(0)
        widths = np.array([len(a) for a in allowed], dtype=np.int64)
        window_offsets = np.concatenate([[0], np.cumsum(widths)])
        masks = np.concatenate([np.asarray(a, dtype=bool) for a in allowed])
        return chain.constrained_log_probability(
            posterior.log_alpha,
            posterior.log_beta,
            posterior.log_z,
            emissions,
            self.transitions_,
            self.start_weights_,
            batch.offsets,
            np.asarray(sequence),
            np.asarray(start),
            masks,
            window_offsets,
        )

    def predict_segments(self, X) -> pd.DataFrame:
        """Predicted chunks/entities with their confidence.

        One row per chunk of the Viterbi labelling (conlleval's chunk rules): ``sequence``,
        ``start``, ``end`` (exclusive), ``type`` and ``confidence``: the probability under the model
        that the chunk's tokens carry exactly their predicted labels, that the token before does
        not extend the chunk and that the token after does not continue it (constrained
        forward-backward over that window, Culotta & McCallum 2004).
        """
        emissions, batch = self.emissions(X)
        labels, _ = chain.viterbi(emissions, *self._weights(), batch.lengths)
        classes = np.array(self.classes_, dtype=object)
        predicted = [list(classes[p]) for p in self._split(labels, batch)]
        found = metrics.chunks(predicted)
        if found.empty:
            found["confidence"] = []
            return found
        posterior = chain.forward_backward(emissions, *self._weights(), batch.lengths, keep_messages=True)
        tags, types = zip(*(metrics.split_label(c) for c in self.classes_))
        tags, types = np.array(tags), np.array(types)
        lengths = batch.lengths
        seqs, firsts, allowed = [], [], []
        for seq, s, e in zip(found["sequence"].to_numpy(), found["start"].to_numpy(), found["end"].to_numpy()):
            offset = batch.offsets[seq]
            inside = labels[offset + s : offset + e]
            rows = [np.arange(len(classes))[None, :] == inside[:, None]]
            window_start = s
            if s > 0:  # the previous token must not belong to this chunk
                first = inside[0]
                rows.insert(0, metrics.chunk_start(tags, tags[first], types, types[first])[None, :])
                window_start = s - 1
            if e < lengths[seq]:  # the next token must not continue it
                last = inside[-1]
                rows.append(metrics.chunk_end(tags[last], tags, types[last], types)[None, :])
            seqs.append(seq)
            firsts.append(window_start)
            allowed.append(np.concatenate(rows))
        found["confidence"] = np.exp(self._constrained(posterior, emissions, batch, seqs, firsts, allowed))
        return found

    def score(self, X, y) -> float:
        """Token accuracy (fraction) of ``predict(X)`` against ``y``."""
        return metrics.token_accuracy(y, self.predict(X)) / 100.0

    # --- inspection ----------------------------------------------------------------------

    def _attribute_name(self, index: int) -> str:
        return self.attributes_[index] if self.attributes_ is not None else f"#{index}"

    @property
    def state_features_(self) -> dict[tuple[str, str], float]:
        """{(attribute, label): weight} for every state feature of the model."""
        self._check_fitted()
        L = len(self.classes_)
        flat = self.feature_index_ if self.feature_index_ is not None else np.flatnonzero(self.state_weights_.ravel())
        weights = self.state_weights_.ravel()[flat]
        return {(self._attribute_name(i // L), self.classes_[i % L]): float(w) for i, w in zip(flat.tolist(), weights.tolist())}

    @property
    def transition_features_(self) -> dict[tuple[str, str], float]:
        """{(previous label, label): weight}."""
        self._check_fitted()
        return {(a, b): float(self.transitions_[i, j]) for i, a in enumerate(self.classes_) for j, b in enumerate(self.classes_)}

    def top_features(self, n: int = 20) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The ``n`` most positive and most negative state features, and all transitions sorted
        by weight: (state frame [attribute, label, weight], transition frame [from, to, weight])."""
        self._check_fitted()
        L = len(self.classes_)
        flat = self.state_weights_.ravel()
        order = np.argsort(flat)
        picks = np.concatenate([order[::-1][:n], order[:n]])
        state = pd.DataFrame(
            {
                "attribute": [self._attribute_name(i // L) for i in picks],
                "label": [self.classes_[i % L] for i in picks],
                "weight": flat[picks],
            }
        )
        transitions = pd.DataFrame(
            [(a, b, w) for (a, b), w in self.transition_features_.items()], columns=["from", "to", "weight"]
        ).sort_values("weight", ascending=False, ignore_index=True)
        return state, transitions

    @property
    def size_(self) -> int:
        """Number of non-zero weights."""
        self._check_fitted()
        return int(
            np.count_nonzero(self.state_weights_)
            + np.count_nonzero(self.transitions_)
            + np.count_nonzero(self.start_weights_)
            + np.count_nonzero(self.end_weights_)
        )

    # --- persistence ---------------------------------------------------------------------

    def save(self, path) -> None:
        """Write the fitted model to one ``.npz`` file (no pickle; checksummed; atomic)."""
        self._check_fitted()
        arrays = {
            "transitions": self.transitions_,
            "start": self.start_weights_,
            "end": self.end_weights_,
        }
        if self.feature_index_ is not None:
            arrays["feature_index"] = self.feature_index_
            arrays["state_values"] = self.state_weights_.ravel()[self.feature_index_]
        else:
            arrays["state_values"] = self.state_weights_
        if self.attributes_ is not None:
            arrays["attribute_blob"], arrays["attribute_offsets"] = strings_to_arrays(self.attributes_)
        meta = {
            "params": {k: v for k, v in self.get_params().items()},
            "classes": list(self.classes_),
            "n_attributes": int(self.n_attributes_),
            "sparse": self.feature_index_ is not None,
            "dict_input": getattr(self, "attribute_index_", None) is not None,
        }
        save_arrays(path, _KIND, meta, arrays)

    @classmethod
    def load(cls, path) -> CRF:
        """Read a model written by :meth:`save`; raises ModelFileError on a bad file."""
        meta, arrays = load_arrays(path, _KIND)
        try:
            model = cls(**{k: v for k, v in meta["params"].items() if k in _PARAMS})
            classes = [str(c) for c in meta["classes"]]
            A, L = int(meta["n_attributes"]), len(classes)
            model.classes_ = classes
            model.n_attributes_ = A
            transitions = arrays["transitions"].astype(np.float64)
            if transitions.shape != (L, L) or arrays["start"].shape != (L,) or arrays["end"].shape != (L,):
                raise ModelFileError(f"{path}: weight shapes do not match {L} labels")
            state = np.zeros((A, L))
            if meta["sparse"]:
                index = arrays["feature_index"].astype(np.int64)
                if (
                    index.ndim != 1
                    or index.size != arrays["state_values"].size
                    or (index.size and (index.min() < 0 or index.max() >= A * L))
                ):
                    raise ModelFileError(f"{path}: feature index out of range")
                state.ravel()[index] = arrays["state_values"]
                model.feature_index_ = index
            else:
                if arrays["state_values"].shape != (A, L):
                    raise ModelFileError(f"{path}: state weights have shape {arrays['state_values'].shape}, expected {(A, L)}")
                state[:] = arrays["state_values"]
                model.feature_index_ = None
            model.state_weights_ = state
            model.transitions_ = transitions
            model.start_weights_ = arrays["start"].astype(np.float64)
            model.end_weights_ = arrays["end"].astype(np.float64)
            model.attributes_ = (
                arrays_to_strings(arrays["attribute_blob"], arrays["attribute_offsets"]) if "attribute_blob" in arrays else None
            )
            if model.attributes_ is not None and len(model.attributes_) != A:
                raise ModelFileError(f"{path}: {len(model.attributes_)} attribute names for {A} attributes")
            if meta.get("dict_input"):
                if model.attributes_ is None:
                    raise ModelFileError(f"{path}: a dict-input model without attribute names")
                model.attribute_index_ = AttributeIndex()
                model.attribute_index_.index_ = {name: i for i, name in enumerate(model.attributes_)}
            else:
                model.attribute_index_ = None
        except KeyError as err:
            raise ModelFileError(f"{path}: missing field {err}") from None
        return model
