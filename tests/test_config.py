"""The config model: one schema for defaults, the demo only on request, unknown keys named, typed --config values."""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from foldmill.config import ConfigError, defaults, load_config, resolve_config, schema
from foldmill.executor.run import OutputSettings
from foldmill.executor.settings import ExecutorSettings, ModelSettings, model_settings
from foldmill.model.config import InferenceRecipe
from foldmill.msa.staging import MSAStagingConfig
from foldmill.runtime.sharding import JobSizing

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
DEMO = REPO / "config/demo/config.yaml"


def snakemake(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def minimal_config(tmp_path: Path, **extra) -> Path:
    """What a user writes for a real run: inputs, outdir and the checkpoint."""
    config = {"inputs": [str(REPO / "config/demo/proteome.fasta")], "outdir": str(tmp_path / "run"),
              "model": {"checkpoint": "demo"}, **extra}  # fmt: skip
    path = tmp_path / "my.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def object_schemas(node: dict, path: str = ""):
    """Every object schema with named properties, with its dotted path."""
    if "properties" in node:
        yield path, node
        for name, child in node["properties"].items():
            yield from object_schemas(child, f"{path}.{name}" if path else name)


def leaf_defaults(node: dict, path: str = ""):
    """(dotted key, default) of every key that is not itself a section; required keys have no default."""
    for name, child in node.get("properties", {}).items():
        key = f"{path}.{name}" if path else name
        if "properties" in child:
            yield from leaf_defaults(child, key)
        else:
            yield key, child.get("default", "(required)")


# --- the config a real run gets -------------------------------------------------------------------


def test_minimal_config_plans_the_released_recipe_and_no_moe(tmp_path):
    """inputs + outdir + checkpoint: nothing from the demo, Boltz-2's recipe, MoE off (snakemake -n)."""
    done = snakemake("-n", "--configfile", str(minimal_config(tmp_path)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "foldmill: model demo (random weights, not real structures), device auto; recipe 3 recycling steps, " \
           "200 sampling steps, 1 sample(s), seed 0; targets up to 6000 tokens; MoE pretraining off" in done.stderr
    jobs = set(re.findall(r"^(\w+)\s+\d+$", done.stdout.split("Job stats:")[1].split("total")[0], re.M))
    assert jobs == {"check_model", "worklist", "check_worklist", "shards", "stage_msas", "stage_templates",
                    "summary", "filter", "export", "report_figures", "report", "all"}  # fmt: skip
    resolved = load_config(minimal_config(tmp_path))
    assert resolved["model"]["device"] == "auto"
    assert resolved["model"]["recipe"] == {"recycling_steps": 3, "sampling_steps": 200, "diffusion_samples": 1,
                                           "max_parallel_samples": 5, "seed": 0}  # fmt: skip
    assert resolved["executor"]["object_store_mb"] == 0 and resolved["executor"]["cpu_replicas"] == 1
    assert resolved["moe"]["enabled"] is False and resolved["export"]["tar_gz"] is False


def test_recipe_defaults_are_boltz2_predict_defaults():
    """The schema's recipe matches `boltz predict`'s own CLI defaults (boltz-community, read from its options)."""
    boltz_main = pytest.importorskip("boltz.main")
    predict = {option.name: option.default for option in boltz_main.predict.params}
    recipe = defaults("model.recipe")
    for key in ("recycling_steps", "sampling_steps", "diffusion_samples", "max_parallel_samples"):
        assert recipe[key] == predict[key], key
    assert defaults("model")["max_msa_seqs"] == predict["max_msa_seqs"]


def test_no_config_runs_the_demo_and_a_config_gets_nothing_from_it(tmp_path):
    demo = snakemake("-n")
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "recipe 1 recycling steps, 10 sampling steps, 2 sample(s)" in demo.stderr
    assert "MoE pretraining on" in demo.stderr and "moe_pretrain" in demo.stdout
    # A config file with nothing in it is still a config: no demo.
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")
    nothing = snakemake("-n", "--configfile", str(empty))
    assert nothing.returncode != 0 and "missing key 'inputs'" in nothing.stderr
    # Only the outdir given: the demo is not merged in, so inputs are missing.
    only_outdir = snakemake("-n", "--config", f"outdir={tmp_path}/x")
    assert only_outdir.returncode != 0
    assert only_outdir.stderr.strip().splitlines()[-1] == "foldmill: error: config: missing key 'inputs' " \
        "(proteome FASTA, target sheets (TSV/CSV) and Boltz YAML/FASTA files to fold; leave the key out and set " \
        "moe.enabled true to run MoE pretraining alone)"


def test_a_config_without_inputs_pretrains_only(tmp_path):
    """No inputs and moe.enabled: the MoE rules alone, with no fold checkpoint asked for; turned on
    without a corpus, one line says so. (test_moe_workflow runs such a config for real.)"""
    corpus = REPO / "config/demo/yeast_chr1.fasta"
    config = tmp_path / "pretrain.yaml"
    config.write_text(f"outdir: {tmp_path / 'out'}\nmoe: {{enabled: true, corpus: [{corpus}]}}\n")
    planned = snakemake("-n", "--configfile", str(config))
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert f"foldmill: no inputs, so no folding; MoE pretraining on; outdir {tmp_path / 'out'}" in planned.stderr
    jobs = planned.stdout[planned.stdout.index("Job stats"):]
    assert {"moe_prepare_corpus", "moe_pretrain", "moe_evaluate"} <= set(jobs.split())
    assert not {"worklist", "check_model", "fold", "stage_msas"} & set(jobs.split()), jobs
    config.write_text(f"outdir: {tmp_path / 'out'}\nmoe: {{enabled: true}}\n")
    empty = snakemake("-n", "--configfile", str(config))
    assert empty.returncode != 0 and "Traceback" not in empty.stderr
    assert empty.stderr.strip().splitlines()[-1] == ("foldmill: error: config: moe.corpus: empty (pretraining "
                                                     "(moe.enabled true) needs FASTA files to train on)")


def test_checkpoint_is_required(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(f"inputs: [{REPO / 'config/demo/proteome.fasta'}]\noutdir: {tmp_path / 'out'}\n")
    done = snakemake("-n", "--configfile", str(config))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("foldmill: error: config: missing key 'model.checkpoint'")


# --- unknown keys and typed values ----------------------------------------------------------------


def test_every_section_of_the_schema_rejects_unknown_keys():
    for path, node in object_schemas(schema()):
        assert node.get("additionalProperties") is False, path or "top level"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"outdirr": "x"}, "config: unknown key 'outdirr' (top level; did you mean 'outdir'?)"),
        ({"msa": {"threds": 1}}, "config: unknown key 'threds' (in msa; did you mean 'threads'?)"),
        ({"filters": {"complex": {"min_ipt": 0.5}}},
         "config: unknown key 'min_ipt' (in filters.complex; did you mean 'min_iptm'?)"),
    ],
)  # fmt: skip
def test_unknown_key_is_one_line_naming_it(tmp_path, extra, message):
    done = snakemake("-n", "--configfile", str(minimal_config(tmp_path, **extra)))
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [f"foldmill: error: {message}"]


