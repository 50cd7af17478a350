"""Rule `summary`: thin wrapper over foldmill.outputs.summary."""

import logging

from foldmill.outputs.summary import RunRecords, build_summary, summary_notes, write_summary
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    records = RunRecords(
        worklist_rejects=snakemake.input.worklist_rejects,
        msa_manifest=snakemake.input.msa_manifest,
        msa_rejects=snakemake.input.msa_rejects,
        template_rejects=snakemake.input.template_rejects,
        job_tables=list(snakemake.input.jobs),
    )
    table = build_summary(list(snakemake.input.fold), snakemake.input.worklist, records)
    # The summary sits in the run's outdir beside the other rules' outputs.
    write_summary(table, snakemake.output.tsv, snakemake.output.parquet, exclusive=False)
    counts, warnings = summary_notes(table)
    log = logging.getLogger("foldmill.summary")
    log.info("summary: %s", counts)
    for warning in warnings:
        log.warning("summary: %s", warning)


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
