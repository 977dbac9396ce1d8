"""Speed benchmark against CRFsuite: ``python -m pipeline.benchmark`` (config ``conf/benchmark.yaml``).

For each repetition the two tools run one after the other, in alternating order, each in a fresh
process (``pipeline.apps.bench_worker``) on identical data, attributes, c1/c2 and stopping rule. The
medians of every figure and the ratios ours/CRFsuite (median of the per-repetition ratios) are
logged to the console and to MLflow with a results table (CSV, Markdown), the raw runs and a plot.
``benchmark.input`` chooses what the tools are given (see ``pipeline.apps.bench_worker``): ``batch``
(this project's extractor output), ``strings`` (lists of attribute strings per token) or
``dicts`` (the sklearn-crfsuite tutorial's feature dicts); for the last two, training includes
building the attribute index (``Trainer.append`` on CRFsuite's side) and tagging reads the lists.

A second part measures cost growth: the median CPU time of one iteration (CRFsuite's own
iteration log, which times with ``clock()``; CPU clock stamps from a per-iteration callback on
this project's side; set-up excluded) over a fixed number of iterations, and the process's peak memory, for
fractions of the training data, for the training data repeated 2 and 4 times, and for label sets
of growing size (EWT UPOS 17, XPOS 50, the joint XPOS|UPOS tags over 100).

A third part (``benchmark.per_call``) measures the paths taken one call at a time (one sentence
through each API, one long sequence, ``l2sgd``, second order over candidate labels; the compiled kernels'
warm-up and install size): see :mod:`pipeline.apps.per_call_benchmark`.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from pipeline import tracking
from pipeline.apps.bench_worker import INPUTS, TOOLS
from pipeline.apps.per_call_benchmark import per_call_table
from pipeline.engine.validate import non_switch, non_whole_number
from pipeline.report import figure, markdown_table, save_figure
from pipeline.stages.data import checksum_problem, dataset_files

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
FIGURES = [
    "feature_seconds",
    "train_seconds",
    "train_cpu_seconds",
    "iterations",
    "seconds_per_iteration",
    "iteration_seconds",
    "features",
    "tag_tokens_per_second",
    "tag_tokens_per_cpu_second",
    "input_rss_mib",
    "peak_memory_mib",
    "loss",
    "active_features",
    "token_accuracy",
    "chunk_f1",
]


# counts and their least values (max_iterations may also be null: CRFsuite's own stopping rule)
COUNTS = {"repetitions": 1, "tag_repeats": 1, "max_iterations": 1, "period": 1, "num_memories": 1}
COUNTS |= {"growth.iterations": 1, "growth.repetitions": 1, "per_call.sgd_epochs": 1, "per_call.serve_timeout": 1}
COUNTS |= {f"per_call.{key}": 1 for key in ("train_sentences", "iterations", "long_sentences", "long_iterations")}
COUNTS |= {"per_call.served_requests": 1, "per_call.served_warmup": 0}
# numbers: (whether a value is one, what it must be); both sides' trainers get them
NUMBERS = {"train_fraction": (lambda v: 0 < v <= 1, "a number in (0, 1]")}
NUMBERS |= dict.fromkeys(("c1", "c2", "epsilon", "delta"), (lambda v: 0 <= v < float("inf"), "a finite number >= 0"))
NUMBERS["per_call.candidate_threshold"] = (lambda v: 0 < v < 1, "a number in (0, 1)")
# the benchmark's true-or-false settings
SWITCHES = ("quick", "growth_enabled", "all_possible_transitions", "boundary_transitions", "per_call.enabled", "per_call.served")


def run_worker(spec: dict) -> dict:
    """Run one measurement in a fresh process and return its figures."""
    with tempfile.TemporaryDirectory() as folder:
        spec_path, out_path = Path(folder) / "spec.json", Path(folder) / "out.json"
        spec_path.write_text(json.dumps(spec))
        done = subprocess.run(
            [sys.executable, "-m", "pipeline.apps.bench_worker", str(spec_path), str(out_path)], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"benchmark worker ({spec['tool']}) failed:\n{done.stderr[-4000:]}")
        return json.loads(out_path.read_text())


def check_settings(cfg: DictConfig) -> None:
    """Refuse (ValueError, one line naming the setting) what the benchmark could not run or would
    misreport: an unknown tool, input or feature set, a count below 1, a number out of its range, a
    switch that is not true or false."""
    b = OmegaConf.to_container(cfg.benchmark, resolve=True)
    tools = b.get("tools")
    if not isinstance(tools, list) or not tools or len(set(map(str, tools))) != len(tools) or set(tools) - set(TOOLS):
        raise ValueError(f"benchmark.tools={tools!r}: different tools of {', '.join(TOOLS)}")
    if b["input"] not in INPUTS:
        raise ValueError(f"benchmark.input={b['input']!r}: one of {', '.join(INPUTS)}")
    problem = non_switch(cfg, [f"benchmark.{key}" for key in SWITCHES]) or non_whole_number(
        cfg, {f"benchmark.{key}": least for key, least in COUNTS.items()}
    )  # "no" would read as true; 0 repetitions would report nothing
    if problem:
        raise ValueError(problem)
    if b.get("feature_set") not in ("sparse", "dense"):
        raise ValueError(f"benchmark.feature_set={b.get('feature_set')!r}: sparse or dense")
    for key, (fits, what) in NUMBERS.items():
        value = OmegaConf.select(cfg, f"benchmark.{key}", default=None)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not fits(value):
            raise ValueError(f"benchmark.{key}={value!r}: {what}")
    missing = [key for key in COUNTS if key != "max_iterations" and OmegaConf.select(cfg, f"benchmark.{key}") is None]
    if missing:  # removed with ~ (or set to null)
        raise ValueError(f"benchmark.{missing[0]}: missing; a whole number >= {COUNTS[missing[0]]}")
    if b["growth_enabled"]:
        _check_growth(b["growth"], cfg.data.root)


def _config_file(group: str, name: object) -> Path | None:
    """``conf/<group>/<name>.yaml`` when ``name`` is a plain config name and the file exists."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    path = CONF_DIR / group / f"{name}.yaml"
    return path if path.is_file() else None


