# Worklist: validate the configured inputs into one table (src/foldmill/io/worklist.py).


rule worklist:
    input:
        config["inputs"],
    output:
        tsv=OUTDIR / "worklist/worklist.tsv",
        parquet=OUTDIR / "worklist/worklist.parquet",
        chains=OUTDIR / "worklist/unique_chains.tsv",
        rejects=OUTDIR / "worklist/rejects.tsv",
    params:
        skip_bad=config["skip_bad"],
        max_tokens=config["worklist"]["max_tokens"],
    resources:
        **slurm_resources(),
    log:
        LOGDIR / "worklist.log",
    conda:
        env_path("foldmill.yaml")
    script:
        script_path("worklist.py")


# Staging and sharding wait for this check: with no target left (empty input, every target
# rejected) the run stops here in one line and earlier outputs (export/, report.html) stay as they are.
rule check_worklist:
    input:
        worklist=rules.worklist.output.tsv,
        rejects=rules.worklist.output.rejects,
    output:
        OUTDIR / "worklist/check.txt",
    log:
        LOGDIR / "check_worklist.log",
    localrule: True
    conda:
        env_path("foldmill.yaml")
    script:
        script_path("worklist_check.py")


FINAL_OUTPUTS.append(rules.worklist.output.tsv)
