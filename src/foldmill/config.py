"""The workflow config: one schema, one loader, for Snakemake (rules/common.smk) and the CLI.

The schema (workflow/schemas/config.schema.yaml; `config.schema.yaml` beside this module links to
it so installed packages carry it) is the only place defaults live. `resolve_config` turns a
config as a user gave it into the complete one every rule and command reads:

1. values are coerced to the schema's types (Snakemake's `--config 'msa={threads: 1}'` hands
   nested values over as strings),
2. an unknown key at any level is an error naming it,
3. every default is filled in,
4. the result is validated.

A config without `inputs` that turns `moe.enabled` on pretrains only: the keys only folding needs
(FOLDING_KEYS) are not required of it.

Every problem is a ConfigError of one line naming the key. Library dataclasses that mirror a
section (ModelSettings, ExecutorSettings, ...) are checked against these defaults by
tests/test_config.py.
"""

from __future__ import annotations

import copy
import difflib
import functools
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from foldmill.errors import FoldmillError

SCHEMA_PATH = Path(__file__).with_name("config.schema.yaml")
TRUE_WORDS = {"true", "yes", "on"}
FALSE_WORDS = {"false", "no", "off"}
NULL_WORDS = {"null", "none", "~"}
INTEGER = re.compile(r"[+-]?\d+")

# Required keys that only folding reads.
FOLDING_KEYS = ("inputs", "model.checkpoint")

log = logging.getLogger(__name__)


class ConfigError(FoldmillError):
    """A config that does not fit the schema (one line, naming the key)."""


@functools.cache
def schema() -> dict[str, Any]:
    with open(SCHEMA_PATH, encoding="utf-8") as stream:
        return yaml.safe_load(stream)


def section_schema(dotted: str = "") -> dict[str, Any]:
    """The schema of one section, e.g. "model.recipe" ("" = the whole config)."""
    node = schema()
    for name in filter(None, dotted.split(".")):
        node = node["properties"][name]
    return node


def defaults(dotted: str = "") -> dict[str, Any]:
    """Every default of a section (nested sections filled too), as a config would get it."""
    filled = _fill_defaults({}, section_schema(dotted))
    return filled


def resolve_config(config: Mapping[str, Any] | None, where: str = "config", require: bool = True) -> dict[str, Any]:
    """The complete, validated config: coerced, checked for unknown keys, defaults filled.

    require=False skips the schema's required keys (a command that reads only some sections).
    """
    if config is None:
        config = {}
    if not isinstance(config, Mapping):
        raise ConfigError(f"{where}: a config must be a mapping of keys, not {type(config).__name__}")
    root = schema()
    resolved = _coerce(copy.deepcopy(dict(config)), root)
    _reject_unknown_keys(resolved, root, where, ())
    resolved = _fill_defaults(resolved, root)
    not_required = FOLDING_KEYS if pretrains_only(resolved) else ()
    errors = [
        error
        for error in jsonschema.Draft202012Validator(root).iter_errors(resolved)
        if error.validator != "required" or (require and _missing_key(error) not in not_required)
    ]
    if errors:
        raise ConfigError(_describe(min(errors, key=lambda error: list(error.absolute_path)), where))
    return resolved


def pretrains_only(config: Mapping[str, Any]) -> bool:
    """Whether a config (defaults filled) runs MoE pretraining alone: it gives no inputs to fold."""
    return "inputs" not in config and bool(config.get("moe", {}).get("enabled"))


def load_config(path: str | Path, require: bool = True) -> dict[str, Any]:
    """Read a YAML config file and resolve it (errors name the file)."""
    try:
        with open(path, encoding="utf-8") as stream:
            raw = yaml.safe_load(stream)
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"{path}: cannot read config: {error}") from None
    return resolve_config(raw, where=str(path), require=require)


