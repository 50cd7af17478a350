"""Rule `summary`: thin wrapper over foldmill.outputs.summary."""

from foldmill.outputs.summary import build_summary, write_summary
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    table = build_summary(list(snakemake.input.fold), snakemake.input.worklist)
    # The summary sits in the run's outdir beside the other rules' outputs.
    write_summary(table, snakemake.output.tsv, snakemake.output.parquet, exclusive=False)


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
