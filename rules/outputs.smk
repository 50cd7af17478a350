# Outputs: run summary -> confidence filters -> high-confidence export, the report's figures and
# OUTDIR/report.html. Logic lives in src/foldmill/outputs/; thresholds are params, so changing them
# reruns only filter, export and the report, never the summary (let alone folding). Each writer
# replaces only files it wrote (its `.foldmill-<command>` ledger) and refuses anything else.

report: "../workflow/report/workflow.rst"


rule summary:
    input:
        # The fold tables of every shard the `shards` checkpoint wrote (a lambda keeps --lint clean).
        fold=lambda wildcards: [OUTDIR / f"fold/{s}.tsv" for s in shard_ids(wildcards)],
        # Per target: the shard, Slurm job and node that folded it (rule fold's job tables).
        jobs=lambda wildcards: [LOGDIR / f"fold/{s}.jobs.tsv" for s in shard_ids(wildcards)],
        worklist=OUTDIR / "worklist/worklist.tsv",
        # What was refused on the way, so every target given appears with its status and reason.
        worklist_rejects=OUTDIR / "worklist/rejects.tsv",
        msa_manifest=OUTDIR / "staged/msa_manifest.tsv",
        msa_rejects=OUTDIR / "staged/msa_rejects.tsv",
        template_rejects=OUTDIR / "staged/templates_rejects.tsv",
    output:
        tsv=OUTDIR / "summary.tsv",
        parquet=OUTDIR / "summary.parquet",
    resources:
        **slurm_resources(),
    log:
        LOGDIR / "summary.log",
    conda:
        env_path("foldmill.yaml")
    script:
        script_path("summary.py")


rule filter:
    input:
        rules.summary.output.tsv,
    output:
        passed=OUTDIR / "filter/passed.tsv",
        failed=OUTDIR / "filter/failed.tsv",
    params:
        filters=config["filters"],
    resources:
        **slurm_resources(),
    log:
        LOGDIR / "filter.log",
    conda:
        env_path("foldmill.yaml")
    script:
        script_path("filter.py")


rule export:
    input:
        passed=rules.filter.output.passed,
        failed=rules.filter.output.failed,
    output:
        # The folder is swapped in as a whole; naming its manifest (not the folder) keeps Snakemake
        # from deleting the folder before the job, so a folder holding anything else is refused, not lost.
        manifest=OUTDIR / "export/manifest.tsv",
    params:
        filters=config["filters"],
        export=config["export"],
    resources:
        **slurm_resources(),
    log:
        LOGDIR / "export.log",
    conda:
        env_path("foldmill.yaml")
    script:
        script_path("export.py")


rule export_archive:
    input:
        rules.export.output.manifest,
    output:
        OUTDIR / "export.tar.gz",
    resources:
        **slurm_resources(),
    log:
        LOGDIR / "export_archive.log",
    conda:
        env_path("foldmill.yaml")
    script:
        script_path("export_archive.py")


rule report_figures:
    input:
        passed=rules.filter.output.passed,
        failed=rules.filter.output.failed,
    output:
        plddt=report(
            OUTDIR / "report/plddt_distribution.png",
            caption="../workflow/report/plddt_distribution.rst",
            category="Confidence",
        ),
        ptm_iptm=report(
            OUTDIR / "report/ptm_vs_iptm.png",
            caption="../workflow/report/ptm_vs_iptm.rst",
            category="Confidence",
        ),
        filters=report(
            OUTDIR / "report/filter_counts.png",
            caption="../workflow/report/filter_counts.rst",
            category="Filters",
        ),
        throughput=report(
            OUTDIR / "report/throughput.png",
            caption="../workflow/report/throughput.rst",
            category="Run",
        ),
        targets=report(
            OUTDIR / "report/targets.html",
            caption="../workflow/report/targets.rst",
            category="Targets",
        ),
    params:
        filters=config["filters"],
    resources:
        **slurm_resources(),
    log:
        LOGDIR / "report_figures.log",
    conda:
        env_path("foldmill.yaml")
    script:
        script_path("summary_report.py")


rule report:
    input:
        passed=rules.filter.output.passed,
        failed=rules.filter.output.failed,
    output:
        OUTDIR / "report.html",
    params:
        filters=config["filters"],
    resources:
        **slurm_resources(),
    log:
        LOGDIR / "report.log",
    conda:
        env_path("foldmill.yaml")
    script:
        script_path("report.py")


FINAL_OUTPUTS.extend(
    [rules.summary.output.parquet, rules.export.output.manifest, *rules.report_figures.output, rules.report.output[0]]
)
if config["export"]["tar_gz"]:
    FINAL_OUTPUTS.append(rules.export_archive.output[0])
