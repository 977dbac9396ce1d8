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
- a version with one takes a free alias, and a held one when the holder's standing is by the same
  metric on the same evaluation data and the new value is at least as good (ties move forward);
- a holder without a standing that got the alias without force (a scoreless version of an
  earlier rule that let one take a free alias) has nothing to defend: a version with a standing
  takes it. One that was forced there stays until the alias is forced again (it was chosen by
  hand), as does one registered before versions recorded standings (it may be good; nothing says).

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

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Standing | None:
        """The standing a version's tags record, or None (a version registered before standings, or
        tags edited into what no registration records: a value that is not a finite number, an
        unknown direction, a test-set score, a score minimised; a NaN would compare as neither better
        nor worse, and the others hold the alias against every normal version, for good)."""
        try:
            standing = cls(tags[METRIC_TAG], float(tags[VALUE_TAG]), tags[DIRECTION_TAG], tags[EVALUATION_TAG])
        except (KeyError, ValueError):
            return None
        if not math.isfinite(standing.value) or standing.direction not in ("maximize", "minimize"):
            return None
        name = _metric_name(standing.metric)
        better = metric_direction(name)
        if "test" in name.split("_") or (better is not None and better != standing.direction):
            return None  # what no registration records (a test score, a score minimised): edited, judged by its run
        return standing

    def at_least_as_good_as(self, other: Standing) -> bool:
        if self.direction == "minimize":
            return self.value <= other.value
        return self.value >= other.value


def holder_without_standing(tags: Mapping[str, str], unreadable: str | None = None) -> tuple[str, bool]:
    """What an alias holder that records no standing is, from its version ``tags``: (a few words
    naming it, whether it may be replaced by a version with a standing). ``unreadable``: why a score
    it may have been registered with cannot be read back from its run (:func:`holder_unreadable`).

    A version registered before versions recorded standings has no :data:`DECISION_TAG`: kept (it
    may be good; nothing says). One registered by this rule without a score was either forced
    into the alias (kept: chosen by hand) or took it without force under an earlier rule that let
    a scoreless version take a free alias (replaceable: nothing to defend)."""
    if DECISION_TAG not in tags:
        return "registered by an older version of the pipeline, before versions recorded standings", False
    if tags.get(FINAL_FIT_TAG) == "train+dev" or "train+dev" in tags.get(UNSCORED_TAG, ""):
        what = "a data.final_fit=train+dev fit, which has no dev score"
    elif tags.get(UNSCORED_TAG):
        what = f"registered without a score: {tags[UNSCORED_TAG]}"
    else:
        what = "registered without a dev score"
    if tags[DECISION_TAG].startswith(FORCED):
        return f"{what}, put there by registry.force_alias=true", False
    if unreadable and what == "registered without a dev score":  # nothing says it had no score: it may have had one
        return f"its standing tags were removed and {unreadable}", False
    return what, True


def _holder_run(client: Any, holder: Any) -> tuple[str | None, Any, str | None]:
    """(the run id an alias ``holder`` names: its ``run_id`` version tag, else MLflow's; the run, or
    None when it is gone; why that run is not the holder's, or None). A version of a logged model
    (its source ``models:/m-...``, which no client can edit) belongs to a run whose
    :data:`MODEL_URI_TAG` names that model: a pipeline run names the model it logged or reused."""
    run_id = dict(holder.tags).get("run_id") or getattr(holder, "run_id", None)
    if not run_id:
        return None, None, None
    try:
        run = client.get_run(run_id)
    except MlflowException:
        return run_id, None, None
    source = str(getattr(holder, "source", "") or "")
    named = run.data.tags.get(MODEL_URI_TAG)
    if source.startswith("models:/") and named != source:
        what = f"names the model {named}" if named else "names no model"
        return run_id, run, f"the run it names ({run_id}) {what}, not its own {source}"
    return run_id, run, None


def _score_when_registered(client: Any, run: Any, holder: Any, metric: str) -> tuple[float | None, str | None]:
    """(the value of ``metric`` that ``run`` had logged when ``holder`` was registered, or None; why
    that value cannot be compared, or None). A value logged after the registration is not what the
    holder was chosen by; values that differ before it (one logged later with an earlier time, by
    hand) leave it unknown. The latest value where the version records no time."""
    if metric not in run.data.metrics:
        return None, None
    registered = getattr(holder, "creation_timestamp", None)
    if not isinstance(registered, int):
        values = [float(run.data.metrics[metric])]
    else:
        values = [float(m.value) for m in client.get_metric_history(run.info.run_id, metric) if m.timestamp <= registered]
    if not values:
        return None, None
    if len({repr(v) for v in values}) > 1:
        shown = ", ".join(f"{v:g}" for v in values[:4])
        return (
            None,
            f"its run logged {metric} {len(values)} times before it was registered ({shown}), so the one it was "
            "chosen by is not known",
        )
    if not math.isfinite(values[0]):
        return None, f"its run's {metric} reads {values[0]} as it was registered, so its score cannot be compared"
    return values[0], None


