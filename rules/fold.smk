# Fold: one job per shard. The Ray replica executor (src/foldmill/executor) folds the shard's
# targets on every GPU of the job (or CPU replicas with model.device cpu), writes
# OUTDIR/predictions/<target_id>/ per target and the shard's fold table. Reruns skip written targets.
# device auto is resolved inside the fold job, on the node that folds: ask for its GPUs.
FOLD_ON_GPU = config["model"]["device"] != "cpu"
# CPUs per node of a fold job, the same number in its sbatch request (the Slurm plugin's
# --cpus-per-task), in the job step's srun and for the job's Ray instance: executor.cpus, else
# slurm.cpus_per_gpu per GPU (per job on CPU). Never derived from --cores, which differs inside a job.
FOLD_CPUS = config["executor"]["cpus"] or SLURM["cpus_per_gpu"] * max(1, SLURM["gpus_per_node"] if FOLD_ON_GPU else 1)


rule check_model:
    input:
        # Nothing to read for the demo model's seeded weights.
        checkpoint=lambda wildcards: [] if config["model"]["checkpoint"] == "demo" else [config["model"]["checkpoint"]],
    output:
        MODEL_CHECK,
    params:
        checkpoint=config["model"]["checkpoint"],
    localrule: True
    retries: 0  # a bad checkpoint stays bad
    log:
        LOGDIR / "check_model.log",
    conda:
        env_path("foldmill.yaml")
    script:
        script_path("check_model.py")


rule fold:
    input:
        # The shard's worklist rows, written by the `shards` checkpoint.
        shard=lambda wildcards: shard_dir() / f"{wildcards.shard}.tsv",
        msa=OUTDIR / "staged/msa_manifest.tsv",
        templates=OUTDIR / "staged/templates_manifest.tsv",
    output:
        table=OUTDIR / "fold/{shard}.tsv",
        # Per target: shard, Slurm job id, node, status, seconds (foldmill.runtime.job_log).
        jobs=LOGDIR / "fold/{shard}.jobs.tsv",
    wildcard_constraints:
        shard=r"shard_\d+",
    params:
        outdir=OUTDIR,
        model=config["model"],
        executor=config["executor"],
        outputs=config["outputs"],
        ray_start_timeout_s=config["slurm"]["ray_start_timeout_s"],
    threads: FOLD_CPUS
    resources:
        attempt=lambda wildcards, attempt: attempt,
        gpu=shard_gpu if FOLD_ON_GPU else 0,
        gres=shard_gres if FOLD_ON_GPU else "",
        nodes=shard_nodes,
        mem_mb=shard_mem_mb,
        runtime=shard_runtime,
        # Snakemake's default disk_mb, max(2 x input size, 1000), costs an event loop per job to
        # size the inputs (a third of planning at 10,000 shards). A fold job's inputs (a shard
        # table, two manifests) are far below 500 MB, so this is the value the default gives.
        disk_mb=1000,
        **slurm_resources("fold", gpus=shard_gpu if FOLD_ON_GPU else 0),
    log:
        LOGDIR / "fold/{shard}.log",
    conda:
        env_path("fold.yaml")
    script:
        script_path("fold.py")
