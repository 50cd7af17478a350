# Fold: one job per shard. The Ray replica executor (src/foldmill/executor) folds the shard's
# targets on every GPU of the job (or CPU replicas with model.device cpu), writes
# OUTDIR/predictions/<target_id>/ per target and the shard's fold table. Reruns skip written targets.
from snakemake.exceptions import WorkflowError

# device auto is resolved inside the fold job, on the node that folds: ask for its GPUs.
FOLD_ON_GPU = config["model"]["device"] != "cpu"
# CPUs of a fold job's local Ray instance: executor.cpus, else every core Snakemake has. Cluster
# executors run without --cores: there the job's CPUs come from the cpus_per_gpu resource.
try:
    FOLD_THREADS = config["executor"]["cpus"] or max(1, int(workflow.cores))
except WorkflowError:
    FOLD_THREADS = 1


rule fold:
    input:
        # The shard's worklist rows, written by the `shards` checkpoint.
        shard=lambda wildcards: Path(checkpoints.shards.get().output[0]) / f"{wildcards.shard}.tsv",
        msa=OUTDIR / "staged/msa_manifest.tsv",
        templates=OUTDIR / "staged/templates_manifest.tsv",
    output:
        OUTDIR / "fold/{shard}.tsv",
    wildcard_constraints:
        shard=r"shard_\d+",
    params:
        outdir=OUTDIR,
        model=config["model"],
        executor=config["executor"],
        outputs=config["outputs"],
        ray_start_timeout_s=config["slurm"]["ray_start_timeout_s"],
    threads: FOLD_THREADS
    resources:
        gpu=shard_gpu if FOLD_ON_GPU else 0,
        gres=shard_gres if FOLD_ON_GPU else "",
        nodes=shard_nodes,
        mem_mb=shard_mem_mb,
        runtime=shard_runtime,
    log:
        LOGDIR / "fold/{shard}.log",
    conda:
        env_path("fold.yaml")
    script:
        script_path("fold.py")
