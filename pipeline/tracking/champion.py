"""The registry's alias rule: ``@champion`` only moves forward.

Every registered version records its *standing*: the metric it was chosen by, its value, the
direction in which that metric improves, and a key of the data it was measured on (the contents
of the train, dev and test files, as the dev split may be carved from the train file, and the
settings that read them: columns, label, scheme, dev split; :func:`evaluation_key`). A new
version takes the alias only when its standing is at least as good as the current holder's on
the same data by the same metric; otherwise the alias stays and the new version's tags say why.
``registry.force_alias=true`` moves it regardless.

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
from pathlib import Path
from typing import Any

from filelock import FileLock
from mlflow.exceptions import MlflowException

log = logging.getLogger(__name__)

# version tags of a standing
METRIC_TAG, VALUE_TAG, DIRECTION_TAG, EVALUATION_TAG = (
    "standing.metric",
    "standing.value",
    "standing.direction",
    "standing.evaluation",
)
DECISION_TAG = "alias_decision"  # why the alias moved to this version or stayed where it was

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
        digest = (file_digests or {}).get(f"file:{split}")
        files[split] = {"content": digest} if digest else {"path": spec.get("path"), "sha256": spec.get("sha256")}
    picked["files"] = files
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:16]


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
        """The standing a version's tags record, or None (a version registered before standings)."""
        try:
            return cls(tags[METRIC_TAG], float(tags[VALUE_TAG]), tags[DIRECTION_TAG], tags[EVALUATION_TAG])
        except (KeyError, ValueError):
            return None

    def at_least_as_good_as(self, other: Standing) -> bool:
        if self.direction == "minimize":
            return self.value <= other.value
        return self.value >= other.value


def alias_decision(new: Standing | None, current: Standing | None, has_holder: bool, force: bool) -> tuple[bool, str]:
    """Whether the alias moves to the version of standing ``new`` from its current holder (of
    standing ``current``; ``has_holder`` False: the alias is free), and why, in one line."""
    if force:
        return True, "moved: forced (registry.force_alias=true)"
    if not has_holder:
        return True, "moved: no version held the alias"
    if new is None or not math.isfinite(new.value):
        return False, "kept: this version has no score to compare"
    if current is None:
        return (
            False,
            "kept: the holder records no standing to compare with (registered by an older version); "
            "force the move with registry.force_alias=true",
        )
    if (new.metric, new.direction) != (current.metric, current.direction):
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
    if not registry_uri.startswith("sqlite:///"):
        yield False
        return
    database = Path(registry_uri[len("sqlite:///") :])
    with FileLock(database.with_name(database.name + ".registry.lock")):
        yield True


def _holder(client: Any, name: str, alias: str) -> Any:
    try:
        return client.get_model_version_by_alias(name, alias)
    except MlflowException:
        return None


def settle_alias(
    client: Any, name: str, alias: str, version: str, standing: Standing | None, force: bool, registry_uri: str
) -> tuple[bool, str]:
    """Move ``alias`` of registered model ``name`` to ``version`` (of ``standing``) when
    :func:`alias_decision` says so, as one step, and tag the version with the decision.

    On a SQLite registry the holder is read, the decision taken and the alias set under
    :func:`registry_lock`. Elsewhere (a tracking server has no lock to take) the alias is set right
    after the read, then read again: when another registration set it meanwhile, the decision is
    taken again against that version (ties and forced moves go to the later version) and the alias
    set again if this version wins, up to :data:`REPAIR_ROUNDS` times. What remains there: two
    registrations whose read and set interleave exactly (read, read, set, check, set) can still
    leave the later-set, worse version.

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
            moved, reason = alias_decision(standing, current, holder is not None, force)
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
