"""Rule `moe_pretrain`: train (resuming from the run's checkpoints) in-process, under torchrun, or
across the nodes of the Slurm job (srun + torchrun)."""

from pathlib import Path

import torch

from foldmill.moe.config import TrainConfig
from foldmill.moe.train.launch import launch_pretrain
from foldmill.runtime.rulescript import run_rule


def main(snakemake) -> None:
    torch.set_num_threads(snakemake.threads)
    config = TrainConfig(**snakemake.params.train)
    corpus_dir = Path(snakemake.input.meta).parent
    launch_pretrain(corpus_dir, snakemake.params.run_dir, config, processes=snakemake.params.gpus,
                    nodes=snakemake.params.nodes)


run_rule(snakemake, main)  # noqa: F821 - injected by Snakemake
