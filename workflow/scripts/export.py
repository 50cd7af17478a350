"""Rule `export`: thin wrapper over foldmill.outputs.export."""

from pathlib import Path

from foldmill.outputs.export import ExportOptions, export_passing
from foldmill.outputs.filters import FilterConfig, read_filter_result
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    options = ExportOptions(
        top_k=snakemake.params.export["top_k"], include_arrays=snakemake.params.export["include_arrays"]
    )
    export_passing(
        read_filter_result(snakemake.input.passed, snakemake.input.failed),
        Path(snakemake.output.manifest).parent,
        FilterConfig.from_config(snakemake.params.filters),
        options,
    )


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