def _check_growth(g: dict, root: str) -> None:
    """The cost-growth points: lists of fractions in (0, 1] (1.5 would train on the whole set under
    its own name) and of repeats of at least 1; label sets that name dataset configs whose files
    are under the data root and whose joint labels are their columns, and
    label features that name a features config."""
    for key, fits, what in (
        ("fractions", lambda f: isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= 1, "numbers in (0, 1]"),
        ("repeats", lambda k: isinstance(k, int) and not isinstance(k, bool) and k >= 1, "whole numbers >= 1"),
    ):
        values = g.get(key)
        if not isinstance(values, list) or not all(fits(v) for v in values):
            raise ValueError(f"benchmark.growth.{key}={values!r}: a list of {what}")
    if g.get("label_sets") and _config_file("features", g.get("label_features")) is None:
        raise ValueError(f"benchmark.growth.label_features={g.get('label_features')!r}: no such features config")
    for entry in g.get("label_sets") or []:
        name = entry if isinstance(entry, str) else entry.get("dataset") if isinstance(entry, dict) else None
        path = _config_file("dataset", name)
        if path is None:
            raise ValueError(f"benchmark.growth.label_sets: {entry!r} names no dataset config")
        dataset = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        joint = list(entry.get("joint_label") or []) if isinstance(entry, dict) else []
        if set(joint) - set(dataset.get("columns") or []):
            raise ValueError(f"benchmark.growth.label_sets: {entry!r}: joint_label names columns {name} lacks")
        for spec in dataset_files(dataset).values():
            if not (Path(str(root)) / spec["path"]).is_file():  # the workers read the data root; they download nothing
                raise ValueError(
                    f"benchmark.growth.label_sets: {name}'s file {Path(str(root)) / spec['path']} is missing "
                    "(set benchmark.growth.label_sets=[] to leave label sets out)"
                )
        problem = checksum_problem(dataset, root)  # a file that fails its checksum would fail in a worker
        if problem:
            raise ValueError(f"benchmark.growth.label_sets: {name}: {problem}")


def _settings(cfg: DictConfig) -> dict:
    check_settings(cfg)
    b = OmegaConf.to_container(cfg.benchmark, resolve=True)
    if b["quick"]:
        b.update(repetitions=1, train_fraction=0.1, max_iterations=10, tag_repeats=1)
        b["growth"].update(iterations=5, repetitions=1, fractions=[0.05, 0.1], repeats=[2])
        b["per_call"].update(
            train_sentences=200,
            iterations=5,
            long_sentences=20,
            long_iterations=3,
            sgd_epochs=1,
            served_requests=50,
            served_warmup=5,
        )
    return b


