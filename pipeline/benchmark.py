"""Speed benchmark against CRFsuite: ``python -m pipeline.benchmark`` (config ``conf/benchmark.yaml``).

For each repetition the two tools run one after the other, in alternating order, each in a fresh
process (``pipeline.bench_worker``) on identical data, attributes, c1/c2 and stopping rule. The
medians of every figure and the ratios ours/CRFsuite (median of the per-repetition ratios) are
logged to the console and to MLflow with a results table (CSV, Markdown), the raw runs and a plot.
A second part measures cost growth: the median time of one iteration (each tool's own iteration
log, set-up excluded) over a fixed number of iterations for
25/50/100% of the training data, and for EWT UPOS (17 labels) versus XPOS (about 50 labels).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import hydra
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from pipeline import tracking
from pipeline.report import figure, markdown_table, save_figure

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
FIGURES = [
    "feature_seconds",
    "train_seconds",
    "iterations",
    "seconds_per_iteration",
    "iteration_seconds",
    "features",
    "tag_tokens_per_second",
    "peak_memory_mib",
    "token_accuracy",
    "chunk_f1",
]


def run_worker(spec: dict) -> dict:
    """Run one measurement in a fresh process and return its figures."""
    with tempfile.TemporaryDirectory() as folder:
        spec_path, out_path = Path(folder) / "spec.json", Path(folder) / "out.json"
        spec_path.write_text(json.dumps(spec))
        done = subprocess.run(
            [sys.executable, "-m", "pipeline.bench_worker", str(spec_path), str(out_path)], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"benchmark worker ({spec['tool']}) failed:\n{done.stderr[-4000:]}")
        return json.loads(out_path.read_text())


def _settings(cfg: DictConfig) -> dict:
    b = OmegaConf.to_container(cfg.benchmark, resolve=True)
    if b["quick"]:
        b.update(repetitions=1, train_fraction=0.1, max_iterations=10, tag_repeats=1)
        b["growth"].update(iterations=5, repetitions=1, fractions=[0.5, 1.0])
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
        "tag_repeats": b["tag_repeats"],
    }
    spec.update(overrides)
    return spec


def side_by_side(runs: pd.DataFrame, tools: list[str]) -> pd.DataFrame:
    """Median of every figure per tool, and the median over repetitions of ours/reference."""
    table = pd.DataFrame({tool: runs[runs.tool == tool][FIGURES].median(numeric_only=True) for tool in tools})
    if len(tools) == 2:
        ours, reference = (runs[runs.tool == t].reset_index(drop=True) for t in tools)
        ratios = (ours[FIGURES].apply(pd.to_numeric) / reference[FIGURES].apply(pd.to_numeric)).median()
        table["ratio"] = ratios
    return table


def cost_growth(cfg: DictConfig, b: dict, tools: list[str]) -> pd.DataFrame:
    """Seconds per iteration at a fixed iteration count, by data fraction and by label set."""
    g = b["growth"]
    rows = []
    cases = [("fraction", f, None, None) for f in g["fractions"]]
    for name in g.get("label_sets") or []:
        dataset = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "dataset" / f"{name}.yaml"), resolve=True)
        features = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "features" / f"{g['label_features']}.yaml"), resolve=True)
        cases.append(("labels", name, dataset, features))
    for rep in range(g["repetitions"]):
        for kind, value, dataset, features in cases:
            order = tools if rep % 2 == 0 else tools[::-1]
            for tool in order:
                fraction = value if kind == "fraction" else (b["train_fraction"] if b["quick"] else 1.0)
                spec = _spec(
                    cfg,
                    b,
                    tool,
                    dataset,
                    features,
                    train_fraction=fraction,
                    max_iterations=g["iterations"],
                    delta=0.0,
                    epsilon=0.0,
                    tag_repeats=1,
                )
                result = run_worker(spec)
                rows.append(
                    {
                        "case": kind,
                        "value": str(value),
                        "tool": tool,
                        "repetition": rep,
                        "train_tokens": result["train_tokens"],
                        "labels": result["labels"],
                        "iterations": result["iterations"],
                        "iteration_seconds": result["iteration_seconds"],
                    }
                )
    raw = pd.DataFrame(rows)
    return (
        raw.groupby(["case", "value", "tool"], sort=False)
        .agg(
            train_tokens=("train_tokens", "first"),
            labels=("labels", "first"),
            iteration_seconds=("iteration_seconds", "median"),
            runs=("repetition", "count"),
        )
        .reset_index()
    )


def plot(table: pd.DataFrame, growth: pd.DataFrame | None, path: Path, title: str) -> None:
    panels = 2 if growth is not None and not growth.empty else 1
    fig, axes = figure(6 * panels, 4.2, panels)
    ax = axes[0]
    if "ratio" in table:
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
            fractions = part[part.case == "fraction"]
            ax.plot(fractions.train_tokens, fractions.iteration_seconds, marker="o", label=f"{tool} (data size)")
        ax.set_xlabel("training tokens")
        ax.set_ylabel("seconds per iteration")
        ax.set_title("cost growth with data")
        ax.legend()
    save_figure(fig, path)


@hydra.main(version_base=None, config_path="../conf", config_name="benchmark")
def main(cfg: DictConfig) -> None:
    import mlflow

    b = _settings(cfg)
    tools = list(b["tools"])
    tracking.setup(cfg)
    out = tracking.output_root(cfg) / "benchmark" / cfg.dataset.name
    out.mkdir(parents=True, exist_ok=True)
    tags = {"stage": "benchmark", "dataset": cfg.dataset.name, "quick": str(b["quick"]), **tracking.source_tags()}
    with mlflow.start_run(run_name=f"benchmark-{cfg.dataset.name}", tags=tags):
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
        runs = pd.DataFrame(rows)
        table = side_by_side(runs, tools)
        growth = cost_growth(cfg, b, tools) if b["growth"]["fractions"] or b["growth"].get("label_sets") else None

        runs.to_csv(out / "runs.csv", index=False)
        table.to_csv(out / "results.csv")
        text = f"## {cfg.dataset.name}: medians of {b['repetitions']} runs\n\n" + markdown_table(
            table.reset_index(names="figure")
        )
        if growth is not None:
            growth.to_csv(out / "growth.csv", index=False)
            text += "\n\n## cost growth (median seconds per iteration, from each tool's iteration log)\n\n" + markdown_table(
                growth
            )
        (out / "results.md").write_text(text + "\n")
        plot(table, growth, out / "benchmark.png", f"{cfg.dataset.name}: ours vs CRFsuite")
        metrics = {}
        for tool in table.columns:
            for figure, value in table[tool].items():
                if pd.notna(value):
                    metrics[f"{tool}.{figure}"] = float(value)
        mlflow.log_metrics(metrics)
        for name in ("runs.csv", "results.csv", "results.md", "benchmark.png") + (("growth.csv",) if growth is not None else ()):
            mlflow.log_artifact(str(out / name))
        log.info("\n%s", text)


if __name__ == "__main__":
    main()
