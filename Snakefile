# foldmill: proteome-scale structure prediction and MoE pretraining.
# Run the demo:  snakemake --cores 2 --configfile config/demo/config.yaml   (also what runs without any config)
# Use as a module from another workflow:
#   module foldmill:
#       snakefile: "path/to/foldmill/Snakefile"
#       config: config["foldmill"]
#   use rule * from foldmill as foldmill_*
from snakemake.utils import min_version

min_version("9.0")


# The demo config applies only when no config was given at all (no --configfile, --config or module
# `config:`): a user's config gets the schema's defaults and nothing from the demo.
if not config and not workflow.config_settings.configfiles:
    configfile: "config/demo/config.yaml"


include: "rules/common.smk"
include: "rules/checks.smk"


# Snakemake keeps a single onstart handler, so every start-up step is here: Ctrl-C or SIGTERM to
# Snakemake alone stops running jobs too (foldmill.runtime.job_signals); on Slurm, every planned
# job must fit a node of its partition (rules/checks.smk).
onstart:
    from foldmill.runtime.job_signals import forward_stop_signals_to_jobs

    forward_stop_signals_to_jobs()
    check_slurm_plan()


# On Slurm, the jobs of the run that failed, with sacct's reasons (rules/common.smk); one handler each.
onsuccess:
    report_slurm_failures()


onerror:
    report_slurm_failures()


rule all:
    input:
        lambda wildcards: FINAL_OUTPUTS,
    default_target: True


if FOLDING:

    include: "rules/worklist.smk"
    include: "rules/shards.smk"
    include: "rules/fold.smk"
    include: "rules/msa.smk"
    include: "rules/templates.smk"
    include: "rules/outputs.smk"


include: "rules/moe.smk"