def _spec(cfg: DictConfig, b: dict, tool: str, dataset: dict | None = None, features: dict | None = None, **overrides) -> dict:
    spec = {
        "tool": tool,
        "dataset": dataset or OmegaConf.to_container(cfg.dataset, resolve=True),
        "features": features or OmegaConf.to_container(cfg.features, resolve=True),
        "data_root": str(Path(cfg.data.root).absolute()),
        "train_fraction": b["train_fraction"],
        "seed": 0,
        "c1": b["c1"],
        "c2": b["c2"],
        "max_iterations": b["max_iterations"],
        "epsilon": b["epsilon"],
        "period": b["period"],
        "delta": b["delta"],
        "num_memories": b["num_memories"],
        "feature_set": b["feature_set"],
        "all_possible_transitions": b["all_possible_transitions"],
        "boundary_transitions": b["boundary_transitions"],
        "tag_repeats": b["tag_repeats"],
        "input": b["input"],
    }
    spec.update(overrides)
    return spec


def _per_call_spec(cfg: DictConfig, b: dict) -> dict:
    return {
        **b["per_call"],
        "dataset": OmegaConf.to_container(cfg.dataset, resolve=True),
        "features": OmegaConf.to_container(cfg.features, resolve=True),
        "data_root": str(Path(cfg.data.root).absolute()),
        "repetitions": b["repetitions"] if not b["quick"] else 1,
    }


def per_call_metrics(per_call: pd.DataFrame) -> dict[str, float]:
    """MLflow metrics ``per_call.<row>.<crfsuite|ours|ratio>`` of the per-call table."""
    metrics = {}
    for _, r in per_call.iterrows():
        slug = re.sub(r"[^0-9A-Za-z_.-]+", "_", str(r["path"])).strip("_")
        for column in ("crfsuite", "ours", "ratio"):
            if pd.notna(r[column]):
                metrics[f"per_call.{slug}.{column}"] = float(r[column])
    return metrics


def side_by_side(runs: pd.DataFrame, tools: list[str]) -> pd.DataFrame:
    """Median of every figure per tool, and the median over repetitions of ours/reference."""
    table = pd.DataFrame({tool: runs[runs.tool == tool][FIGURES].median(numeric_only=True) for tool in tools})
    if len(tools) == 2:
        ours, reference = (runs[runs.tool == t].reset_index(drop=True) for t in tools)
        ratios = (ours[FIGURES].apply(pd.to_numeric) / reference[FIGURES].apply(pd.to_numeric)).median()
        table["ratio"] = ratios
    return table


def growth_cases(b: dict) -> list[dict]:
    """The cost-growth points: ``case`` (fraction, repeat, labels), shown ``value`` and worker overrides."""
    g = b["growth"]
    whole = b["train_fraction"] if b["quick"] else 1.0
    largest = max(g["fractions"], default=whole)  # what is repeated
    cases = [{"case": "fraction", "value": str(f), "train_fraction": f} for f in g["fractions"]]
    cases += [
        {"case": "repeat", "value": f"{k}x{largest}", "train_fraction": largest, "train_repeat": int(k)}
        for k in g.get("repeats") or []
    ]
    for entry in g.get("label_sets") or []:
        entry = {"dataset": entry} if isinstance(entry, str) else dict(entry)
        dataset = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "dataset" / f"{entry['dataset']}.yaml"), resolve=True)
        features = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "features" / f"{g['label_features']}.yaml"), resolve=True)
        cases.append(
            {
                "case": "labels",
                "value": entry.get("name", entry["dataset"]),
                "train_fraction": whole,
                "dataset": dataset,
                "features": features,
                "joint_label": list(entry.get("joint_label") or []),
            }
        )
    return cases


