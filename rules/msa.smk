# MSA staging: one MSA per distinct polymer chain (src/foldmill/msa/staging.py).
# Proteins without an MSA are searched in ONE batched MMseqs2 search per run (msa.mode); with
# ColabFold's protocol or server, the worklist's complexes also get paired MSAs.


rule stage_msas:
    input:
        chains=rules.worklist.output.chains,
        worklist=rules.worklist.output.tsv,
        checked=rules.check_worklist.output[0],
        model_check=ancient(MODEL_CHECK),
        database=msa_database_input,
    output:
        manifest=OUTDIR / "staged/msa_manifest.tsv",
        rejects=OUTDIR / "staged/msa_rejects.tsv",
    params:
        msa=config["msa"],
        cache_dir=config["msa"]["cache_dir"] or str(OUTDIR / "staged/cache/msa"),
    threads: config["msa"]["threads"]
    resources:
        attempt=lambda wildcards, attempt: attempt,
        mem_mb=staging_mem_mb(256000, LOGDIR / "stage_msas.log"),
        runtime=grown(720, LOGDIR / "stage_msas.log", cap=0),
        **slurm_resources("msa"),
    log:
        LOGDIR / "stage_msas.log",
    conda:
        env_path("msa.yaml")
    script:
        script_path("msa_stage.py")


FINAL_OUTPUTS.append(rules.stage_msas.output.manifest)
