"""Rule `moe_evaluate`: validation loss and perplexity of the final pretraining checkpoint."""

import json
from pathlib import Path

from foldmill.io.atomic import write_text_atomic
from foldmill.moe.train.evaluate import evaluate_checkpoint
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    summary = json.loads(Path(snakemake.input.summary).read_text(encoding="utf-8"))
    result = evaluate_checkpoint(Path(snakemake.input.meta).parent, summary["checkpoint"], snakemake.params.batch_size,
                                 snakemake.params.max_batches)
    write_text_atomic(snakemake.output[0], json.dumps(result, indent=2) + "\n")


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