def cost_growth(cfg: DictConfig, b: dict, tools: list[str]) -> pd.DataFrame:
    """Median seconds per iteration (fixed iteration count) and peak memory per growth point."""
    g = b["growth"]
    rows = []
    cases = growth_cases(b)
    for rep in range(g["repetitions"]):
        for case in cases:
            order = tools if rep % 2 == 0 else tools[::-1]
            for tool in order:
                overrides = {k: v for k, v in case.items() if k not in ("case", "value", "dataset", "features")}
                spec = _spec(
                    cfg,
                    b,
                    tool,
                    case.get("dataset"),
                    case.get("features"),
                    max_iterations=g["iterations"],
                    delta=0.0,
                    epsilon=0.0,
                    tag_repeats=1,
                    input="batch",
                    **overrides,
                )
                result = run_worker(spec)
                log.info(
                    "[growth rep %d] %s %s %s: %d tokens, %d labels, %.3f s/it, peak %.0f MiB",
                    rep,
                    case["case"],
                    case["value"],
                    tool,
                    result["train_tokens"],
                    result["labels"],
                    result["iteration_seconds"],
                    result["peak_memory_mib"],
                )
                rows.append(
                    {
                        "case": case["case"],
                        "value": case["value"],
                        "tool": tool,
                        "repetition": rep,
                        "train_tokens": result["train_tokens"],
                        "labels": result["labels"],
                        "iterations": result["iterations"],
                        "iteration_seconds": result["iteration_seconds"],
                        "peak_memory_mib": result["peak_memory_mib"],
                    }
                )
    raw = pd.DataFrame(rows)
    return (
        raw.groupby(["case", "value", "tool"], sort=False)
        .agg(
            train_tokens=("train_tokens", "first"),
            labels=("labels", "first"),
            iteration_seconds=("iteration_seconds", "median"),
            peak_memory_mib=("peak_memory_mib", "median"),
            runs=("repetition", "count"),
        )
        .reset_index()
    )


def growth_wide(growth: pd.DataFrame, tools: list[str]) -> pd.DataFrame:
    """One row per growth point, seconds per iteration and peak MiB of each tool side by side."""
    wide = growth.pivot_table(
        index=["case", "value", "train_tokens", "labels"],
        columns="tool",
        values=["iteration_seconds", "peak_memory_mib"],
        sort=False,
    )
    wide.columns = [f"{tool} {'s/iteration' if figure == 'iteration_seconds' else 'peak MiB'}" for figure, tool in wide.columns]
    order = [f"{t} s/iteration" for t in tools] + [f"{t} peak MiB" for t in tools]
    return wide[[c for c in order if c in wide.columns]].reset_index()


