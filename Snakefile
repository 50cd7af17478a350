# foldmill: proteome-scale structure prediction and MoE pretraining.
# Run the demo:  snakemake --cores 2   (config/config.yaml)
# Use as a module from another workflow:
#   module foldmill:
#       snakefile: "path/to/foldmill/Snakefile"
#       config: config["foldmill"]
#   use rule * from foldmill as foldmill_*
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/checks.smk"


rule all:
    input:
        lambda wildcards: FINAL_OUTPUTS,
    default_target: True


include: "rules/worklist.smk"
include: "rules/shards.smk"
include: "rules/fold.smk"
include: "rules/msa.smk"
include: "rules/templates.smk"
include: "rules/outputs.smk"
include: "rules/moe.smk"