def holder_unreadable(client: Any, holder: Any, standing: Standing) -> str | None:
    """Why the score of an alias ``holder`` without standing tags cannot be read back from the
    pipeline run it names (its ``run_id`` version tag, else MLflow's run id), though it may have had
    one: the run is gone (``mlflow gc``), it logged ``standing``'s metric but no longer records the
    evaluation data it was scored on, or the value it was registered with is not a number or not
    known (:func:`_score_when_registered`); or its own score tag (``dev_f1``), or the run that logged
    its model, shows a score its run does not give back. None when nothing shows it had one."""
    metric = _metric_name(standing.metric)
    run_id, run, foreign = _holder_run(client, holder)
    if run_id and run is None:
        return "its run is gone, so the score it may have been registered with cannot be read"
    if foreign:
        return foreign
    if run is not None and metric in run.data.metrics:
        if not run.data.tags.get(EVALUATION_RUN_TAG):
            return "its run's tag of the data it was scored on was removed, so its score compares with nothing"
        why = _score_when_registered(client, run, holder, metric)[1]
        if why is not None:
            return why
    shown = _shown_score(dict(holder.tags), metric)  # the version's own tag, and the run that logged its model
    if shown is not None:
        return f"its tag {shown[0]} shows a score ({shown[1]:.6g}) that its run does not give back"
    logged = _score_of_the_models_run(client, holder, metric)
    if logged is not None:
        return f"the run that logged its model had logged {metric} {logged:.6g}"
    return None


def standing_from_run(client: Any, holder: Any, standing: Standing) -> Standing | None:
    """The standing of an alias ``holder`` whose version tags record none, read back from its run:
    the run's value of ``standing``'s metric as the version was registered and the run's evaluation
    key (its :data:`EVALUATION_RUN_TAG`), so that a holder whose standing tags were removed is still
    compared (it would otherwise count as a version with nothing to defend), whether it took the
    alias by the rule or by force. None when the version says why it has no score, or its run
    (gone, or never logged) lacks a known, finite value of the metric or the key."""
    tags = dict(holder.tags)
    if tags.get(UNSCORED_TAG) or tags.get(FINAL_FIT_TAG) == "train+dev":
        return None
    _, run, foreign = _holder_run(client, holder)
    if run is None or foreign:
        return None
    value, _ = _score_when_registered(client, run, holder, _metric_name(standing.metric))
    evaluation = run.data.tags.get(EVALUATION_RUN_TAG)
    if value is None or not evaluation:
        return None
    return Standing(standing.metric, value, standing.direction, evaluation)


def _shown_score(tags: Mapping[str, str], metric: str) -> tuple[str, float] | None:
    """(tag, value) of the version tag that shows ``metric``'s score (``dev_f1``, or a sweep's
    ``evaluate.dev_f1``; written rounded, ``.4f`` or ``.6g``), or None when there is none or it is no
    number."""
    for key, text in tags.items():
        if key.startswith("standing.") or _metric_name(key) != metric:
            continue
        try:
            return key, float(text)
        except ValueError:
            continue
    return None


def standing_doubt(client: Any, holder: Any, current: Standing) -> str | None:
    """Why the standing an alias ``holder``'s tags record (``current``) cannot be trusted (a tag
    edited by hand), or None. It is doubted when the version's own tag of the score (``dev_f1``)
    shows another value, and when the run it names had logged another value when it was
    registered, several differing ones, or one that is not a number, and when the pipeline run
    that logged its model (found from MLflow's own run id of the version) had logged another value.
    A run that is gone leaves the tags to speak for themselves only when its score tag confirms
    the standing; a run that logged no such score, or a version of no run, leaves them to speak
    as they are."""
    metric = _metric_name(current.metric)
    shown = _shown_score(dict(holder.tags), metric)
    if shown is not None and not math.isclose(shown[1], current.value, rel_tol=1e-5, abs_tol=1e-4):  # shown rounded
        return f"its tags say {metric} {current.value:.6g}, but its tag {shown[0]} says {shown[1]:.6g}"
    run_id, run, foreign = _holder_run(client, holder)
    if foreign:
        return foreign
    if run is None:
        if run_id and shown is None:
            return f"the run it names ({run_id}) is gone and no tag of its {metric} confirms its standing"
        return None
    value, why = _score_when_registered(client, run, holder, metric)
    if why is not None:
        return why
    if value is not None and not math.isclose(value, current.value, rel_tol=1e-9, abs_tol=1e-12):
        return f"its tags say {metric} {current.value:.6g}, but its run had logged {value:.6g} when it was registered"
    logged = _score_of_the_models_run(client, holder, metric)
    if logged is not None and not math.isclose(logged, current.value, rel_tol=1e-9, abs_tol=1e-12):
        return f"its tags say {metric} {current.value:.6g}, but the run that logged its model had logged {logged:.6g}"
    return None


