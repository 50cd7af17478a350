"""Figures and the per-target table of the run report, from the filter result.

Every plot function takes the filter result (the summary plus `passed`, `failed_filters`,
`reason`; see outputs.filters) and writes one PNG to a path or a binary file object; an empty
run gives a figure saying so. The first line of each docstring is its caption in report.html.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

import matplotlib

matplotlib.use("Agg")  # headless: rules run on cluster nodes without a display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from foldmill.io.atomic import owned_files  # noqa: E402
from foldmill.outputs.filters import CRITERIA, STATUS_FILTER, TARGET_TYPES, FilterConfig, failure_counts  # noqa: E402
from foldmill.provenance import DEMO_WARNING, is_demo_checkpoint  # noqa: E402

PNG = str | Path | BinaryIO

TYPE_COLOURS = {"monomer": "tab:blue", "complex": "tab:orange"}
PASS_COLOURS = {True: "tab:green", False: "tab:red"}


def plot_plddt_distribution(result: pd.DataFrame, filters: FilterConfig, path: PNG) -> None:
    """Histogram of complex pLDDT (0-100) per target type, with each type's min_plddt."""
    folded = result[result["status"] == "ok"]
    figure, axes = plt.subplots(figsize=(7, 4))
    bins = np.linspace(0, 100, 21)
    groups = [(t, 100 * folded.loc[folded["target_type"] == t, "complex_plddt"].dropna()) for t in TARGET_TYPES]
    groups = [(t, values) for t, values in groups if len(values)]
    if groups:
        axes.hist(
            [values for _, values in groups],
            bins=bins,
            stacked=True,
            color=[TYPE_COLOURS[t] for t, _ in groups],
            label=[f"{t} ({len(values)})" for t, values in groups],
        )
    for target_type, style in zip(TARGET_TYPES, ("--", ":")):
        threshold = filters.for_type(target_type).min_plddt
        if threshold is not None:
            axes.axvline(
                threshold,
                color=TYPE_COLOURS[target_type],
                linestyle=style,
                linewidth=2,
                label=f"{target_type} min_plddt {threshold:g}",
            )
    axes.set(
        xlabel="complex pLDDT (0-100)", ylabel="targets", xlim=(0, 100), title="pLDDT of the best model per target"
    )
    _finish(figure, axes, path, empty=folded.empty)


def plot_ptm_iptm(result: pd.DataFrame, filters: FilterConfig, path: PNG) -> None:
    """pTM vs ipTM of complexes coloured by filter decision; monomers (no ipTM) as ticks on the x axis."""
    folded = result[result["status"] == "ok"]
    figure, axes = plt.subplots(figsize=(6, 5))
    for passed in (True, False):
        subset = folded[folded["passed"] == passed]
        complexes = subset[subset["target_type"] == "complex"]
        monomers = subset[subset["target_type"] == "monomer"]
        word = "passed" if passed else "failed"
        if len(complexes):
            axes.scatter(
                complexes["ptm"],
                complexes["iptm"],
                color=PASS_COLOURS[passed],
                alpha=0.7,
                label=f"complex, {word} ({len(complexes)})",
            )
        if len(monomers):
            axes.scatter(
                monomers["ptm"],
                np.zeros(len(monomers)),
                marker="|",
                s=200,
                color=PASS_COLOURS[passed],
                label=f"monomer, {word} ({len(monomers)})",
            )
    complex_thresholds = filters.for_type("complex")
    if complex_thresholds.min_ptm is not None:
        axes.axvline(complex_thresholds.min_ptm, color="grey", linestyle="--", label="complex min_ptm")
    if complex_thresholds.min_iptm is not None:
        axes.axhline(complex_thresholds.min_iptm, color="grey", linestyle=":", label="complex min_iptm")
    axes.set(xlabel="pTM", ylabel="ipTM", xlim=(0, 1), ylim=(-0.03, 1), title="pTM vs ipTM (best model)")
    _finish(figure, axes, path, empty=folded.empty)


def plot_filter_counts(result: pd.DataFrame, path: PNG) -> None:
    """Targets passed and failed overall, and failing each filter (a target can fail several)."""
    counts = failure_counts(result)
    labels = {STATUS_FILTER: "did not fold", **{c.name: f"{c.label} ({c.name})" for c in CRITERIA}}
    names = ["passed", "failed", *(labels[name] for name in counts)]
    values = [int(result["passed"].sum()), int((~result["passed"]).sum()), *counts.values()]
    colours = [PASS_COLOURS[True], PASS_COLOURS[False]] + ["tab:gray"] * len(counts)
    figure, axes = plt.subplots(figsize=(7, 4))
    bars = axes.barh(names[::-1], values[::-1], color=colours[::-1])
    axes.bar_label(bars, padding=3)
    axes.set(xlabel="targets", title=f"Confidence filters: {values[0]} of {len(result)} targets passed")
    axes.set_xlim(0, max(values + [1]) * 1.15)
    _finish(figure, axes, path, empty=result.empty, legend=False)


