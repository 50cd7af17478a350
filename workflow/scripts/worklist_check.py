"""Rule `check_worklist`: stop the run before staging when no target is left (foldmill.io.worklist)."""

from foldmill.io.atomic import write_text_atomic
from foldmill.io.worklist import require_targets
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    count = require_targets(snakemake.input.worklist, snakemake.input.rejects)
    write_text_atomic(snakemake.output[0], f"{count} target(s) to fold\n")


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
