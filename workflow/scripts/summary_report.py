"""Rule `report_figures`: the report's figures and per-target table (foldmill.outputs.plots)."""

from foldmill.outputs import plots
from foldmill.outputs.filters import FilterConfig, read_filter_result
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    result = read_filter_result(snakemake.input.passed, snakemake.input.failed)
    filters = FilterConfig.from_config(snakemake.params.filters)
    paths = {name: snakemake.output[name] for name in ("plddt", "ptm_iptm", "filters", "throughput", "targets")}
    plots.write_report_figures(result, filters, paths)


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
