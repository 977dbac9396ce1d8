"""The registry's alias rule: ``@champion`` only moves forward.

Every registered version records its *standing*: the metric it was chosen by, its value, the
direction in which that metric improves, and a key of the data it was measured on (the contents
of the train, dev and test files, as the dev split may be carved from the train file, and the
settings that read them: columns, label, scheme, dev split; :func:`evaluation_key`). A version
without one (a ``data.final_fit=train+dev`` fit has no dev score) records why instead
(:data:`UNSCORED_TAG`). The rule (:func:`alias_decision`):

- ``registry.force_alias=true`` moves the alias, whatever either version records;
- a version without a standing never takes the alias by itself, not even a free one: nothing
  shows it is at least as good as anything;
- a version with one takes a free alias, and a held one when it is at least as good as the
  holder by the same metric on the same evaluation data (ties move forward).

The holder is judged by the runs that name its model, found from what MLflow recorded as it was
registered (its ``models:/m-...`` source, which no client can edit), never by its version tags
(:func:`holder_standing`): the one value of the metric those runs had logged by then on the new
version's evaluation data. A holder whose score there is not known so (its runs are gone, logged
no such score or differing ones, scored it on other data only; a train+dev fit forced there; a
version registered by hand) keeps the alias until a move is forced.

Otherwise the alias stays, and the new version's tags (:data:`DECISION_TAG`) and the log say why.

Deciding and moving the alias is one step (:func:`settle_alias`): on a local SQLite store under a
file lock beside the database, so registrations finishing together are decided one after the
other; on any other store (a tracking server) the alias is read just before it is set and read
again after, and a registration that finds a worse version set meanwhile sets its own again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from filelock import FileLock
from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException

from pipeline.engine.store import MODEL_URI_TAG
from pipeline.tracking.lifecycle import sqlite_path

log = logging.getLogger(__name__)

# version tags of a standing
METRIC_TAG, VALUE_TAG, DIRECTION_TAG, EVALUATION_TAG = (
    "standing.metric",
    "standing.value",
    "standing.direction",
    "standing.evaluation",
)
DECISION_TAG = "alias_decision"  # why the alias moved to this version or stayed where it was
UNSCORED_TAG = "standing.missing"  # why a version records no standing (e.g. a train+dev fit: no dev score)
FINAL_FIT_TAG = "data.final_fit"  # the splits a version was trained on: train, or train+dev
FORCED = "moved: forced"  # how the decision of a version forced into the alias starts

EVALUATION_RUN_TAG = "crf.evaluation"  # a pipeline run's key of the data its dev and test scores were measured on

# dataset settings that say how a model reads the data, not which sentences and labels it is scored on
_NOT_EVALUATION = ("hmm", "task", "word_column", "tokenisation")


def evaluation_key(dataset: Mapping[str, Any], file_digests: Mapping[str, str] | None = None) -> str:
    """A short key of the data a run's dev and test scores are measured on: two runs with the same
    key scored the same dev and test sentences against the same label column.

    Parameters
    ----------
    dataset : the run's ``dataset`` config (resolved): its format, ``columns``, ``label``,
        ``scheme``, ``dev_split`` (the dev set may be carved from the train file), ``evaluate`` and
        every other reading setting count; settings of how a model reads the data (``hmm``,
        ``word_column``, ...) do not.
    file_digests : the content digest of each dataset file, keyed ``file:<split>`` (the prepare
        stage's external inputs, which also key its cache). A file without one counts by its
        configured path and ``sha256``. The train file always counts (a dev split is carved from it).
    """
    picked = {k: v for k, v in dataset.items() if k not in _NOT_EVALUATION and k != "files"}
    files = {}
    for split, spec in dict(dataset.get("files") or {}).items():
        if spec is None:  # dataset.files.<split>=null: no such file
            continue
        digest = (file_digests or {}).get(f"file:{split}")
        checksum = spec.get("sha256")  # hex digits in either case are one checksum
        files[split] = {"content": digest} if digest else {"path": spec.get("path"), "sha256": checksum and str(checksum).lower()}
    picked["files"] = files
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _metric_name(metric: str) -> str:
    """One name per figure: a sweep's ``<stage>.<name>`` as a run's summary names it
    (``evaluate.dev_f1`` -> ``dev_f1``, as versions registered by earlier sweeps recorded it)."""
    from pipeline.engine.runner import summary_key

    return (summary_key(metric) or metric) if "." in metric else metric


SCORE_WORDS = frozenset({"accuracy", "f1", "precision", "recall", "ap", "score", "aulc"})  # higher is better
COST_WORDS = frozenset({"error", "loss", "seconds", "bytes", "rate"})  # lower is better


def metric_direction(name: str) -> str | None:
    """The direction in which a stage metric gets better, from the words of its name: "maximize"
    for a score (``dev_f1``, ``dev_NP_confidence_ap``, ``dev_tag_tokens_per_second``), "minimize"
    for an error, rate or cost (``dev_token_error``, ``dev_unknown_rate``, ``train_seconds``,
    ``model_bytes``); None for a count or anything else (either direction may be wanted)."""
    words = name.split("_")
    if "per" in words[:-1] and words[words.index("per") + 1] == "second":  # a throughput
        return "maximize"
    score, cost = bool(SCORE_WORDS.intersection(words)), bool(COST_WORDS.intersection(words))
    return "maximize" if score and not cost else "minimize" if cost and not score else None


@dataclass(frozen=True)
class Standing:
    """What a registered model was chosen by: ``metric`` (e.g. ``dev_f1``) had ``value`` on the
    data of ``evaluation`` (:func:`evaluation_key`); ``direction`` is ``maximize`` or ``minimize``."""

    metric: str
    value: float
    direction: str
    evaluation: str

    def tags(self) -> dict[str, str]:
        return {
            METRIC_TAG: self.metric,
            VALUE_TAG: repr(float(self.value)),
            DIRECTION_TAG: self.direction,
            EVALUATION_TAG: self.evaluation,
        }

    def at_least_as_good_as(self, other: Standing) -> bool:
        if self.direction == "minimize":
            return self.value <= other.value
        return self.value >= other.value


def _runs_of_the_model(client: Any, holder: Any) -> list[Any]:
    """The runs that name the model of version ``holder``. A version of a logged model has a source
    ``models:/m-...`` that no client can edit: every run whose :data:`MODEL_URI_TAG` names it (the
    pipeline runs that logged or reused it, and their stage runs). Another version (registered from
    a run's artifacts or a file): the run MLflow records for it, and that run's parent."""
    source = str(getattr(holder, "source", "") or "")
    if source.startswith("models:/"):
        experiments, page = [], None
        while page is None or page.token:  # every page: MLflow returns 1,000 experiments at a time
            page = client.search_experiments(view_type=ViewType.ALL, page_token=page.token if page else None)
            experiments += [e.experiment_id for e in page]
        found = f"tags.`{MODEL_URI_TAG}` = '{source}'"
        return list(client.search_runs(experiments, found, run_view_type=ViewType.ALL, max_results=10000))
    runs, run_id = [], getattr(holder, "run_id", None)
    while run_id and len(runs) < 2:
        try:
            runs.append(client.get_run(run_id))
        except MlflowException:
            break
        run_id = runs[-1].data.tags.get("mlflow.parentRunId")
    return runs


def holder_standing(client: Any, holder: Any, like: Standing) -> tuple[Standing | None, str | None]:
    """The standing of alias ``holder`` by ``like``'s metric on ``like``'s evaluation data, read from
    the runs that name its model (:func:`_runs_of_the_model`) and tag that evaluation data
    (:data:`EVALUATION_RUN_TAG`): the one value of the metric they had logged when the version was
    registered (give or take :data:`CLOCK_SKEW_MS`). Values logged later are not what it was chosen
    by; values that differ (one logged by hand, back-dated) leave it unknown. The version's own tags
    are never read: a tag edited by hand changes nothing.

    Returns
    -------
    (the standing, None), or (None, why it is not known)
    """
    metric = _metric_name(like.metric)
    runs = _runs_of_the_model(client, holder)
    if not runs:
        return None, "no run names its model (gone, or it was registered by hand)"
    scored = [r for r in runs if metric in r.data.metrics and r.data.tags.get(EVALUATION_RUN_TAG)]
    if not scored:
        return None, f"no run of its model logged {metric} on evaluation data it names"
    same = [r for r in scored if r.data.tags[EVALUATION_RUN_TAG] == like.evaluation]
    if not same:
        return None, "its model was scored on other evaluation data (files, columns, label, scheme or dev split differ)"
    registered = getattr(holder, "creation_timestamp", None)
    values = []
    for run in same:
        history = client.get_metric_history(run.info.run_id, metric)
        values += [m.value for m in history if not isinstance(registered, int) or m.timestamp <= registered + CLOCK_SKEW_MS]
    distinct = list(dict.fromkeys(repr(float(v)) for v in values))
    if not distinct:
        return None, f"no run of its model had logged {metric} on this evaluation data when it was registered"
    if len(distinct) > 1:
        shown = ", ".join(f"{float(v):g}" for v in distinct[:4])
        return None, f"the runs of its model had logged {len(distinct)} different values of {metric} by then ({shown})"
    value = float(distinct[0])
    if not math.isfinite(value):
        return None, f"its runs' {metric} reads {value}"
    return Standing(like.metric, value, like.direction, like.evaluation), None


def alias_decision(
    new: Standing | None,
    current: Standing | None,
    has_holder: bool,
    force: bool,
    unscored: str = "",
    force_declined: str = "",
    unreadable: str | None = None,
) -> tuple[bool, str]:
    """Whether the alias moves to the version of standing ``new`` from its current holder (of
    standing ``current``; ``has_holder`` False: the alias is free), and why, in one line (the rule
    is in the module docstring).

    Parameters
    ----------
    new, current : the new version's and the holder's standings (None: none recorded, or read).
    has_holder : whether a version holds the alias.
    force : ``registry.force_alias``.
    unscored : why the new version has no standing (named in the reason), e.g. ``trained on
        train+dev: no dev score``.
    force_declined : why ``registry.force_alias=true``, though set, was not applied to this version
        (named in the reason instead of the hint to force the move).
    unreadable : why the holder's standing cannot be read (:func:`holder_standing`).
    """
    if force:
        return True, f"{FORCED} (registry.force_alias=true)"
    hint = (
        f"registry.force_alias=true was set but not applied: {force_declined}"
        if force_declined
        else "force the move with registry.force_alias=true"
    )
    if new is None or not math.isfinite(new.value):
        why = f" ({unscored})" if unscored else ""
        if not has_holder:
            return (
                False,
                f"kept free: this version has no score to compare{why}, and only a scored version takes the alias; {hint}",
            )
        return False, f"kept: this version has no score to compare{why}"
    if not has_holder:
        return True, "moved: no version held the alias"
    if current is None:
        why = f" ({unreadable})" if unreadable else ""
        return False, f"kept: the holder's {new.metric} on this evaluation data is not known{why}; {hint}"
    if not new.evaluation or new.evaluation != current.evaluation:
        return False, "kept: the holder was scored on other evaluation data (files, columns, label, scheme or dev split differ)"
    if not new.at_least_as_good_as(current):
        return False, f"kept: {new.metric} {new.value:.6g} is worse than the holder's {current.value:.6g}"
    return True, f"moved: {new.metric} {new.value:.6g} is at least the holder's {current.value:.6g}"


# a metric's time is the logging client's clock, a version's the store's: a value logged this long after
# the registration still counts (on a server whose clock is behind, the score logged just before it
# would otherwise read as later); a differing value there only leaves the holder's score unknown
CLOCK_SKEW_MS = 60_000
REPAIR_ROUNDS = 5  # without a lock: how often a registration re-decides after finding another version set


@contextlib.contextmanager
def registry_lock(registry_uri: str) -> Iterator[bool]:
    """Hold ``<database>.registry.lock`` beside a ``sqlite:///`` registry's database (an ``flock``:
    every process and thread on this machine that registers into it waits its turn); yields
    whether a lock is held (False: another kind of store, nothing held)."""
    database = sqlite_path(registry_uri)
    if database is None:
        yield False
        return
    with FileLock(database.with_name(database.name + ".registry.lock")):
        yield True


def _holder(client: Any, name: str, alias: str) -> Any:
    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def settle_alias(
    client: Any,
    name: str,
    alias: str,
    version: str,
    standing: Standing | None,
    force: bool,
    registry_uri: str,
    unscored: str = "",
    force_declined: str = "",
) -> tuple[bool, str]:
    """Move ``alias`` of registered model ``name`` to ``version`` (of ``standing``) when
    :func:`alias_decision` says so, as one step, and tag the version with the decision.

    On a SQLite registry the holder is read, the decision taken and the alias set under
    :func:`registry_lock`. Elsewhere (a tracking server has no lock to take) the alias is set right
    after the read, then read again: when another registration set it meanwhile, the decision is
    taken again against that version (ties and forced moves go to the later version) and the alias
    set again if this version wins, up to :data:`REPAIR_ROUNDS` times. What remains there: two
    registrations whose read and set interleave exactly (read, read, set, check, set) can still
    leave the later-set, worse version. ``unscored``: why a version without a standing has none;
    ``force_declined``: why a set ``registry.force_alias`` does not apply to it.

    Returns
    -------
    (whether the alias is on ``version`` when this returns, the one-line reason tagged on it)
    """
    version = str(version)
    with registry_lock(registry_uri) as locked:
        moved, reason = False, ""
        for attempt in range(1 if locked else REPAIR_ROUNDS):
            holder = _holder(client, name, alias)
            if holder is not None and str(holder.version) == version:
                break  # ours (set in an earlier round)
            current, unreadable = None, None
            if holder is not None and standing is not None and not force:
                current, unreadable = holder_standing(client, holder, standing)
            moved, reason = alias_decision(standing, current, holder is not None, force, unscored, force_declined, unreadable)
            later = holder is not None and int(holder.version) > int(version)
            if moved and attempt > 0 and later and (force or not _better(standing, current)):
                moved, reason = False, "kept: a later version, as good or forced, was registered at the same time"
            if holder is not None:
                reason += f" (version {holder.version})"
            if not moved:
                break
            client.set_registered_model_alias(name, alias, version)
            if locked:
                break
            now = _holder(client, name, alias)
            if now is None or str(now.version) == version:
                break
            log.info("%s alias %s: version %s was set at the same time; deciding again", name, alias, now.version)
        client.set_model_version_tag(name, version, DECISION_TAG, reason)
    return moved, reason


def _better(new: Standing | None, current: Standing | None) -> bool:
    """Whether ``new`` is strictly better than ``current`` (False when either is missing)."""
    if new is None or current is None:
        return False
    return new.value < current.value if new.direction == "minimize" else new.value > current.value