def figure_table(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (figures by tool, ratio) as text cells, each figure at its own precision."""

    def cell(figure: str, value) -> str:
        if pd.isna(value):
            return ""
        value = float(value)
        if figure in ("features", "iterations", "tag_tokens_per_second", "tag_tokens_per_cpu_second", "active_features"):
            return f"{value:,.0f}"
        if figure.endswith("_mib"):
            return f"{value:,.0f}"
        if figure in ("token_accuracy", "chunk_f1"):
            return f"{value:.2f}"
        if figure == "loss":
            return f"{value:,.1f}"
        return f"{value:.3g}"

    shown = pd.DataFrame(index=table.index)
    for column in table.columns:
        shown[column] = [
            (f"{float(v):.4f}" if f in ("loss", "active_features") else f"{float(v):.2f}")
            if column == "ratio" and pd.notna(v)
            else cell(f, v)
            if column != "ratio"
            else ""
            for f, v in table[column].items()
        ]
    return shown.reset_index(names="figure")


def field_table(runs: pd.DataFrame, tools: list[str]) -> pd.DataFrame | None:
    """Median F1 per chunk type / field of each tool (None without chunk scores)."""
    if "field_f1" not in runs or runs["field_f1"].isna().all():
        return None
    per_tool = {}
    for tool in tools:
        scores = pd.DataFrame([s for s in runs[runs.tool == tool]["field_f1"] if isinstance(s, dict)])
        per_tool[tool] = scores.median()
    table = pd.DataFrame(per_tool)
    table.index.name = "field"
    return table.reset_index()


def plot(table: pd.DataFrame, growth: pd.DataFrame | None, path: Path, title: str) -> None:
    panels = 2 if growth is not None and not growth.empty else 1
    fig, axes = figure(6 * panels, 4.2, panels)
    ax = axes[0]
    if "ratio" in table and not table.empty:
        shown = ["train_seconds", "seconds_per_iteration", "tag_tokens_per_second", "peak_memory_mib", "feature_seconds"]
        values = table.loc[shown, "ratio"].astype(float)
        ax.barh(
            shown,
            values,
            color=["tab:blue" if (v <= 1) != (n == "tag_tokens_per_second") else "tab:red" for n, v in values.items()],
        )
        ax.axvline(1.0, color="black", lw=1)
        ax.set_xlabel("ours / CRFsuite (median of paired runs)")
        for y, v in enumerate(values):
            ax.text(v, y, f" {v:.2f}", va="center")
    ax.set_title(title)
    if panels == 2:
        ax = axes[1]
        for tool, part in growth.groupby("tool"):
            fractions = part[part.case.isin(["fraction", "repeat"])].sort_values("train_tokens")
            ax.plot(fractions.train_tokens, fractions.iteration_seconds, marker="o", label=f"{tool} (data size)")
        ax.set_xlabel("training tokens")
        ax.set_ylabel("seconds per iteration")
        ax.set_title("cost growth with data")
        ax.legend()
    save_figure(fig, path)


def main(cfg: DictConfig) -> None:
    import mlflow

    b = _settings(cfg)
    tools = list(b["tools"])
    tracking.setup(cfg)
    out = tracking.output_root(cfg) / "benchmark" / f"{cfg.dataset.name}-{b['input']}"
    out.mkdir(parents=True, exist_ok=True)
    tags = {
        "stage": "benchmark",
        "dataset": cfg.dataset.name,
        "input": b["input"],
        "quick": str(b["quick"]),
        **tracking.source_tags(),
    }
    with mlflow.start_run(run_name=f"benchmark-{cfg.dataset.name}-{b['input']}", tags=tags):
        tracking.log_params(tracking.flatten(OmegaConf.to_container(cfg, resolve=True)))
        rows = []
        for rep in range(b["repetitions"]):
            for tool in tools if rep % 2 == 0 else tools[::-1]:
                result = run_worker(_spec(cfg, b, tool))
                result["repetition"] = rep
                rows.append(result)
                log.info(
                    "[rep %d] %s: train %.1fs, %d it, %.3f s/it, tag %s tok/s, peak %.0f MiB, acc %.2f%s",
                    rep,
                    tool,
                    result["train_seconds"],
                    result["iterations"],
                    result["seconds_per_iteration"],
                    f"{result['tag_tokens_per_second']:,.0f}",
                    result["peak_memory_mib"],
                    result["token_accuracy"],
                    f", F1 {result['chunk_f1']:.2f}" if result["chunk_f1"] is not None else "",
                )
        g = b["growth"]
        text, names = "", []
        if rows:  # written before the growth part, so they survive its interruption
            runs = pd.DataFrame(rows)
            table = side_by_side(runs, tools)
            fields = field_table(runs, tools)
            runs.to_csv(out / "runs.csv", index=False)
            table.to_csv(out / "results.csv")
            names += ["runs.csv", "results.csv"]
            text = f"## {cfg.dataset.name}, input {b['input']}: medians of {b['repetitions']} runs\n\n" + markdown_table(
                figure_table(table)
            )
            if fields is not None:
                fields.to_csv(out / "fields.csv", index=False)
                names.append("fields.csv")
                text += "\n\n## F1 per field (median)\n\n" + markdown_table(fields)
            (out / "results.md").write_text(text + "\n")
            metrics = {}
            for tool in table.columns:
                for figure, value in table[tool].items():
                    if pd.notna(value):
                        metrics[f"{tool}.{figure}"] = float(value)
            mlflow.log_metrics(metrics)
            log.info("\n%s", text)
        else:
            table = pd.DataFrame()
        wanted = b["growth_enabled"] and (g["fractions"] or g.get("repeats") or g.get("label_sets"))
        growth = cost_growth(cfg, b, tools) if wanted else None
        if growth is not None:
            growth.to_csv(out / "growth.csv", index=False)
            names.append("growth.csv")
            part = (
                f"## cost growth: median CPU seconds per iteration ({g['iterations']} iterations)"
                f" and peak MiB, medians of {g['repetitions']}\n\n" + markdown_table(growth_wide(growth, tools))
            )
            log.info("\n%s", part)
            text = f"{text}\n\n{part}" if text else part
        if b["per_call"]["enabled"]:
            per_call = per_call_table(_per_call_spec(cfg, b))
            per_call.to_csv(out / "per_call.csv", index=False)
            names.append("per_call.csv")
            part = (
                f"## per call (same CRFsuite model file on both sides; medians of {b['repetitions']} alternating runs)\n\n"
                + markdown_table(per_call)
            )
            log.info("\n%s", part)
            text = f"{text}\n\n{part}" if text else part
            mlflow.log_metrics(per_call_metrics(per_call))
        (out / "results.md").write_text(text + "\n")
        names.append("results.md")
        plot(table, growth, out / "benchmark.png", f"{cfg.dataset.name}: ours vs CRFsuite")
        names.append("benchmark.png")
        for name in names:
            mlflow.log_artifact(str(out / name))
