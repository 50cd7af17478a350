"""Rule `report`: OUTDIR/report.html (foldmill.outputs.report)."""

from foldmill.outputs.filters import FilterConfig, read_filter_result
from foldmill.outputs.report import write_report
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    result = read_filter_result(snakemake.input.passed, snakemake.input.failed)
    # report.html sits in the run's outdir beside the other rules' outputs.
    write_report(result, FilterConfig.from_config(snakemake.params.filters), snakemake.output[0], exclusive=False)


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
