# Shards: the worklist split by token budget; each shard is one GPU `fold` job
# (src/foldmill/runtime/sharding.py). The shard_* names below size a shard's job; rule fold uses
#     resources: gpu=shard_gpu, gres=shard_gres, nodes=shard_nodes, mem_mb=shard_mem_mb, runtime=shard_runtime
# One node: `gpu` GPUs (sbatch --gpus). Several nodes: `gres` gpu:N per node instead, since --gpus
# counts GPUs across the whole job. Memory and runtime follow the shard's tokens and grow with
# the attempt, so a job that ran out of either is retried with more (runtime/retry.py: not after
# an error that more memory cannot fix), up to slurm.max_mem_mb.
from foldmill.runtime import retry
from foldmill.runtime.sharding import JobSizing, shard_job_resources

SLURM = config["slurm"]
SHARD_DIR = OUTDIR / "shards"
JOB_SIZING = JobSizing.from_config(SLURM)
shard_nodes = SLURM["nodes_per_fold_job"]
shard_gpu = SLURM["gpus_per_node"] if shard_nodes == 1 else 0
shard_gres = f"gpu:{SLURM['gpus_per_node']}" if shard_nodes > 1 and SLURM["gpus_per_node"] else ""


_shards_written = []


def shard_dir():
    """The folder the `shards` checkpoint wrote; raises Snakemake's IncompleteCheckpointException
    (the caller then waits for the checkpoint) until it has run. Once it has, the folder is
    final for the rest of this Snakemake process, so checkpoints.shards.get(), which expands
    the checkpoint's output anew on each call, is asked once instead of three times per fold job."""
    if not _shards_written:
        _shards_written.append(Path(checkpoints.shards.get().output[0]))
    return _shards_written[0]


def shard_ids(wildcards):
    """Ids of the shards the `shards` checkpoint wrote (re-evaluated once it has run)."""
    return sorted(p.stem for p in shard_dir().glob("shard_*.tsv"))


def _shard_job(wildcards, attempt):
    growth = retry.growth(LOGDIR / f"fold/{wildcards.shard}.log", attempt)
    return shard_job_resources(shard_dir(), JOB_SIZING, shard_nodes * SLURM["gpus_per_node"], growth)[wildcards.shard]


def grown(base, log, cap=SLURM["max_mem_mb"]):
    """A resource function: `base` times the retry growth of the job logging to `log`, at most `cap` (0 = none)."""

    def resource(wildcards, attempt):
        value = base * retry.growth(log, attempt)
        return min(value, cap) if cap else value

    return resource


def staging_mem_mb(largest, log):
    """Memory of a batched MMseqs2 search: twice its database and queries (4 GB to `largest`), grown on retry."""

    def resource(wildcards, input, attempt):
        value = min(largest, max(4000, 2 * input.size_mb)) * retry.growth(log, attempt)
        return min(value, SLURM["max_mem_mb"]) if SLURM["max_mem_mb"] else value

    return resource


def shard_mem_mb(wildcards, attempt):
    """Memory per node (Slurm's --mem): the whole job's estimate spread over its nodes."""
    return -(-_shard_job(wildcards, attempt).mem_mb // shard_nodes)


def shard_runtime(wildcards, attempt):
    return _shard_job(wildcards, attempt).runtime_minutes


checkpoint shards:
    input:
        worklist=rules.worklist.output.tsv,
        model_check=ancient(MODEL_CHECK),
        checked=rules.check_worklist.output[0],
    output:
        directory(SHARD_DIR),
    params:
        tokens_per_shard=config["sharding"]["tokens_per_shard"],
        max_shards=config["sharding"]["max_shards"],
    resources:
        # The whole worklist is read at once; a retry gets more memory and time.
        attempt=lambda wildcards, attempt: attempt,
        mem_mb=grown(2000, LOGDIR / "shards.log"),
        runtime=grown(15, LOGDIR / "shards.log", cap=0),
        **slurm_resources(),
    log:
        LOGDIR / "shards.log",
    conda:
        env_path("foldmill.yaml")
    script:
        script_path("shards.py")
