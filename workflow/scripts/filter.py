"""Rule `filter`: thin wrapper over foldmill.outputs.filters."""

from foldmill.outputs.filters import FilterConfig, apply_filters, write_filter_tables
from foldmill.outputs.summary import read_summary
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    result = apply_filters(read_summary(snakemake.input[0]), FilterConfig.from_config(snakemake.params.filters))
    write_filter_tables(result, snakemake.output.passed, snakemake.output.failed)


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
