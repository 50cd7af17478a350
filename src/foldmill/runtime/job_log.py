"""Where and how each target of a shard was folded: one line per target, for the cluster user.

After a fold job, `write_job_table` writes OUTDIR/logs/fold/<shard>.jobs.tsv beside the shard's
log, with the columns JOB_TABLE_COLUMNS, and logs the same as one line per target:
    target Q0001 shard shard_0000 job 4711 node gpu07 status ok seconds 81.2
The job id and node are those of the Slurm job that wrote the table (empty outside Slurm); a
target folded by an earlier, interrupted job of the same shard keeps its status and seconds.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import pandas as pd

from foldmill.io.atomic import atomic_path

JOB_TABLE_COLUMNS = ["target_id", "shard", "job_id", "node", "status", "seconds"]
log = logging.getLogger(__name__)


def write_job_table(
    fold_table: str | Path, shard: str, path: str | Path, environ: dict[str, str] | None = None
) -> None:
    """Write to `path` the per-target job table of one shard's fold table (see the module docstring)."""
    environ = dict(os.environ if environ is None else environ)
    folds = pd.read_csv(fold_table, sep="\t", dtype={"target_id": str}, keep_default_na=False)
    job_id = environ.get("SLURM_JOB_ID", "")
    node = environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    table = pd.DataFrame(
        {
            "target_id": folds["target_id"],
            "shard": shard,
            "job_id": job_id,
            "node": node,
            "status": folds["status"],
            "seconds": folds["seconds"].astype(float).round(1),
        },
        columns=JOB_TABLE_COLUMNS,
    )
    for row in table.itertuples(index=False):
        log.info("target %s shard %s job %s node %s status %s seconds %.1f", row.target_id, shard, job_id or "-",
                 node, row.status, row.seconds)  # fmt: skip
    with atomic_path(Path(path)) as tmp:
        table.to_csv(tmp, sep="\t", index=False)
