# MoE language-model pretraining on biological sequences (src/foldmill/moe):
# FASTA corpus -> tokenized, packed shards -> pretrain (resumes from its checkpoints) -> validation perplexity.

MOE = config["moe"]
MOE_DIR = OUTDIR / "moe"
# Every TrainConfig field, taken from the config's moe section (tests/test_config.py checks the list).
# Spelled out rather than read from the dataclass: Snakemake compares params as written, order
# included, and a new order would rerun every finished moe_pretrain.
MOE_TRAIN_KEYS = ("model", "expert_backend", "recompute_experts", "fp8_fast_accumulation", "mxfp8_store_swiglu_input",
                  "keep_weight_copies", "steps", "batch_size", "gradient_accumulation_steps", "seq_len", "lr",
                  "warmup_steps", "min_lr_ratio", "weight_decay", "beta1", "beta2", "grad_clip", "precision",
                  "parallel", "expert_parallel", "checkpoint_every", "eval_every", "eval_batches", "log_every", "seed",
                  "aux_loss_coef", "peak_tflops", "compile", "cuda_graphs")
# One node: `gpu` GPUs (sbatch --gpus). Several nodes: gres gpu:N per node instead (--gpus counts the whole job).
MOE_NODES = MOE["nodes"]
MOE_GPU = MOE["gpus"] if MOE_NODES == 1 else 0
MOE_GRES = "" if MOE_NODES == 1 else f"gpu:{MOE['gpus']}"


rule moe_prepare_corpus:
    input:
        MOE["corpus"],
    output:
        meta=MOE_DIR / "corpus/meta.json",
    params:
        alphabet=MOE["alphabet"],
        val_fraction=MOE["val_fraction"],
        shard_tokens=MOE["shard_tokens"],
    resources:
        **slurm_resources(),
    log:
        LOGDIR / "moe_prepare_corpus.log",
    conda:
        env_path("moe.yaml")
    script:
        script_path("moe_prepare_corpus.py")


rule moe_pretrain:
    input:
        meta=rules.moe_prepare_corpus.output.meta,
    output:
        summary=MOE_DIR / "run/summary.json",
    params:
        train={key: MOE[key] for key in MOE_TRAIN_KEYS},
        run_dir=MOE_DIR / "run",
        gpus=MOE["gpus"],
        nodes=MOE_NODES,
    threads: max(MOE["gpus"], 1) * MOE["cpus_per_gpu"]  # per node
    resources:
        gpu=MOE_GPU,
        gres=MOE_GRES,
        nodes=MOE_NODES,
        runtime=MOE["runtime_minutes"],
        mem_mb=MOE["mem_mb"],
        **slurm_resources("pretrain"),
    log:
        LOGDIR / "moe_pretrain.log",
    conda:
        env_path("moe.yaml")
    script:
        script_path("moe_pretrain.py")


rule moe_evaluate:
    input:
        meta=rules.moe_prepare_corpus.output.meta,
        summary=rules.moe_pretrain.output.summary,
    output:
        MOE_DIR / "evaluation.json",
    params:
        batch_size=MOE["batch_size"],
        max_batches=MOE["eval_batches"],
    resources:
        gpu=min(MOE["gpus"], 1),
        runtime=30,
        mem_mb=MOE["mem_mb"],
        **slurm_resources("pretrain"),
    log:
        LOGDIR / "moe_evaluate.log",
    conda:
        env_path("moe.yaml")
    script:
        script_path("moe_evaluate.py")


if MOE["enabled"]:
    FINAL_OUTPUTS.append(rules.moe_evaluate.output[0])
