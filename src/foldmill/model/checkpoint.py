"""Safe loading of Boltz-2 weights: Lightning .ckpt, plain state_dict files, .safetensors.

Nothing in a weights file is ever executed. Pickled files are read first with PyTorch's
hardened `weights_only=True` unpickler. A Lightning checkpoint also pickles its
hyper-parameters as OmegaConf objects, which that unpickler rejects; for those files a
restricted unpickler rebuilds only tensors and plain containers, replaces the objects of
known metadata libraries (OmegaConf, typing, Lightning, numpy, ...) by inert placeholders
without running any of their code, and refuses any other reference (os.system, eval, ...)
with a CheckpointError. .safetensors files are parsed directly (JSON header + raw bytes).

The model's architecture is read from the weights' shapes (`config_from_state_dict`), so
the published checkpoint loads with strict=True without a hand-written config; a mismatched
file is refused with the missing and unexpected keys listed.
"""

from __future__ import annotations

import _compat_pickle
import json
import pickle
import re
import struct
import types
import zipfile
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from foldmill.errors import CheckpointError
from foldmill.io.hashing import file_sha256
from foldmill.model.config import Boltz2Config

# Globals a state_dict needs, rebuilt for real: tensors, parameters, sizes, ordered dicts.
_TENSOR_GLOBALS = {
    ("collections", "OrderedDict"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_tensor_v3"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._utils", "_rebuild_parameter_with_state"),
    ("torch", "Size"),
    ("_codecs", "encode"),  # how protocol-2 pickles store bytes
}
_PLAIN_BUILTINS = {"dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "str", "bytes", "bool"}

# Libraries whose objects appear in checkpoint metadata (hyper-parameters, loop and callback
# state). Their globals become inert placeholders; the code behind them never runs.
_METADATA_NAMESPACES = (
    "omegaconf",
    "typing",
    "collections",
    "copyreg",
    "pathlib",
    "enum",
    "datetime",
    "functools",
    "argparse",
    "numpy",
    "lightning",
    "lightning_fabric",
    "pytorch_lightning",
    "torchmetrics",
    "boltz",
)

_MAX_LISTED_KEYS = 20


class _Inert:
    """Placeholder for a metadata object: accepts any construction and state, does nothing."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


class _RestrictedUnpickler(pickle.Unpickler):
    """Materialises tensors and plain containers only (see the module docstring)."""

    source = "checkpoint"

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names (protocol-2 pickles write __builtin__.list, ...)
        module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if (module, name) in _TENSOR_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module == "builtins" and name in _PLAIN_BUILTINS:
            return super().find_class(module, name)
        if module.split(".")[0] in _METADATA_NAMESPACES:
            return type(name, (_Inert,), {"__module__": f"inert.{module}"})
        raise CheckpointError(
            f"{self.source}: refusing to load: its pickle references {module}.{name}, which no weights file needs "
            "(possibly malicious; nothing was executed)"
        )


def _restricted_pickle_module(source: str) -> types.ModuleType:
    """A pickle-module stand-in for torch.load whose Unpickler is the restricted one."""
    module = types.ModuleType("foldmill_restricted_pickle")
    unpickler = type("Unpickler", (_RestrictedUnpickler,), {"source": source})
    module.Unpickler = unpickler
    module.load = lambda file, **options: unpickler(file, **options).load()
    module.UnpicklingError = pickle.UnpicklingError
    return module


def _load_pickled(path: Path) -> Any:
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path}: not a PyTorch zip-format weights file (legacy and raw pickles are not read)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        pass  # e.g. a Lightning checkpoint's OmegaConf hyper-parameters: read it restricted
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not a readable PyTorch weights file ({error})") from error
    try:
        return torch.load(
            path, map_location="cpu", weights_only=False, mmap=True, pickle_module=_restricted_pickle_module(str(path))
        )
    except CheckpointError:
        raise
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{path}: not a readable PyTorch weights file ({error})") from error


_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _load_safetensors(path: Path) -> dict[str, Tensor]:
    """Parse a .safetensors file: u64 header length, JSON header, then the raw tensor bytes."""
    data = path.read_bytes()
    try:
        (header_length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + header_length])
        body = memoryview(data)[8 + header_length :]
        tensors = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            start, end = entry["data_offsets"]
            dtype = _SAFETENSORS_DTYPES[entry["dtype"]]
            raw = torch.frombuffer(bytearray(body[start:end]), dtype=torch.uint8)
            tensors[name] = raw.view(dtype).reshape(entry["shape"])
        return tensors
    except (struct.error, ValueError, KeyError, TypeError, RuntimeError) as error:
        raise CheckpointError(f"{path}: not a valid .safetensors file ({error})") from error


def load_state_dict_file(path: str | Path) -> dict[str, Tensor]:
    """The model weights in a Lightning checkpoint, a plain state_dict file or a .safetensors file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    if path.suffix == ".safetensors":
        return _load_safetensors(path)
    payload = _load_pickled(path)
    if isinstance(payload, dict) and isinstance(payload.get("state_dict"), dict):
        payload = payload["state_dict"]  # Lightning checkpoint
    if not isinstance(payload, dict) or not payload or not all(isinstance(v, Tensor) for v in payload.values()):
        raise CheckpointError(f"{path}: holds no state_dict (expected a Lightning checkpoint or a dict of tensors)")
    return dict(payload)


def _count_layers(state_dict: dict[str, Tensor], prefix: str) -> int:
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.")
    indices = {int(m.group(1)) for key in state_dict if (m := pattern.match(key))}
    return max(indices) + 1 if indices else 0


def config_from_state_dict(state_dict: dict[str, Tensor], base: Boltz2Config | None = None) -> Boltz2Config:
    """The architecture implied by the weights' shapes; other settings come from `base`."""
    base = base or Boltz2Config()

    def rows(key: str) -> int:
        return state_dict[key].shape[0]

    def heads_and_depth(prefix: str) -> tuple[int, int]:
        depth = _count_layers(state_dict, prefix)
        return rows(f"{prefix}.0.1.weight"), depth

    try:
        embedder = "input_embedder.atom_encoder.embed_atom_features.weight"
        embedder_depth = _count_layers(
            state_dict, "input_embedder.atom_attention_encoder.atom_encoder.diffusion_transformer.layers"
        )
        msa_attention = "msa_module.layers.0.pairformer_layer.tri_att_start"
        trunk_attention = "pairformer_module.layers.0.tri_att_start"
        encoder_heads, encoder_depth = heads_and_depth("diffusion_conditioning.atom_enc_proj_z")
        decoder_heads, decoder_depth = heads_and_depth("diffusion_conditioning.atom_dec_proj_z")
        token_heads, token_depth = heads_and_depth("diffusion_conditioning.token_trans_proj_z")
        pairwise_heads = rows(f"{trunk_attention}.linear.weight")
        msa_heads = rows(f"{msa_attention}.linear.weight")
        use_templates = "template_module.z_proj.weight" in state_dict
        heads = "confidence_module.confidence_heads"
        shapes: dict[str, Any] = dict(
            token_s=rows("s_init.weight"),
            token_z=rows("z_init_1.weight"),
            atom_s=rows(embedder),
            atom_z=rows("input_embedder.atom_encoder.embed_atompair_ref_pos.weight"),
            atom_feature_dim=state_dict[embedder].shape[1],
            num_bins=rows("distogram_module.distogram.weight"),
            embedder_atom_encoder_depth=embedder_depth,
            embedder_atom_encoder_heads=rows("input_embedder.atom_enc_proj_z.1.weight") // max(embedder_depth, 1),
            use_templates=use_templates,
            msa_s=rows("msa_module.s_proj.weight"),
            msa_blocks=_count_layers(state_dict, "msa_module.layers"),
            msa_pairwise_num_heads=msa_heads,
            msa_pairwise_head_width=rows(f"{msa_attention}.mha.linear_q.weight") // msa_heads,
            msa_use_paired_feature=state_dict["msa_module.msa_proj.weight"].shape[1] == 36,
            pairformer_blocks=_count_layers(state_dict, "pairformer_module.layers"),
            pairformer_heads=rows("pairformer_module.layers.0.attention.proj_z.1.weight"),
            pairwise_num_heads=pairwise_heads,
            pairwise_head_width=rows(f"{trunk_attention}.mha.linear_q.weight") // pairwise_heads,
            dim_fourier=rows("structure_module.score_model.single_conditioner.fourier_embed.proj.weight"),
            diffusion_atom_encoder_depth=encoder_depth,
            diffusion_atom_encoder_heads=encoder_heads,
            token_transformer_depth=token_depth,
            token_transformer_heads=token_heads,
            atom_decoder_depth=decoder_depth,
            atom_decoder_heads=decoder_heads,
            conditioning_transition_layers=_count_layers(
                state_dict, "diffusion_conditioning.pairwise_conditioner.transitions"
            ),
            predict_bfactor="bfactor_module.bfactor.weight" in state_dict,
            confidence_pairformer_blocks=_count_layers(state_dict, "confidence_module.pairformer_stack.layers"),
            confidence_pairformer_heads=rows("confidence_module.pairformer_stack.layers.0.attention.proj_z.1.weight"),
            confidence_num_dist_bins=rows("confidence_module.dist_bin_pairwise_embed.weight"),
            confidence_max_dist=float(state_dict["confidence_module.boundaries"][-1]),
            num_plddt_bins=rows(f"{heads}.to_plddt_logits.weight"),
            confidence_separate_heads=f"{heads}.to_pae_intra_logits.weight" in state_dict,
        )
        separate = "_intra" if shapes["confidence_separate_heads"] else ""
        shapes["num_pae_bins"] = rows(f"{heads}.to_pae{separate}_logits.weight")
        shapes["num_pde_bins"] = rows(f"{heads}.to_pde{separate}_logits.weight")
        if use_templates:
            shapes["template_dim"] = rows("template_module.z_proj.weight")
            shapes["template_blocks"] = _count_layers(state_dict, "template_module.pairformer.layers")
    except (KeyError, IndexError) as error:
        raise CheckpointError(f"not a Boltz-2 state_dict: no parameter {error}") from error
    return base.replace(**shapes)


def _describe_key_mismatch(missing: list[str], unexpected: list[str]) -> str:
    parts = []
    for label, keys in (("missing", missing), ("unexpected", unexpected)):
        if keys:
            listed = ", ".join(keys[:_MAX_LISTED_KEYS])
            more = f" (+{len(keys) - _MAX_LISTED_KEYS} more)" if len(keys) > _MAX_LISTED_KEYS else ""
            parts.append(f"{len(keys)} {label} keys: {listed}{more}")
    return "; ".join(parts)


def load_weights_strict(
    model: torch.nn.Module, state_dict: dict[str, Tensor], source: str, assign: bool = False
) -> None:
    """model.load_state_dict(strict=True), with any key or shape mismatch raised as a CheckpointError.

    assign=True adopts the given tensors as the parameters (for a model built on the meta device).
    """
    check_keys_and_shapes(model.state_dict(), state_dict, source)
    model.load_state_dict(state_dict, strict=True, assign=assign)


def check_keys_and_shapes(expected: dict[str, Tensor], state_dict: dict[str, Tensor], source: str) -> None:
    """Raise a CheckpointError unless `state_dict` has exactly the keys and shapes of `expected`."""
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        mismatch = _describe_key_mismatch(missing, unexpected)
        raise CheckpointError(f"{source}: does not match the Boltz-2 model: {mismatch}")
    wrong_shape = [
        f"{key} {tuple(state_dict[key].shape)} != {tuple(tensor.shape)}"
        for key, tensor in expected.items()
        if state_dict[key].shape != tensor.shape
    ]
    if wrong_shape:
        listed = "; ".join(wrong_shape[:10])
        raise CheckpointError(f"{source}: {len(wrong_shape)} parameters have the wrong shape: {listed}")


def _architecture(state_dict: dict[str, Tensor], config: Boltz2Config | None, source: str) -> Boltz2Config:
    """The weights' architecture; a given config must agree with it."""
    try:
        implied = config_from_state_dict(state_dict, base=config)
    except CheckpointError:
        # Too far from Boltz-2 to read its shape: the key comparison against the given (or
        # published) architecture reports what is wrong.
        return config or Boltz2Config()
    if config is not None and implied != config:
        differing = [
            f"{f.name}={getattr(config, f.name)!r} (weights: {getattr(implied, f.name)!r})"
            for f in fields(config)
            if getattr(config, f.name) != getattr(implied, f.name)
        ]
        raise CheckpointError(f"{source}: the weights do not fit the given config: {', '.join(differing)}")
    return implied


def check_checkpoint(path: str | Path) -> str:
    """Validate a weights file without building the model: it exists, loads through the safe loader,
    and holds a Boltz-2 state_dict with every key and shape of the architecture its shapes imply.
    Returns a one-line description; raises a CheckpointError naming the problem."""
    from foldmill.model.boltz2 import Boltz2

    path = Path(path)
    state_dict = load_state_dict_file(path)
    architecture = _architecture(state_dict, None, str(path))
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        expected = Boltz2(architecture).state_dict()
    check_keys_and_shapes(expected, state_dict, str(path))
    parameters = sum(tensor.numel() for tensor in state_dict.values())
    return f"{path}: Boltz-2 weights, {len(state_dict)} tensors, {parameters:,} values, keys and shapes match"


def load_boltz2(path: str | Path, config: Boltz2Config | None = None) -> Any:
    """Boltz2 (eval mode, CPU) holding the weights of `path`; see the module docstring."""
    from foldmill.model.boltz2 import Boltz2

    path = Path(path)
    state_dict = load_state_dict_file(path)
    architecture = _architecture(state_dict, config, str(path))
    provenance = {"model": "boltz2", "checkpoint": path.name, "checkpoint_sha256": file_sha256(path)}
    with torch.device("meta"):  # no initialisation work or memory: the weights replace every tensor
        model = Boltz2(architecture, provenance=provenance)
    load_weights_strict(model, state_dict, str(path), assign=True)
    left_on_meta = [name for name, tensor in (*model.named_parameters(), *model.named_buffers()) if tensor.is_meta]
    if left_on_meta:
        raise CheckpointError(f"{path}: the weights leave {', '.join(left_on_meta)} uninitialised")
    return model.eval()
