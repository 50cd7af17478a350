"""Rule `moe_prepare_corpus`: thin wrapper over foldmill.moe.data.corpus."""

from pathlib import Path

from foldmill.moe.data.corpus import prepare_corpus
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    params = snakemake.params
    prepare_corpus(list(snakemake.input), Path(snakemake.output.meta).parent, params.alphabet, params.val_fraction,
                   params.shard_tokens)


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