def plot_throughput(result: pd.DataFrame, path: PNG) -> None:
    """Fold time vs tokens per target, coloured by replica; the title gives the run's rates."""
    timed = result[result["seconds"].notna() & result["status"].isin(["ok", "failed", "rejected"])]
    figure, axes = plt.subplots(figsize=(7, 4))
    for number, (replica, group) in enumerate(timed.groupby("replica", sort=True)):
        colour = f"C{number % 10}"
        ok = group["status"] == "ok"
        axes.scatter(
            group.loc[ok, "n_tokens"],
            group.loc[ok, "seconds"],
            color=colour,
            alpha=0.7,
            label=f"replica {replica or '?'}",
        )
        axes.scatter(group.loc[~ok, "n_tokens"], group.loc[~ok, "seconds"], color=colour, marker="x")
    seconds = float(timed["seconds"].sum())
    title = "Throughput"
    if seconds > 0:
        tokens = float(timed.loc[timed["status"] == "ok", "n_tokens"].sum())
        title += (
            f": {tokens / seconds:.1f} tokens/s, {3600 * len(timed) / seconds:.0f} targets/h (summed over replicas)"
        )
    axes.set(xlabel="tokens", ylabel="fold seconds", title=title)
    _finish(figure, axes, path, empty=timed.empty)


TABLE_COLUMNS = {
    "target_id": "target",
    "target_type": "type",
    "status": "status",
    "passed": "passed",
    "confidence_score": "confidence",
    "plddt": "pLDDT",
    "ptm": "pTM",
    "iptm": "ipTM",
    "min_chain_ptm": "min chain pTM",
    "interface_pae": "interface PAE",
    "n_chains": "chains",
    "n_tokens": "tokens",
    "seconds": "seconds",
    "shard": "shard",
    "job_id": "Slurm job",
    "node": "node",
    "reason": "reason",
    "warnings": "warnings",
}


TABLE_STYLE = (
    "table.targets{border-collapse:collapse;font:13px sans-serif}"
    "table.targets td,table.targets th{border:1px solid #ccc;padding:2px 6px}"
    "table.targets th{background:#eee}"
    "p.demo{background:#c00;color:#fff;padding:6px;font:bold 15px sans-serif}"
)


def target_table_html(result: pd.DataFrame) -> str:
    """An HTML table, one row per target: passing ones first, best confidence first."""
    table = result.assign(plddt=100 * result["complex_plddt"]).sort_values(
        ["passed", "confidence_score"], ascending=[False, False], na_position="last"
    )
    table = table[list(TABLE_COLUMNS)].rename(columns=TABLE_COLUMNS)
    return table.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.3f}", escape=True, classes="targets")


def demo_banner_html(result: pd.DataFrame) -> str:
    """A red warning line when any target was folded by the demo model, else nothing."""
    demo = int(result["model"].map(is_demo_checkpoint).sum()) if "model" in result else 0
    return f"<p class='demo'>WARNING: {demo} target(s) folded by the {DEMO_WARNING}.</p>" if demo else ""


def write_target_table(result: pd.DataFrame, path: str | Path) -> None:
    """A self-contained HTML page with the target table."""
    Path(path).write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Targets</title><style>{TABLE_STYLE}</style>"
        f"</head><body>{demo_banner_html(result)}"
        f"<p>{int(result['passed'].sum())} of {len(result)} targets passed.</p>"
        f"{target_table_html(result)}</body></html>\n",
        encoding="utf-8",
    )


def report_plots(result: pd.DataFrame, filters: FilterConfig) -> dict[str, tuple[Callable[..., None], tuple]]:
    """The report's figures by name: (plot function, its arguments before the output)."""
    return {
        "plddt": (plot_plddt_distribution, (result, filters)),
        "ptm_iptm": (plot_ptm_iptm, (result, filters)),
        "filters": (plot_filter_counts, (result,)),
        "throughput": (plot_throughput, (result,)),
    }


def write_report_figures(result: pd.DataFrame, filters: FilterConfig, paths: Mapping[str, str | Path]) -> None:
    """The figures (keys as in report_plots) and `targets` (the HTML table), into one report directory.

    Written all together; the directory must be new, empty or hold only an earlier report's files.
    """
    plots = report_plots(result, filters)
    names = [*plots, "targets"]
    with owned_files([paths[name] for name in names], "report") as temporaries:
        outputs = dict(zip(names, temporaries))
        for name, (plot, arguments) in plots.items():
            plot(*arguments, outputs[name])
        write_target_table(result, outputs["targets"])


def _finish(figure: plt.Figure, axes: plt.Axes, path: PNG, empty: bool, legend: bool = True) -> None:
    if empty:
        axes.text(0.5, 0.5, "no targets", ha="center", va="center", transform=axes.transAxes, fontsize=14)
    elif legend and axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize=8, loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=120, format="png")
    plt.close(figure)
