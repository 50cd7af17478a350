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
    log:
        LOGDIR / "worklist.log",
    conda:
        env_path("foldmill.yaml")
    script:
        script_path("worklist.py")


FINAL_OUTPUTS.append(rules.worklist.output.tsv)
