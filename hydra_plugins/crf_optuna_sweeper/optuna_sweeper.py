"""``hydra/sweeper=optuna``: model-based search (Optuna's ask/tell) with pruning, as a Hydra sweeper.

The sweeper keeps ``n_jobs`` trials running: it asks the study for a trial (TPE by default,
seeded; with the constant liar, so trials running together differ), turns its values into the
job's overrides and hands the job to whatever launcher is configured (joblib, Ray, SLURM), through
the launchers' own contract, so every launcher works. With ``dispatch=async`` (the default for
the joblib and submitit launchers) each trial is its own launcher call, made from a thread, and
the next trial is asked as soon as one ends; with ``dispatch=batch`` (the default for the others)
``n_jobs`` trials go to the launcher together and the next batch waits for the slowest. When a
job ends the sweeper tells the study its result: the value the job returned (its dev score by default), FAIL
for a job that raised or returned none; a job whose pruner stopped it has already told the study
itself (PRUNED) from wherever it ran. The study lives in a SQL database (by default
``<paths.output_dir>/optuna.db``, beside the MLflow store; ``hydra.sweeper.storage=<URL>`` for a
shared one), so jobs on other machines report to it and a study can be resumed by name
(``hydra.sweeper.study_name=<name>``). The sweep's MLflow parent run, its summary and the
registered champion come from the project's sweep callback as for a grid.

Settings (``conf/hydra/sweeper/optuna.yaml``): ``params`` (the search space, Hydra's sweep grammar,
see :mod:`pipeline.sweeps.search`), ``n_trials``, ``n_jobs`` (trials running at once), ``direction``,
``metric`` (null: the dev score), ``seed``, ``storage``, ``study_name``, ``sampler`` and ``pruner``
(``kind`` and the Optuna class's arguments), ``enqueue`` (settings to try first, e.g. a known good one),
``dispatch`` (``auto``, ``async`` or ``batch``), ``warm_start`` and ``warm_start_keys`` (a trial
starts from the weights of the finished trial of this sweep nearest to it that differs only in
those keys, the trainer and the regularisation strengths, as a regularisation path's points do:
fewer iterations to the same optimum of a convex objective; the job checks that the weights are
of its algorithm and model layout).
Everything is checked before the first job starts, and before the sweep's MLflow parent run is
created (the sweep callback calls :meth:`OptunaSweeper.preflight` first): a setting that cannot work
ends the sweep with one line naming it (exit code 2), as a bad setting ends a run; so does a search
space that names a config group option Hydra does not know (``trainer=choice(nosuch, lbfgs)``) or a
config key that does not exist, a value no trial can pass (``choice(0.1, nan)``, ``range(0, 1, 0)``),
a trial's job that its run would refuse (every choice and both ends of every range are composed
with the fixed settings and checked as a run checks them: ``trainer.c2=choice(0.1, -1)``,
``data.final_fit=nosuch``), or an objective no trial can have (the dev score under
``data.final_fit=train+dev``, a metric of a stage the trials do not run, an F1 of a dataset
without chunks). No study is created then. Each trial records the process that asked it (its PID,
host and start time, as user attributes ``crf.owner`` and ``crf.process_start``); a sweep on a study first
fails the RUNNING trials whose process ran on this host and is gone (a sweep killed by SIGKILL),
and leaves those of other hosts, which may belong to live sweeps of a shared study.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import BrokenExecutor
from pathlib import Path
from typing import Any

from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, ListConfig, OmegaConf

_ABSENT = object()  # what OmegaConf.select gives for a key the config lacks
WARM_START_KEYS = ("trainer", "trainer.strength", "trainer.c1", "trainer.c2")  # where a warm-start source may differ

log = logging.getLogger(__name__)

RESULTS_FILE = "optuna_results.yaml"
# launchers (by class name, their subclasses too) whose launch() may be called from several threads at once
CONCURRENT_LAUNCHERS = {"JoblibLauncher", "BaseSubmititLauncher"}
WORKER_DEATHS = 3  # trials in a row whose worker process died (killed, out of memory) that stop a sweep
STORAGE_TAG = "optuna.storage"  # on the sweep's parent run, with the study's name (pipeline.sweeps.trial_environment.STUDY_TAG)


def _plain(value: Any) -> Any:
    """A config node as plain containers (resolved); anything else as it is."""
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


class WorkerDied(RuntimeError):
    """A trial's job ended with the launcher's worker process, before it could report."""


class NotLaunched(RuntimeError):
    """A trial asked before the sweep was stopped, whose job was not started."""


def _worker_death(error: BaseException) -> str:
    """One line on why a launcher's worker pool broke (joblib's TerminatedWorkerError names the exit codes)."""
    from pipeline.sweeps.sigterm import worker_exit

    how = worker_exit(error)
    return f"its worker process died before the job reported ({how}; a kill, e.g. by the out-of-memory killer, or a crash)"


def _fail(study: Any, trial: Any) -> None:
    """Tell the study ``trial`` (a trial or its number) failed, unless it has finished: also when another thread (a trial's
    launch and the sweep's loop both fail it on an interruption) tells it at the same moment."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    try:
        study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
    except UpdateFinishedTrialError:  # Optuna checks, then updates: the other tell came in between
        pass


#: the study user attribute of each sweeping process (:meth:`OptunaSweeper._record_sweeper`), by owner
SWEEPER_ATTR = "crf.sweeper."


def _gone_sweepers(sweepers: list[dict], began: Any) -> list[dict[str, str]]:
    """The owner tags of the sweeps (records of :meth:`OptunaSweeper._record_sweeper`) that had the
    study open when a trial began (``began``, a datetime), when there are some and every one of them
    is known to be gone (:func:`pipeline.tracking.lifecycle.owner_gone`); else an empty list."""
    from pipeline.tracking.lifecycle import OWNER_TAG, PROCESS_START_TAG, owner_gone

    if began is None:
        return []
    start = began.timestamp()
    holders = [
        v for v in sweepers
        if isinstance(v.get("since"), (int, float)) and v["since"] <= start and OWNER_TAG in v
        and not (isinstance(v.get("closed"), (int, float)) and v["closed"] < start)  # ended before the trial began
    ]  # fmt: skip
    tags = [{key: str(v[key]) for key in (OWNER_TAG, PROCESS_START_TAG) if key in v} for v in holders]
    return tags if tags and all(owner_gone(t) for t in tags) else []


class OptunaSweeper(Sweeper):
    """See the module docstring."""

    def __init__(
        self,
        params: Mapping[str, str] | None = None,
        n_trials: int = 20,
        n_jobs: int = 2,
        direction: str = "maximize",
        metric: str | None = None,
        seed: int | None = 0,
        storage: str | None = None,
        study_name: str | None = None,
        sampler: Mapping[str, Any] | None = None,
        pruner: Mapping[str, Any] | None = None,
        enqueue: Sequence[Mapping[str, Any]] | None = None,
        dispatch: str = "auto",
        warm_start: bool = True,
        warm_start_keys: Sequence[str] = WARM_START_KEYS,
        strong_first: bool = True,
    ) -> None:
        super().__init__()
        self.params = _plain(params) or {}
        self.n_trials, self.n_jobs = n_trials, n_jobs
        self.direction, self.metric, self.seed = direction, metric, seed
        self.storage, self.study_name = storage, study_name
        self.sampler, self.pruner = _plain(sampler) or {}, _plain(pruner) or {}
        self.enqueue = _plain(enqueue) or []
        self.dispatch = dispatch
        self.warm_start = warm_start
        self.warm_start_keys = _plain(warm_start_keys)
        self.strong_first = strong_first
        self.first_failure: str | None = None  # why this sweep's first failed trial failed
        self.last_death = ""  # the last trial whose worker process died, and how
        self.asked: set[int] = set()  # the numbers of this sweep's trials (a shared study has others')
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.config_loader: Any = None  # Hydra's, to list the config groups' options (None: not checked)
        self._evaluation: dict[str, str] | None = None  # the data the trials are scored on (_evaluation_data)
        self.launcher = None
        self.owner: dict[str, str] | None = None  # this process, recorded on each trial it asks
        self._record: dict[str, Any] | None = None  # this process on the study (_record_sweeper)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.config_loader = hydra_context.config_loader
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def _check_counts(self) -> None:
        from pipeline.sweeps.cluster import UNPASSABLE, unpassable
        from pipeline.sweeps.search import SweeperSettingError

        for name in ("n_trials", "n_jobs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SweeperSettingError(f"hydra.sweeper.{name}={value!r}: a whole number, at least 1")
        for name in ("warm_start", "strong_first"):
            if not isinstance(getattr(self, name), bool):
                raise SweeperSettingError(f"hydra.sweeper.{name}={getattr(self, name)!r}: true or false")
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32):
            raise SweeperSettingError(f"hydra.sweeper.seed={seed!r}: a whole number from 0 to 2**32 - 1, or null")
        name = self.study_name
        if name is not None and (not str(name).strip() or str(name) != str(name).strip() or len(str(name)) > 512):
            raise SweeperSettingError(  # Optuna's storages hold names of at most 512 characters
                f"hydra.sweeper.study_name={name!r}: a name of 1 to 512 characters without surrounding blanks, "
                "or null (a new study named after the sweep)"
            )
        if name is not None and unpassable(name):
            raise SweeperSettingError(
                f"hydra.sweeper.study_name={name!r}: the trials' jobs are given it in their environment, which cannot "
                f"carry {UNPASSABLE}; choose a name without"
            )
        startup = self.sampler.get("n_startup_trials", 10)
        if isinstance(startup, bool) or not isinstance(startup, int) or startup < 0:
            raise SweeperSettingError(f"hydra.sweeper.sampler.n_startup_trials={startup!r}: a whole number, at least 0")
        keys = self.warm_start_keys
        if isinstance(keys, str) or not isinstance(keys, Sequence) or not all(isinstance(k, str) for k in keys):
            raise SweeperSettingError(f"hydra.sweeper.warm_start_keys={keys!r}: a list of config keys")

    @classmethod
    def preflight(cls, config: DictConfig) -> None:
        """Check the sweeper's settings (``config.hydra.sweeper``, the search space with the
        command line's sweep overrides, the storage, a resumed study) before anything of the
        multirun exists: the project's sweep callback calls this before it creates the sweep's
        MLflow parent run, so a setting that cannot work ends the multirun (one line, exit code 2)
        and leaves no FAILED parent run in the store. Settings that Hydra cannot pass to the
        sweeper at all are left to Hydra, which says so when it makes the sweeper."""
        from hydra.core.global_hydra import GlobalHydra
        from hydra.utils import instantiate

        from pipeline.sweeps.search import SweeperSettingError

        try:
            sweeper = instantiate(config.hydra.sweeper)
        except Exception:  # Hydra reports it as it makes the sweeper
            return
        if not isinstance(sweeper, OptunaSweeper):
            return
        sweeper.config = config
        hydra = GlobalHydra.instance()
        sweeper.config_loader = hydra.config_loader() if hydra.is_initialized() else None
        arguments = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)  # as Hydra hands them to sweep()
        try:
            sweeper._checked(list(arguments))  # type: ignore[arg-type]
        except SweeperSettingError as error:
            log.error("%s", error)
            sys.exit(2)

    def _checked(self, arguments: list[str]) -> tuple[Any, list[dict[str, Any]], str, str, Any]:
        """Check every setting, creating nothing but a SQLite storage's file: (the search space,
        the enqueued settings, the dispatch, the storage URL, the opened storage). A study resumed
        by name must optimise the same metric in the same direction, and its trials' distributions
        must fit the search space (Optuna refuses a categorical whose choices changed); every
        config group choice must be an option Hydra knows. SweeperSettingError (one line) otherwise."""
        import optuna

        from pipeline.sweeps import search

        space = search.parse_space(self.params, arguments)
        search.check_strength(space)
        enqueued = search.check_enqueued(self.enqueue, space)
        dispatch = self._dispatch()
        self._check_counts()
        assert self.config is not None
        given = [key for key in self.warm_start_keys if key not in WARM_START_KEYS]  # the defaults suit the pipeline's config
        lacking = [key for key in given if OmegaConf.select(self.config, key, default=_ABSENT) is _ABSENT]
        if lacking:  # a key no config has would make every trial differ from every other: no warm start, silently
            raise search.SweeperSettingError(f"hydra.sweeper.warm_start_keys: {', '.join(lacking)} is not a key of the config")
        search.check_objective(self.metric, self.direction, self.pruner, OmegaConf.select(self.config, "train.dev_every"))
        if self.config_loader is not None:  # Hydra's: it lists the config groups' options and composes the trials' jobs
            search.check_config_keys(space, self.config, self.config_loader)
            search.check_trials(space, self.config, self.config_loader, self.metric)
            self._evaluation = self._evaluation_data(space)
        search.build_sampler(self.sampler, self.seed)
        search.build_pruner(self.pruner)
        url = search.storage_url(self.storage, OmegaConf.select(self.config, "paths.output_dir", default="outputs"))
        from pipeline.report import redacted, shown_url
        from pipeline.sweeps.cluster import UNPASSABLE, unpassable

        if unpassable(url):  # the trials' jobs open the study through their environment
            raise search.SweeperSettingError(
                f"hydra.sweeper.storage={shown_url(url)!r}: the trials' jobs are given it in their environment, "
                f"which cannot carry {UNPASSABLE}; choose one without"
            )
        if OmegaConf.select(self.config, "tracking", default=None) is not None:
            from pipeline.engine.validate import SettingsError
            from pipeline.tracking import registry_uri, tracking_uri

            try:
                stores = {"tracking": tracking_uri(self.config), "registry": registry_uri(self.config)}
            except SettingsError as error:  # two stores named
                raise search.SweeperSettingError(str(error)) from None
            search.check_storage_apart(url, stores)
        search.check_storage_is_optunas(url)
        try:
            storage = search.open_storage(url)
        except Exception as error:  # a database that cannot be reached, a driver not installed, a bad URL
            first = (str(error).replace(url, shown_url(url)).strip().splitlines() or [""])[0]  # it may quote the URL
            why = f"{type(error).__name__}: {redacted(first)[:300]}"
            raise search.SweeperSettingError(f"hydra.sweeper.storage: cannot open {shown_url(url)} ({why})") from None
        if self.study_name is not None:  # a study resumed by name: checked before the sweep changes anything
            try:
                storage.get_study_id_from_name(str(self.study_name))
            except KeyError:  # a new study
                pass
            else:
                optuna.logging.disable_default_handler()
                optuna.logging.enable_propagation()
                existing = optuna.load_study(study_name=str(self.study_name), storage=storage)
                self._check_study(existing, space, shown_url(url))
        return space, enqueued, dispatch, url, storage

    def _open_study(self, space: Any, url: str, storage: Any) -> Any:
        """Create (or load, by name) the study in ``storage`` (at ``url``), checked as by :meth:`_checked`."""
        import optuna

        from pipeline.sweeps import search
        from pipeline.tracking import SWEEP_ID_VARIABLE

        assert self.config is not None
        # a new study's name: the sweep's id (as on its MLflow parent run), unique to this sweep, so two
        # sweeps started in the same second do not share a study
        sweep_id = os.environ.get(SWEEP_ID_VARIABLE) or f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        name = self.study_name or f"{self.config.hydra.job.name}-{sweep_id}"
        optuna.logging.disable_default_handler()  # Optuna's messages go through Hydra's logging
        optuna.logging.enable_propagation()
        study = optuna.create_study(
            storage=storage,
            study_name=str(name),
            sampler=search.build_sampler(self.sampler, self.seed),
            pruner=search.build_pruner(self.pruner),
            direction=self.direction,
            load_if_exists=True,
        )
        self._check_study(study, space, search.shown_url(url))
        study.set_user_attr("metric", self.metric)  # what the jobs report and return
        if self._evaluation is not None:  # the data the objective is measured on: a resume on other data is refused
            study.set_user_attr("evaluation", self._evaluation)
        study.set_user_attr("pruner", dict(self.pruner))  # the jobs build the same pruner
        return study

    def _check_study(self, study: Any, space: Any, where: str) -> None:
        """A resumed ``study`` optimises in this sweep's direction, its metric and a compatible space."""
        from pipeline.sweeps.search import SweeperSettingError

        if len(study.directions) != 1:  # another program's multi-objective study: one metric cannot continue it
            raise SweeperSettingError(
                f"study {study.study_name!r} in {where} optimises {len(study.directions)} objectives "
                f"({', '.join(d.name.lower() for d in study.directions)}), not one metric: choose another "
                "hydra.sweeper.study_name"
            )
        if study.direction.name.lower() != self.direction:
            raise SweeperSettingError(
                f"study {study.study_name!r} in {where} was created to {study.direction.name.lower()}, "
                f"not {self.direction}: choose another hydra.sweeper.study_name"
            )
        self._check_resumed(study, space, where)

    def _evaluation_data(self, space: Any) -> dict[str, str]:
        """The data the trials' objective is measured on: the dataset name and its evaluation key
        (:func:`pipeline.tracking.champion.evaluation_key`: files, columns, label, dev split) of the
        job the sweep's fixed settings compose, and the model its trials fit (the fixed ``model``'s
        name, or :data:`pipeline.sweeps.search.SEARCHED_MODELS` when the space searches it)."""
        from pipeline.sweeps import search
        from pipeline.tracking.champion import evaluation_key

        job = self.config_loader.load_sweep_config(self.config, list(space.fixed))
        dataset = OmegaConf.to_container(job.dataset, resolve=True)
        model = search.SEARCHED_MODELS if "model" in space.distributions else str(job.model.name)
        return {
            "dataset": str(dataset.get("name")),
            "key": evaluation_key(dataset),
            "model": model,
            "space": sorted(space.distributions),
            "fixed": search.fixed_settings(job),
        }

    def _check_resumed(self, study: Any, space: Any, where: str) -> None:
        from optuna.distributions import check_distribution_compatibility

        from pipeline.sweeps.search import SweeperSettingError

        name = study.study_name
        if "metric" in study.user_attrs and study.user_attrs["metric"] != self.metric:
            before = study.user_attrs["metric"] or "the dev score"
            raise SweeperSettingError(
                f"study {name!r} in {where} optimises {before}, not {self.metric or 'the dev score'}: "
                "choose another hydra.sweeper.study_name"
            )
        before = study.user_attrs.get("evaluation")
        if before is None and self._evaluation is not None and study.get_trials(deepcopy=False):
            log.warning(
                "study %r records no evaluation data (made by an earlier version): its trials are taken to be scored on "
                "dataset %s, as this sweep's are",
                name,
                self._evaluation["dataset"],
            )
        if isinstance(before, dict) and self._evaluation is not None and before.get("key") != self._evaluation["key"]:
            changed = (
                "its files, columns or dev split" if before.get("dataset") == self._evaluation["dataset"] else "another dataset"
            )
            raise SweeperSettingError(
                f"study {name!r} in {where} measured its trials on dataset {before.get('dataset')} ({before.get('key')}), "
                f"this sweep on {self._evaluation['dataset']} ({self._evaluation['key']}: {changed}), so their scores do not "
                "compare: choose another hydra.sweeper.study_name"
            )
        recorded = before if isinstance(before, dict) and self._evaluation is not None else {}
        now = self._evaluation or {}
        if recorded.get("model") not in (None, now.get("model")):
            raise SweeperSettingError(
                f"study {name!r} in {where} has trials of model={recorded['model']}, this sweep's would be of "
                f"model={now['model']}, so their scores are not of one search space: choose another hydra.sweeper.study_name"
            )
        if recorded.get("space") not in (None, now.get("space")):
            raise SweeperSettingError(
                f"study {name!r} in {where} searched {', '.join(recorded['space'])}, this sweep {', '.join(now['space'])}: "
                "a study's trials are points of one search space: choose another hydra.sweeper.study_name"
            )
        fixed = recorded.get("fixed")
        if isinstance(fixed, dict) and now.get("fixed") is not None:
            changed = sorted(k for k in {*fixed, *now["fixed"]} if fixed.get(k) != now["fixed"].get(k))
            if changed:
                raise SweeperSettingError(
                    f"study {name!r} in {where} ran its trials with other fixed settings (the sections a stage reads "
                    f"differ: {', '.join(changed)}), so their scores do not compare: choose another hydra.sweeper.study_name"
                )
        for trial in study.get_trials(deepcopy=False):
            for key, before in trial.distributions.items():
                if key not in space.distributions:
                    continue
                try:
                    check_distribution_compatibility(before, space.distributions[key])
                except ValueError as error:
                    raise SweeperSettingError(
                        f"study {name!r} in {where} searched {key} as {before} (trial {trial.number}), which cannot "
                        f"become {space.distributions[key]} ({error}): choose another hydra.sweeper.study_name"
                    ) from None

    def sweep(self, arguments: list[str]) -> list[Sequence[JobReturn]]:

        from pipeline.sweeps import search
        from pipeline.sweeps.cluster import pass_to_jobs

        assert self.config is not None and self.launcher is not None
        try:
            space, enqueued, dispatch, url, storage = self._checked(arguments)
            study = self._open_study(space, url, storage)
        except search.SweeperSettingError as error:  # one line naming the setting, as for a run's settings
            log.error("%s", error)
            sys.exit(2)
        self._fail_orphans(study, storage)
        self._record_sweeper(study)
        started = len(study.get_trials(deepcopy=False))  # a resumed study's earlier trials are not this sweep's
        if started:  # seeded as before, the sampler's random draws would replay the earlier sweeps' settings
            study.sampler = search.build_sampler(self.sampler, search.derived_seed(self.seed, 1 + started))
        for params in enqueued + self._startup(study, space, len(enqueued), started):  # asked before anything is sampled
            study.enqueue_trial(params, skip_if_exists=True)
        variables = {search.STORAGE_VARIABLE: url, search.STUDY_VARIABLE: study.study_name}
        if self.metric:
            variables[search.METRIC_VARIABLE] = str(self.metric)
        pass_to_jobs(self.config, variables)  # wherever the jobs run (Ray, SLURM too)
        self._record_on_parent_run(study.study_name, url)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        log.info(
            "study %s in %s: %d trials, %d at once (%s); searching %s%s",
            study.study_name,
            search.shown_url(url),
            self.n_trials,
            self.n_jobs,
            dispatch,
            ", ".join(f"{k} ~ {d}" for k, d in space.distributions.items()),
            f"; fixed {' '.join(space.fixed)}" if space.fixed else "",
        )
        if dispatch == "async":
            returns = self._run_async(study, space, sweep_dir)
        else:
            returns = self._run_batches(study, space, sweep_dir)
        completed = self._report(study, url, sweep_dir)
        self._close_record(study)
        if not completed:  # nothing to choose or register: as for a grid whose jobs all failed, no success
            raise SystemExit(1)
        return returns

    def _record_sweeper(self, study: Any) -> None:
        """Record this process on the study before it asks a trial (user attribute
        ``crf.sweeper.<pid>@<host>``: its owner tags and since when it sweeps): a trial asked by a
        sweep killed before it recorded the trial's owner is then known to be that sweep's."""
        from pipeline.tracking.lifecycle import OWNER_TAG, owner_tags

        self.owner = self.owner or owner_tags()
        self._record = {**self.owner, "since": time.time()}
        study.set_user_attr(SWEEPER_ATTR + self.owner[OWNER_TAG], self._record)

    def _close_record(self, study: Any) -> None:
        """Mark this process's record (:meth:`_record_sweeper`) ended: it asked no trial after now."""
        from pipeline.tracking.lifecycle import OWNER_TAG

        if self.owner is not None and self._record is not None:
            study.set_user_attr(SWEEPER_ATTR + self.owner[OWNER_TAG], {**self._record, "closed": time.time()})

    def _fail_orphans(self, study: Any, storage: Any) -> list[int]:
        """Tell the study FAIL for each RUNNING trial whose sweeper process is gone (killed, e.g. by
        SIGKILL, so it never told the study how the trial ended), as the next start on the host
        ends such a trial's MLflow runs FAILED: a trial records its owner (``crf.owner = <pid>@<host>``
        and ``crf.process_start``) when it is asked, and it is failed only when that process ran
        on this host and its PID no longer runs or belongs to a process started at another time
        (:func:`pipeline.tracking.lifecycle.owner_gone`). A trial with no owner recorded (its sweep
        was killed between asking it and recording it) is failed when every sweep that had the
        study open when the trial started (:meth:`_record_sweeper`) is gone so. A RUNNING trial of
        another host, or of a sweep that may be live, is left as it is, and logged. The numbers of
        the trials failed."""
        from optuna.exceptions import UpdateFinishedTrialError
        from optuna.trial import TrialState

        from pipeline.tracking.lifecycle import OWNER_TAG, PROCESS_START_TAG, owner_gone

        failed, left = [], []
        study_id = storage.get_study_id_from_name(study.study_name)
        sweepers = [v for k, v in study.user_attrs.items() if k.startswith(SWEEPER_ATTR) and isinstance(v, dict)]
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = trial.user_attrs.get(OWNER_TAG)
            recorded = {key: str(trial.user_attrs[key]) for key in (OWNER_TAG, PROCESS_START_TAG) if key in trial.user_attrs}
            reason = f"process {owner} died"
            if owner is None:  # asked by a sweep killed before it recorded the owner?
                gone = _gone_sweepers(sweepers, trial.datetime_start)
                if gone:
                    recorded = gone[-1]
                    owners = ", ".join(t[OWNER_TAG] for t in gone)
                    reason = f"no owner recorded, and the sweeps that had the study open then ({owners}) died"
            if not owner_gone(recorded):
                left.append(f"{trial.number} ({owner or 'no owner recorded'})")
                continue
            try:
                trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
                storage.set_trial_user_attr(trial_id, "error", reason)
            except UpdateFinishedTrialError:  # its job (still running elsewhere) told the study just now
                continue
            _fail(study, trial.number)
            failed.append(trial.number)
            log.warning("trial %d was left RUNNING: %s; marked FAIL", trial.number, reason)
        if left:
            log.info("RUNNING trials of live or other hosts' sweeps, left as they are: %s", ", ".join(left))
        return failed

    def _startup(self, study: Any, space: Any, enqueued: int, started: int) -> list[dict[str, Any]]:
        """With ``strong_first`` and ``warm_start``, a new study and the TPE sampler: the settings
        of TPE's random start-up trials (the same seeded draws), strongest regularisation first
        (:func:`pipeline.sweeps.search.strongest_first_startup`); else none."""
        from pipeline.sweeps import search

        if not (self.strong_first and self.warm_start) or started or self.sampler.get("kind", "tpe") != "tpe":
            return []
        startup = self.sampler.get("n_startup_trials", 10)  # TPE's default
        count = min(startup, self.n_trials) - enqueued
        ordered = search.strongest_first_startup(space, self.warm_start_keys, count, self.seed)
        if ordered:
            log.info("start-up trials, strongest first: %s", "; ".join(" ".join(search.trial_overrides(p)) for p in ordered))
            # TPE's own random draws (trials asked before n_startup_trials have finished) would
            # replay these: it gets a seed of its own
            study.sampler = search.build_sampler(self.sampler, search.derived_seed(self.seed))
        return ordered

    def _dispatch(self) -> str:
        """``async`` or ``batch``: what ``hydra.sweeper.dispatch`` asks for (``auto``: async for the
        launchers known to take concurrent calls, joblib and submitit; batch for the others: the
        basic launcher runs its jobs in this process and Ray's initialises Ray in its first call)."""
        from pipeline.sweeps.search import SweeperSettingError

        if self.dispatch not in ("auto", "async", "batch"):
            raise SweeperSettingError(f"hydra.sweeper.dispatch={self.dispatch!r}: auto, async or batch")
        if self.dispatch != "auto":
            return self.dispatch
        names = {cls.__name__ for cls in type(self.launcher).__mro__}
        return "async" if names & CONCURRENT_LAUNCHERS else "batch"

    def _ask(self, study: Any, space: Any) -> tuple[Any, dict[str, Any], list[str]]:
        """A new trial, its sampled values and its job's overrides; with ``warm_start``, the job is
        offered the weights of the nearest finished trial of this sweep that differs from it in
        ``warm_start_keys`` only (:func:`pipeline.sweeps.search.warm_start_source`), if there is
        one (earlier sweeps of a resumed study may have had other fixed settings)."""
        from optuna.trial import TrialState

        from pipeline.sweeps import search
        from pipeline.tracking.lifecycle import owner_tags

        trial = study.ask(space.distributions)
        self.asked.add(trial.number)
        self.owner = self.owner or owner_tags()
        for key, value in self.owner.items():  # whose trial it is: a later sweep fails it if this process is gone
            trial.set_user_attr(key, value)
        values = {key: trial.params[key] for key in space.distributions}
        overrides = [
            *space.fixed,
            *search.trial_overrides(values),
            f"++hydra.job.env_set.{search.TRIAL_VARIABLE}='{trial.number}'",
        ]
        if self.warm_start:
            finished = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                        if t.number in self.asked]  # fmt: skip
            source = search.warm_start_source(finished, values, space.distributions, self.warm_start_keys)
            if source is not None:  # the job checks the features and the cache, and says whether it did
                overrides.append(f"++hydra.job.env_set.{search.WARM_START_VARIABLE}='{source}'")
                log.info("trial %d is offered the weights of trial %d", trial.number, source)
        return trial, values, overrides

    def _launch(self, study: Any, trials: Sequence[Any], batch: list[list[str]], index: int) -> Sequence[JobReturn]:
        """The jobs of ``trials`` through the launcher; if the launcher fails (or is interrupted)
        the trials are told FAIL, since their jobs will not report, and the error goes on."""
        from pipeline.sweeps.sigterm import STOPPED_EXIT, SWEEP_STOPPING, worker_exit

        try:
            self.validate_batch_is_legal(batch)
            if SWEEP_STOPPING.is_set():  # the signal came after these trials were asked: their jobs are not started
                stopped = NotLaunched("the sweep was stopped by SIGTERM before this trial's job started")
                return [JobReturn(overrides=list(job), status=JobStatus.FAILED, _return_value=stopped) for job in batch]
            return self.launcher.launch(batch, initial_job_idx=index)
        except BrokenExecutor as error:  # a worker process died (SIGKILL, the out-of-memory killer, a crash)
            if SWEEP_STOPPING.is_set():  # the sweep is being stopped: its workers go with it, as asked
                for trial in trials:
                    _fail(study, trial)
                log.error(
                    "stopped by SIGTERM: the worker process of trial(s) %s ended with it (%s); the trials are marked FAIL",
                    ", ".join(str(t.number) for t in trials),
                    worker_exit(error),
                )
                raise SystemExit(STOPPED_EXIT) from None
            died = WorkerDied(_worker_death(error))
            log.warning("trial(s) %s: %s; the sweep goes on", ", ".join(str(t.number) for t in trials), died)
            return [JobReturn(overrides=list(job), status=JobStatus.FAILED, _return_value=died) for job in batch]
        except Exception as error:
            for trial in trials:
                _fail(study, trial)
            if SWEEP_STOPPING.is_set():  # joblib's own errors as its workers go (its executor shut down): no traceback
                first = str(error).splitlines()[0] if str(error) else ""
                log.error(
                    "stopped by SIGTERM: the launcher of trial(s) %s ended with it (%s: %s); the trials are marked FAIL",
                    ", ".join(str(t.number) for t in trials), type(error).__name__, first[:200],
                )  # fmt: skip
                raise SystemExit(STOPPED_EXIT) from None
            raise
        except BaseException:
            for trial in trials:
                _fail(study, trial)
            raise

    def _check_failures(self, outcomes: list[str], sweep_dir: Path) -> None:
        """End the sweep (exit code 1, one line) once its first ``n_jobs`` trials, and every one
        since, failed: a setting that no job can run is the usual cause. Not once the sweep is
        being stopped (its trials fail for that)."""
        from pipeline.sweeps.sigterm import SWEEP_STOPPING

        if SWEEP_STOPPING.is_set():
            return
        # a trial whose worker process died (DIED) says nothing about the settings; a run of them does
        if len(outcomes) >= WORKER_DEATHS and all(outcome == "DIED" for outcome in outcomes[-WORKER_DEATHS:]):
            log.error(
                "the worker processes of the last %d trials died (%s): stopping the sweep; if it is memory, "
                "lower hydra.sweeper.n_jobs or the training data (the jobs' logs are under %s)",
                WORKER_DEATHS,
                self.last_death,
                sweep_dir,
            )
            raise SystemExit(1)
        if len(outcomes) >= min(self.n_jobs, self.n_trials) and all(outcome == "FAIL" for outcome in outcomes):
            log.error(
                "every trial so far failed (%d), the first with: %s (the jobs' logs are under %s)",
                len(outcomes),
                self.first_failure,
                sweep_dir,
            )
            raise SystemExit(1)

    def _run_batches(self, study: Any, space: Any, sweep_dir: Path) -> list[Sequence[JobReturn]]:
        """``n_jobs`` trials per launcher call; the next batch is asked when the slowest is done."""
        from pipeline.sweeps.sigterm import SWEEP_STOPPING

        returns: list[Sequence[JobReturn]] = []
        outcomes: list[str] = []
        while len(outcomes) < self.n_trials and not SWEEP_STOPPING.is_set():  # a signalled sweep asks no more
            size = min(self.n_jobs, self.n_trials - len(outcomes))
            asked = [self._ask(study, space) for _ in range(size)]
            trials = [trial for trial, _, _ in asked]
            results = self._launch(study, trials, [overrides for _, _, overrides in asked], len(outcomes))
            returns.append(results)
            states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
            for (trial, values, _), result in zip(asked, results):
                outcomes.append(self._tell(study, trial, values, result, states[trial.number]))
            self._check_failures(outcomes, sweep_dir)
        return returns

    def _run_async(self, study: Any, space: Any, sweep_dir: Path) -> list[Sequence[JobReturn]]:
        """Up to ``n_jobs`` trials running at once, each its own launcher call (from a thread of
        this process); when one ends its result is told and the next trial is asked, so no slot
        waits for a slower trial."""
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        from pipeline.sweeps.sigterm import SWEEP_STOPPING  # set on SIGTERM: no further trial is asked

        returns: list[Sequence[JobReturn]] = []
        outcomes: list[str] = []
        running: dict[Any, tuple[Any, dict[str, Any]]] = {}
        pool = ThreadPoolExecutor(max_workers=self.n_jobs, thread_name_prefix="trial")
        try:
            asked = 0
            while running or (asked < self.n_trials and not SWEEP_STOPPING.is_set()):
                while len(running) < self.n_jobs and asked < self.n_trials and not SWEEP_STOPPING.is_set():
                    trial, values, overrides = self._ask(study, space)
                    running[pool.submit(self._launch, study, [trial], [overrides], asked)] = (trial, values)
                    asked += 1
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: running[f][0].number):
                    trial, values = running.pop(future)
                    (result,) = future.result()
                    returns.append([result])
                    state = {t.number: t.state for t in study.get_trials(deepcopy=False)}[trial.number]
                    outcomes.append(self._tell(study, trial, values, result, state))
                self._check_failures(outcomes, sweep_dir)
        except BaseException:
            for trial, _ in running.values():  # their jobs will not be told
                _fail(study, trial)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        return returns

    def _tell(self, study: Any, trial: Any, chosen: Mapping[str, Any], result: JobReturn, state: Any) -> str:
        """Tell the study how ``trial``'s job ended; its state's name (COMPLETE, PRUNED or FAIL)."""
        from optuna.trial import TrialState

        what = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in chosen.items())
        if state.is_finished():  # the job pruned it (and told the study itself)
            log.info("trial %d (%s): %s", trial.number, what, state.name)
            return state.name
        value, reason = None, None
        if result.status == JobStatus.COMPLETED:
            value = result.return_value
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                reason = f"the job returned {value!r}, not a number"
        else:
            reason = f"{type(result._return_value).__name__}: {result._return_value}"
        if isinstance(result._return_value, WorkerDied):
            self.last_death = f"trial {trial.number}: {result._return_value}"
            trial.set_user_attr("error", reason[:1000])
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            log.warning("trial %d (%s): FAIL (%s)", trial.number, what, reason)
            return "DIED"
        if reason is not None:
            self.first_failure = self.first_failure or reason.splitlines()[0][:300]
            trial.set_user_attr("error", reason[:1000])
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            log.warning("trial %d (%s): FAIL (%s)", trial.number, what, reason.splitlines()[0][:300])
            return "FAIL"
        study.tell(trial, float(value), skip_if_finished=True)
        log.info("trial %d (%s): %s %.4f", trial.number, what, self.metric or "dev score", float(value))
        return "COMPLETE"

    def _report(self, study: Any, url: str, sweep_dir: Path) -> bool:
        """This sweep's best trial and the count of each state of its trials (and the study's best
        when another sweep of it did better), logged and written to ``optuna_results.yaml``; False
        when no trial of this sweep completed (an error line says so)."""
        from optuna.trial import TrialState

        from pipeline.sweeps import search

        trials = [t for t in study.get_trials(deepcopy=False) if t.number in self.asked]
        states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        counts = {s.name.lower(): sum(t.state == s for t in trials) for s in states}
        results: dict[str, Any] = {
            "study": study.study_name,
            "storage": search.shown_url(url),
            "direction": self.direction,
            "metric": self.metric or "dev score (dev_f1, else dev_accuracy)",
            "trials": counts,
        }
        complete = [t for t in trials if t.state == TrialState.COMPLETE]  # this sweep's, as its summary
        if complete:
            pick = min if self.direction == "minimize" else max
            best = pick(complete, key=lambda t: t.value)
            results["best"] = {"trial": best.number, "value": best.value, "params": dict(best.params),
                               "overrides": search.trial_overrides(best.params)}  # fmt: skip
            earlier = study.best_trial
            if pick(earlier.value, best.value) != best.value:  # another sweep of the study did better
                results["study_best"] = {"trial": earlier.number, "value": earlier.value, "params": dict(earlier.params)}
            log.info(
                "best trial %d: %s %.4f with %s (%s)",
                best.number,
                self.metric or "dev score",
                best.value,
                " ".join(search.trial_overrides(best.params)),
                ", ".join(f"{n} {k}" for k, n in counts.items()),
            )
        else:
            log.error("no trial completed (%s): the sweep has no result", ", ".join(f"{n} {k}" for k, n in counts.items()))
        OmegaConf.save(OmegaConf.create(results), sweep_dir / RESULTS_FILE)
        self._record_on_parent_run(study.study_name, url, sweep_dir / RESULTS_FILE)
        return bool(complete)

    def _record_on_parent_run(self, study_name: str, url: str, results: Path | None = None) -> None:
        """Tag the sweep's MLflow parent run (made by the project's sweep callback, which leaves its id
        in this process's environment) with the study's name and storage, and log ``results`` to it;
        without a parent run (the callback removed from the config) nothing is recorded."""
        from mlflow.tracking import MlflowClient

        from pipeline.sweeps import search
        from pipeline.sweeps.trial_environment import STUDY_TAG
        from pipeline.tracking import SWEEP_PARENT_VARIABLE

        parent = os.environ.get(SWEEP_PARENT_VARIABLE)
        if not parent:
            return
        try:
            client = MlflowClient()
            client.set_tag(parent, STUDY_TAG, study_name)
            client.set_tag(parent, STORAGE_TAG, search.shown_url(url))
            if results is not None:
                client.log_artifact(parent, str(results))
        except Exception as error:  # the sweep's results stand without the record
            log.warning("could not record the study on the sweep's parent run %s: %s", parent, error)
