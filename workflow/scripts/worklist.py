"""Rule `worklist`: thin wrapper over foldmill.io.worklist."""

from pathlib import Path

from foldmill.io.worklist import build_worklist, write_worklist
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    result = build_worklist(list(snakemake.input), skip_bad=True, max_tokens=snakemake.params.max_tokens)
    if len(result.rejects) and not snakemake.params.skip_bad:
        first = result.rejects.iloc[0]
        raise SystemExit(f"{first['source']}: {first['record']}: {first['problem']}")
    write_worklist(result, Path(snakemake.output.tsv).parent, write_rejects=True)


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
