"""report.html: the run on one self-contained page (figures embedded), from the filter result.

It states the model (and warns when it is the demo's random weights), the target counts by status,
the thresholds with how many targets fail each, the report's figures with their captions, and the
per-target table. Nothing is fetched when it is opened: it can be mailed or copied anywhere.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from foldmill import __version__
from foldmill.io.atomic import owned_files
from foldmill.outputs import plots
from foldmill.outputs.filters import CRITERIA, STATUS_FILTER, TARGET_TYPES, FilterConfig, failure_counts
from foldmill.outputs.modelcif import DEMO_MODEL, model_label

COMMAND = "report"  # the owner named in the ledger beside report.html
STATUS_ORDER = ("ok", "failed", "rejected", "skipped", "missing")
STYLE = (
    "body{font:14px sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
    "table.thresholds{border-collapse:collapse}"
    "table.thresholds td,table.thresholds th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
    "figure{margin:1.5em 0}figcaption{color:#444}.warning{color:#a00;font-weight:bold}" + plots.TABLE_STYLE
)


def report_html(result: pd.DataFrame, filters: FilterConfig) -> str:
    """The whole page as one string."""
    passed = int(result["passed"].sum())
    statuses = result["status"].value_counts().to_dict()
    counted = [status for status in STATUS_ORDER if status in statuses] + sorted(set(statuses) - set(STATUS_ORDER))
    models = sorted(set(result["model"]) - {""})
    parts = [
        "<h1>foldmill run report</h1>",
        f"<p>foldmill {html.escape(__version__)}: {passed} of {len(result)} targets passed the confidence filters."
        f" Targets by status: {html.escape(', '.join(f'{statuses[s]} {s}' for s in counted) or 'none')}.</p>",
        *(_model_line(model) for model in models),
        "<h2>Thresholds</h2>",
        _thresholds_table(result, filters),
        "<h2>Figures</h2>",
        *(_figure(name, plot, arguments) for name, (plot, arguments) in plots.report_plots(result, filters).items()),
        "<h2>Targets</h2>",
        plots.target_table_html(result),
    ]
    body = "\n".join(parts)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>foldmill run report</title>"
        f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n"
    )


def _model_line(model: str) -> str:
    label = html.escape(model_label({"model": model}))
    return f"<p class='warning'>Model: {label}</p>" if model == DEMO_MODEL else f"<p>Model: {label}</p>"


def _thresholds_table(result: pd.DataFrame, filters: FilterConfig) -> str:
    counts = failure_counts(result)
    header = "".join(f"<th>{t}</th>" for t in TARGET_TYPES)
    rows = [f"<tr><th>threshold</th>{header}<th>targets failing it</th></tr>"]
    for criterion in CRITERIA:
        values = [asdict(filters.for_type(t))[criterion.name] for t in TARGET_TYPES]
        cells = "".join(f"<td>{'-' if value is None else f'{value:g}'}</td>" for value in values)
        name = f"{criterion.name} ({html.escape(criterion.label)})"
        rows.append(f"<tr><th>{name}</th>{cells}<td>{counts[criterion.name]}</td></tr>")
    return (
        "<table class='thresholds'>" + "".join(rows) + "</table>"
        f"<p>{counts[STATUS_FILTER]} target(s) did not fold (status failed, rejected or missing). "
        "- means the threshold is not applied; pLDDT is on the 0-100 scale.</p>"
    )


def _figure(name: str, plot, arguments: tuple) -> str:
    buffer = io.BytesIO()
    plot(*arguments, buffer)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    caption = html.escape((plot.__doc__ or name).strip().splitlines()[0])
    return (
        f"<figure id='{name}'><img alt='{html.escape(name)}' src='data:image/png;base64,{data}'>"
        f"<figcaption>{caption}</figcaption></figure>"
    )


def write_report(result: pd.DataFrame, filters: FilterConfig, path: str | Path, exclusive: bool = True) -> None:
    """report.html, replacing only an earlier report; exclusive: its directory holds nothing else."""
    text = report_html(result, filters)
    with owned_files([path], COMMAND, exclusive) as (temporary,):
        temporary.write_text(text, encoding="utf-8")