def run_summary(config: Mapping[str, Any]) -> str:
    """One line saying what a resolved config will run (printed when a workflow starts)."""
    if pretrains_only(config):
        return f"foldmill: no inputs, so no folding; MoE pretraining on; outdir {config['outdir']}"
    model, recipe = config["model"], config["model"]["recipe"]
    weights = "demo (random weights, not real structures)" if model["checkpoint"] == "demo" else model["checkpoint"]
    return (
        f"foldmill: model {weights}, device {model['device']}; recipe {recipe['recycling_steps']} recycling steps, "
        f"{recipe['sampling_steps']} sampling steps, {recipe['diffusion_samples']} sample(s), seed {recipe['seed']}; "
        f"targets up to {config['worklist']['max_tokens']} tokens; "
        f"MoE pretraining {'on' if config['moe']['enabled'] else 'off'}; outdir {config['outdir']}"
    )


def resolve_device(device: str) -> str:
    """`auto` becomes cuda when torch sees a GPU, else cpu with one warning; cpu and cuda stay."""
    if device != "auto":
        return device
    import torch  # only here: planning a workflow must not pay for importing torch

    if torch.cuda.is_available():
        return "cuda"
    log.warning("model.device is auto and no CUDA GPU is visible: folding on CPU (slow; set model.device: cpu)")
    return "cpu"


def _types(node: Mapping[str, Any]) -> list[str]:
    kind = node.get("type", [])
    return [kind] if isinstance(kind, str) else list(kind)


def _coerce(value: Any, node: Mapping[str, Any]) -> Any:
    """A string where the schema wants a number, boolean or null becomes one (when it reads as one)."""
    if isinstance(value, dict):
        properties = node.get("properties", {})
        return {key: _coerce(item, properties[key]) if key in properties else item for key, item in value.items()}
    if isinstance(value, list) and "items" in node:
        return [_coerce(item, node["items"]) for item in value]
    if not isinstance(value, str):
        return value
    types = _types(node)
    if "string" in types or not types:
        return value
    word = value.strip().lower()
    if "null" in types and word in NULL_WORDS:
        return None
    if "boolean" in types and word in TRUE_WORDS | FALSE_WORDS:
        return word in TRUE_WORDS
    if ("integer" in types or "number" in types) and INTEGER.fullmatch(word):
        return int(word)
    if "number" in types:
        try:
            return float(word)
        except ValueError:
            pass
    return value


def _reject_unknown_keys(value: Any, node: Mapping[str, Any], where: str, path: tuple[str, ...]) -> None:
    if not isinstance(value, dict) or "properties" not in node:
        return
    properties = node["properties"]
    for key, item in value.items():
        if key not in properties:
            place = f"in {'.'.join(path)}" if path else "top level"
            close = difflib.get_close_matches(str(key), list(properties), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(properties)}"
            raise ConfigError(f"{where}: unknown key '{key}' ({place}{hint})")
        _reject_unknown_keys(item, properties[key], where, (*path, key))


def _fill_defaults(value: Any, node: Mapping[str, Any]) -> Any:
    if not isinstance(value, dict) or "properties" not in node:
        return value
    for key, child in node["properties"].items():
        if key not in value and "default" in child:
            value[key] = copy.deepcopy(child["default"])
        if key in value:
            value[key] = _fill_defaults(value[key], child)
    return value


def _missing_key(error: jsonschema.ValidationError) -> str:
    """The dotted key a "required" error is about, e.g. "model.checkpoint"."""
    missing = next(name for name in error.validator_value if name not in error.instance)
    return ".".join([*(str(part) for part in error.absolute_path), missing])


def _describe(error: jsonschema.ValidationError, where: str) -> str:
    path = ".".join(str(part) for part in error.absolute_path)
    if error.validator == "required":
        key = _missing_key(error)
        description = error.schema["properties"][key.rsplit(".", 1)[-1]].get("description", "")
        return f"{where}: missing key '{key}'" + (f" ({description})" if description else "")
    if error.validator == "minItems" and not error.instance:
        description = error.schema.get("description", "")
        return f"{where}: {path}: empty" + (f" ({description})" if description else "")
    return f"{where}: {path or 'top level'}: {error.message}"