def _score_of_the_models_run(client: Any, holder: Any, metric: str) -> float | None:
    """The one value of ``metric`` logged, by the time ``holder`` was registered, by the pipeline
    run that logged its model: the parent of MLflow's own ``run_id`` of the version (a stage run;
    no client can edit it, unlike the ``run_id`` tag), else that run itself. None when neither
    gives one value (gone, no such metric, or several values)."""
    run_id = getattr(holder, "run_id", None)
    if not run_id:
        return None
    try:
        run = client.get_run(run_id)
        parent = run.data.tags.get("mlflow.parentRunId")
        run = client.get_run(parent) if parent else run
    except MlflowException:
        return None
    return _score_when_registered(client, run, holder, metric)[0]


def alias_decision(
    new: Standing | None,
    current: Standing | None,
    has_holder: bool,
    force: bool,
    holder_tags: Mapping[str, str] | None = None,
    unscored: str = "",
    force_declined: str = "",
    holder_unreadable: str | None = None,
    holder_doubt: str | None = None,
) -> tuple[bool, str]:
    """Whether the alias moves to the version of standing ``new`` from its current holder (of
    standing ``current``; ``has_holder`` False: the alias is free), and why, in one line (the rule
    is in the module docstring).

    Parameters
    ----------
    new, current : the new version's and the holder's standings (None: none recorded).
    has_holder : whether a version holds the alias.
    force : ``registry.force_alias``.
    holder_tags : the holder's version tags, which say what a holder without a standing is
        (:func:`holder_without_standing`); None counts as a version registered before standings.
    unscored : why the new version has no standing (named in the reason), e.g. ``trained on
        train+dev: no dev score``.
    force_declined : why ``registry.force_alias=true``, though set, was not applied to this version
        (named in the reason instead of the hint to force the move).
    holder_unreadable : why the holder's score cannot be read from its run (:func:`holder_unreadable`).
    holder_doubt : why the holder's recorded standing disagrees with its run (:func:`standing_doubt`):
        the alias then stays unless forced.
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
    if holder_doubt:
        return False, f"kept: the holder's recorded standing cannot be trusted ({holder_doubt}); {hint}"
    if current is None:
        what, replaceable = holder_without_standing(holder_tags if holder_tags is not None else {}, holder_unreadable)
        if replaceable:
            return True, f"moved: the holder records no standing to defend ({what})"
        return (
            False,
            f"kept: the holder records no standing to compare with ({what}); {hint}",
        )
    if (_metric_name(new.metric), new.direction) != (_metric_name(current.metric), current.direction):
        return (
            False,
            f"kept: the holder was chosen by {current.metric} ({current.direction}), "
            f"this version by {new.metric} ({new.direction})",
        )
    if not new.evaluation or new.evaluation != current.evaluation:
        return False, "kept: the holder was scored on other evaluation data (files, columns, label, scheme or dev split differ)"
    if not new.at_least_as_good_as(current):
        return False, f"kept: {new.metric} {new.value:.6g} is worse than the holder's {current.value:.6g}"
    return True, f"moved: {new.metric} {new.value:.6g} is at least the holder's {current.value:.6g}"


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
            current = Standing.from_tags(holder.tags) if holder is not None else None
            unreadable = doubt = None
            if holder is not None and current is None and standing is not None:
                current = standing_from_run(client, holder, standing)
                unreadable = holder_unreadable(client, holder, standing) if current is None else None
            elif holder is not None and current is not None and not force:
                doubt = standing_doubt(client, holder, current)
            holder_tags = dict(holder.tags) if holder is not None else None
            moved, reason = alias_decision(
                standing, current, holder is not None, force, holder_tags, unscored, force_declined, unreadable, doubt
            )
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
