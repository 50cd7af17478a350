"""Rule `report_figures`: the report's figures and per-target table (foldmill.outputs.plots)."""

from foldmill.outputs import plots
from foldmill.outputs.filters import FilterConfig, read_filter_result
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    result = read_filter_result(snakemake.input.passed, snakemake.input.failed)
    filters = FilterConfig.from_config(snakemake.params.filters)
    plots.plot_plddt_distribution(result, filters, snakemake.output.plddt)
    plots.plot_ptm_iptm(result, filters, snakemake.output.ptm_iptm)
    plots.plot_filter_counts(result, snakemake.output.filters)
    plots.plot_throughput(result, snakemake.output.throughput)
    plots.write_target_table(result, snakemake.output.targets)


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