def test_command_line_values_take_the_schema_types(tmp_path):
    """Snakemake hands nested --config values over as strings; they are read as the schema's types."""
    done = snakemake("-n", "--configfile", str(minimal_config(tmp_path)), "--config", "msa={threads: 1}",
                     "model={checkpoint: demo, recipe: {sampling_steps: 20}}", "export={tar_gz: true}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "200 sampling steps" not in done.stderr and "20 sampling steps" in done.stderr
    assert "export_archive" in done.stdout
    given = {"inputs": ["a.fasta"], "model": {"checkpoint": "demo", "recipe": {"seed": "7"}},
             "msa": {"threads": "1", "evalue": "1e-3", "diversity_filter": "false"},
             "outputs": {"top_k": "null"}, "filters": {"monomer": {"min_plddt": "null"}}}  # fmt: skip
    resolved = resolve_config(given)
    assert resolved["model"]["recipe"]["seed"] == 7 and resolved["msa"]["threads"] == 1
    assert resolved["msa"]["evalue"] == 0.001 and resolved["msa"]["diversity_filter"] is False
    assert resolved["outputs"]["top_k"] is None and resolved["filters"]["monomer"]["min_plddt"] is None
    with pytest.raises(ConfigError, match=r"^config: msa.threads: 'one' is not of type 'integer'$"):
        resolve_config({"inputs": ["a"], "model": {"checkpoint": "demo"}, "msa": {"threads": "one"}})


# --- device auto ----------------------------------------------------------------------------------
# (A whole fold with --device auto on a machine without a GPU: tests/test_fold.py's Boltz YAML example.)


@pytest.mark.skipif(torch.cuda.is_available(), reason="auto means cuda where a GPU is visible")
def test_device_auto_is_cpu_with_one_warning_without_a_gpu(caplog):
    with caplog.at_level(logging.WARNING):
        settings = model_settings({"checkpoint": "demo", "device": "auto"})
        dataclasses.replace(settings, max_msa_seqs=16)  # a copy keeps the resolved device, no second warning
    assert settings.device == "cpu"
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warnings == ["model.device is auto and no CUDA GPU is visible: folding on CPU (slow; set model.device: cpu)"]


# --- one source of defaults -----------------------------------------------------------------------


def dataclass_defaults(cls: type) -> dict[str, object]:
    found = {}
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            found[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            found[field.name] = field.default_factory()
    return found


@pytest.mark.parametrize(
    ("cls", "section", "exempt"),
    [
        (ModelSettings, "model", {"recipe"}),
        (ExecutorSettings, "executor", set()),
        (InferenceRecipe, "model.recipe", {"seed"}),  # None = a fresh seed; ModelSettings seeds it (0)
        (OutputSettings, "outputs", set()),
        (JobSizing, "slurm", set()),
    ],
)
def test_dataclass_defaults_agree_with_the_schema(cls, section, exempt):
    schema_defaults = defaults(section)
    mine = dataclass_defaults(cls)
    shared = set(mine) - exempt
    assert shared <= set(schema_defaults), f"{cls.__name__} has fields the schema's {section} lacks"
    assert {key: mine[key] for key in shared} == {key: schema_defaults[key] for key in shared}
    required = {field.name for field in dataclasses.fields(cls)} - set(mine)
    assert required == set(section_required(section)), f"{cls.__name__}: required fields differ from the schema"


def section_required(section: str) -> list[str]:
    node = schema()
    for name in section.split("."):
        node = node["properties"][name]
    return node.get("required", [])


def test_model_settings_recipe_default_is_the_schema_recipe():
    assert dataclasses.asdict(ModelSettings("demo", "cpu").recipe) == defaults("model.recipe")
    # what the fold log says about a config that sets no recipe
    assert ModelSettings("/data/boltz2_conf.ckpt", "cpu").describe() == (
        "model /data/boltz2_conf.ckpt, device cpu; recipe 3 recycling steps, 200 sampling steps, 1 sample(s), seed 0"
    )


def test_staging_sections_take_schema_defaults_for_missing_keys():
    assert MSAStagingConfig.from_config({}) == MSAStagingConfig.from_config(defaults("msa"))
    staged = MSAStagingConfig.from_config({})
    assert (staged.search.threads, staged.search.evalue, staged.max_depth) == (8, 0.1, 8192)


def test_filter_command_defaults_to_the_workflow_thresholds(tmp_path):
    from argparse import Namespace

    from foldmill.cli.filter import thresholds_from_args
    from foldmill.outputs.filters import FilterConfig

    workflow = FilterConfig.from_config(defaults("filters"))
    assert thresholds_from_args(Namespace(config=None, set=[])) == workflow
    assert workflow.complex.min_iptm == 0.6 and workflow.monomer.min_plddt == 70
    partial = tmp_path / "c.yaml"
    partial.write_text("filters: {complex: {min_iptm: 0.3}}\n")
    chosen = thresholds_from_args(Namespace(config=str(partial), set=["monomer.min_ptm=null"]))
    assert (chosen.complex.min_iptm, chosen.complex.min_plddt, chosen.monomer.min_ptm) == (0.3, 70, None)


def test_workflow_sets_every_moe_training_key():
    """Every training setting is a key of the schema's moe section, and the workflow hands each one
    over: TrainConfig's own defaults are the library's small-run ones, which a workflow run never
    falls back to."""
    from foldmill.moe.config import TrainConfig

    moe_rules = (REPO / "rules/moe.smk").read_text()
    passed = set(re.search(r"MOE_TRAIN_KEYS = \((.*?)\)", moe_rules, re.S).group(1).replace('"', "").replace(
        "\n", "").replace(" ", "").strip(",").split(","))  # fmt: skip
    fields = {field.name for field in dataclasses.fields(TrainConfig)}
    assert fields <= set(defaults("moe")), f"not in the schema: {sorted(fields - set(defaults('moe')))}"
    assert passed == fields


# --- the size guard -------------------------------------------------------------------------------


def test_oversize_target_is_rejected_at_the_worklist_with_its_reason(tmp_path):
    proteins = tmp_path / "proteins.fasta"
    proteins.write_text(">small\n" + "MKTAYIAK" * 5 + "\n>large\n" + "MKTAYIAK" * 10 + "\n")
    config = minimal_config(tmp_path, inputs=[str(proteins)], worklist={"max_tokens": 60})
    worklist = tmp_path / "run/worklist/worklist.tsv"
    done = snakemake("--cores", "1", "--configfile", str(config), "--", str(worklist))
    assert done.returncode == 0, done.stderr[-3000:]
    assert pd.read_csv(worklist, sep="\t")["target_id"].tolist() == ["small"]
    rejects = pd.read_csv(tmp_path / "run/worklist/rejects.tsv", sep="\t")
    assert rejects[["record", "problem"]].values.tolist() == [["line 3 (large)", "80 tokens > max_tokens 60"]]


def test_worklist_command_rejects_past_the_default_limit(tmp_path, capsys):
    from foldmill.cli import main

    proteins = tmp_path / "proteins.fasta"
    proteins.write_text(">fits\n" + "A" * 6000 + "\n>too_big\n" + "A" * 6001 + "\n")
    code = main(["worklist", str(proteins), "-o", str(tmp_path / "wl"), "--skip-bad"])  # in-process: no start-up
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "1 targets (6000 tokens), 1 rejected" in printed.out
    rejects = pd.read_csv(tmp_path / "wl/rejects.tsv", sep="\t")
    assert rejects["problem"].tolist() == ["6001 tokens > max_tokens 6000"]


# --- the documentation ----------------------------------------------------------------------------


def documented_value(value: object) -> str:
    if value == "(required)":
        return "(required)"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return '`""`'
    if isinstance(value, (list, dict)):
        return f"`{yaml.safe_dump(value, default_flow_style=True).strip()}`"
    return f"`{value}`"


def test_config_readme_documents_every_key_with_its_schema_default():
    rows = dict(re.findall(r"^\| `([\w.]+)` \| ([^|]+?) \|", (REPO / "config/README.md").read_text(), re.M))
    expected = {key: documented_value(default) for key, default in leaf_defaults(schema())}
    assert {key: rows.get(key) for key in expected} == expected
    assert set(rows) <= set(expected), f"documented but not in the schema: {sorted(set(rows) - set(expected))}"
