# Template staging: user templates aligned to their chains, plus an optional batched MMseqs2
# template search against a seqres FASTA (src/foldmill/templates/staging.py).


rule stage_templates:
    input:
        worklist=rules.worklist.output.tsv,
        checked=rules.check_worklist.output[0],
        model_check=ancient(MODEL_CHECK),
        seqres=template_search_inputs,
    output:
        manifest=OUTDIR / "staged/templates_manifest.tsv",
        rejects=OUTDIR / "staged/templates_rejects.tsv",
    params:
        templates=config["templates"],
        cache_dir=config["templates"]["cache_dir"] or str(OUTDIR / "staged/cache/templates"),
    threads: config["templates"]["threads"]
    resources:
        attempt=lambda wildcards, attempt: attempt,
        mem_mb=staging_mem_mb(128000, LOGDIR / "stage_templates.log"),
        runtime=grown(360, LOGDIR / "stage_templates.log", cap=0),
        **slurm_resources("templates"),
    log:
        LOGDIR / "stage_templates.log",
    conda:
        env_path("msa.yaml")
    script:
        script_path("templates_stage.py")


FINAL_OUTPUTS.append(rules.stage_templates.output.manifest)
