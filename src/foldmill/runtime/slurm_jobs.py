"""Where each Slurm job runs: partition, account, QoS, node features and further sbatch options.

They come from the workflow config (`slurm:`), one place for every job: `slurm.<key>` for all
jobs, `slurm.<class>.<key>` for one class of job (fold, msa, templates, pretrain). The rules give
them to Snakemake as resources, which the Slurm plugin turns into sbatch options. Being rule
resources, a command line `--set-resources fold:qos=high` changes that one value and keeps the rest
(a profile's `set-resources` would be replaced whole by the command line's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

JOB_CLASSES = ("fold", "msa", "templates", "pretrain")
# config key -> the Snakemake resource the Slurm plugin reads (sbatch --partition, --account, --qos,
# --constraint, free-form options)
RESOURCE_NAMES = {
    "partition": "slurm_partition",
    "account": "slurm_account",
    "qos": "qos",
    "constraint": "constraint",
    "extra": "slurm_extra",
}


def slurm_job_resources(slurm: Mapping[str, Any], job_class: str | None = None, gpus: int = 0) -> dict[str, str]:
    """Resources of one class of job (None: every other job) from a resolved config's `slurm`
    section. Settings left "" are left out, so sbatch gets no empty option and the cluster's
    defaults apply. `slurm.gpu_model` applies to fold jobs asking `gpus` GPUs through --gpus
    (one node; a multi-node job asks per node through --gres, where a constraint picks the type)."""
    if job_class is not None and job_class not in JOB_CLASSES:
        raise ValueError(f"unknown Slurm job class {job_class!r} (known: {', '.join(JOB_CLASSES)})")
    own = slurm.get(job_class, {}) if job_class else {}
    resources = {}
    for key, resource in RESOURCE_NAMES.items():
        value = str(own.get(key) or slurm.get(key) or "").strip()
        if value:
            resources[resource] = value
    if job_class == "fold" and gpus > 0 and slurm.get("gpu_model"):
        resources["gpu_model"] = str(slurm["gpu_model"])
    return resources
