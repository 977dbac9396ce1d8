"""Ready-made scorers for scikit-learn's model selection (``cross_val_score``,
``GridSearchCV``, ``RandomizedSearchCV``), named as in sklearn-crfsuite. For other metrics use
:func:`crf.metrics.flat_scorer`, e.g. ``flat_scorer(flat_f1_score, average="weighted")``."""

from __future__ import annotations

from .metrics import flat_accuracy_score, flat_scorer, sequence_accuracy_score

flat_accuracy = flat_scorer(flat_accuracy_score)
sequence_accuracy = flat_scorer(sequence_accuracy_score)
