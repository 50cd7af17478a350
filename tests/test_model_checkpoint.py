"""Checkpoint loading: Lightning .ckpt with OmegaConf hyper-parameters, plain and safetensors
weights, architecture read from the weights, clean refusals of mismatched or malicious files."""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from foldmill.errors import CheckpointError
from foldmill.model import Boltz2, Boltz2Config
from foldmill.model.checkpoint import config_from_state_dict, load_state_dict_file
from foldmill.model.demo import demo_model

SMALL = Boltz2Config.small()
# OSS boltz-community 2.13.0 Boltz2 built with the published hyperparameters (see
# foldmill.bench._oss_reference.oss_hyperparameters): 5,102 state_dict tensors, 521,047,871 values.
PUBLISHED_TENSORS = 5102
PUBLISHED_VALUES = 521_047_871


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    return demo_model(SMALL, seed=1).state_dict()


def save_lightning_checkpoint(path: Path, state_dict: dict[str, torch.Tensor], extra: dict | None = None) -> Path:
    """What Lightning writes: the weights plus hyper-parameters as OmegaConf containers."""
    checkpoint = {
        "epoch": 3,
        "global_step": 1000,
        "pytorch-lightning_version": "2.5.0",
        "state_dict": state_dict,
        "hparams_name": "kwargs",
        "hyper_parameters": {
            "token_s": 64,
            "embedder_args": OmegaConf.create({"atom_encoder_depth": 2, "add_mol_type_feat": True}),
            "confidence_model_args": OmegaConf.create({"pairformer_args": {"num_blocks": 1}, "num_dist_bins": 64}),
            "steering_args": OmegaConf.create({"fk_steering": False, "num_particles": [3]}),
        },
        **(extra or {}),
    }
    torch.save(checkpoint, path)
    return path


def test_lightning_checkpoint_loads_strictly(tmp_path, weights):
    path = save_lightning_checkpoint(tmp_path / "boltz2_conf.ckpt", weights)
    with pytest.raises(pickle.UnpicklingError):  # the premise: the hardened loader alone refuses it
        torch.load(path, weights_only=True)
    model = Boltz2.from_checkpoint(path)
    assert model.config == SMALL  # the architecture was read from the weights
    assert not model.training
    assert model.provenance["model"] == "boltz2" and len(model.provenance["checkpoint_sha256"]) == 64
    loaded = model.state_dict()
    assert loaded.keys() == weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(loaded[name], tensor), name


def test_plain_state_dict_and_safetensors(tmp_path, weights):
    plain = tmp_path / "weights.pt"
    torch.save(weights, plain)
    assert Boltz2.from_checkpoint(plain, SMALL).config == SMALL

    header, chunks, offset = {}, [], 0
    for name, tensor in weights.items():
        data = tensor.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    encoded = json.dumps(header).encode()
    safetensors = tmp_path / "weights.safetensors"
    safetensors.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks))
    loaded = load_state_dict_file(safetensors)
    assert all(torch.equal(loaded[name], tensor) for name, tensor in weights.items())


def test_wrong_key_is_refused_with_the_keys_listed(tmp_path, weights):
    renamed = dict(weights)
    renamed["pairformer_module.layers.0.attention.proj_q.weight_renamed"] = renamed.pop(
        "pairformer_module.layers.0.attention.proj_q.weight"
    )
    renamed["affinity_module1.extra"] = torch.zeros(1)
    path = save_lightning_checkpoint(tmp_path / "wrong.ckpt", renamed)
    with pytest.raises(CheckpointError) as error:
        Boltz2.from_checkpoint(path)
    message = str(error.value)
    assert "1 missing keys: pairformer_module.layers.0.attention.proj_q.weight" in message
    assert "2 unexpected keys" in message and "affinity_module1.extra" in message
    assert "proj_q.weight_renamed" in message


def test_wrong_shape_and_wrong_config_are_refused(tmp_path, weights):
    path = save_lightning_checkpoint(tmp_path / "ok.ckpt", weights)
    with pytest.raises(CheckpointError, match="pairformer_blocks=5 .weights: 2."):
        Boltz2.from_checkpoint(path, SMALL.replace(pairformer_blocks=5))

    reshaped = dict(weights)
    reshaped["s_recycle.weight"] = torch.zeros(3, 3)
    with pytest.raises(CheckpointError, match=r"s_recycle.weight \(3, 3\) != \(64, 64\)"):
        Boltz2.from_checkpoint(save_lightning_checkpoint(tmp_path / "shape.ckpt", reshaped))


class _RunsShellCommand:
    """A pickle payload: unpickling it would call os.system(...)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


class _CallsEval:
    def __reduce__(self):
        return eval, ("__import__('pathlib').Path('EVAL_RAN').touch()",)


@pytest.mark.parametrize("payload_kind", ["os.system", "eval"])
def test_pickle_payload_is_refused_without_running(tmp_path, weights, payload_kind, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "PWNED"
    payload = _RunsShellCommand(f"touch {marker}") if payload_kind == "os.system" else _CallsEval()
    path = save_lightning_checkpoint(tmp_path / "evil.ckpt", weights, extra={"callbacks": {"x": payload}})
    with pytest.raises(CheckpointError, match="refusing to load") as error:
        Boltz2.from_checkpoint(path)
    assert payload_kind.split(".")[-1] in str(error.value)
    assert not marker.exists() and not (tmp_path / "EVAL_RAN").exists()


def test_raw_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "PWNED"
    path = tmp_path / "weights.pkl"
    path.write_bytes(pickle.dumps({"state_dict": _RunsShellCommand(f"touch {marker}")}))
    with pytest.raises(CheckpointError, match="not a PyTorch zip-format weights file"):
        Boltz2.from_checkpoint(path)
    assert not marker.exists()


def test_unreadable_files_fail_cleanly(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        Boltz2.from_checkpoint(tmp_path / "missing.ckpt")
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="not a PyTorch zip-format weights file"):
        Boltz2.from_checkpoint(garbage)
    no_weights = tmp_path / "empty.ckpt"
    torch.save({"epoch": 1}, no_weights)
    with pytest.raises(CheckpointError, match="holds no state_dict"):
        Boltz2.from_checkpoint(no_weights)


def test_published_architecture_has_the_checkpoint_layout():
    """The default config builds exactly as many tensors and values as the published model."""
    with torch.device("meta"):
        model = Boltz2(Boltz2Config())
    state = model.state_dict()
    assert len(state) == PUBLISHED_TENSORS
    assert sum(t.numel() for t in state.values()) == PUBLISHED_VALUES
    state["confidence_module.boundaries"] = torch.linspace(2, 22, 63)  # meta tensors hold no values
    assert config_from_state_dict(state) == Boltz2Config()


def test_model_imports_without_cuequivariance(tmp_path):
    """foldmill.model never needs cuEquivariance ops (CPU machines have none)."""
    script = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.startswith('cuequivariance'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import foldmill.model\n"
        "from foldmill.model import demo_model\n"
        "demo_model()\n"
        "assert not any(m.startswith('cuequivariance') for m in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_check_checkpoint_validates_keys_and_shapes_without_building_weights(tmp_path, weights):
    from foldmill.model.checkpoint import check_checkpoint

    summary = check_checkpoint(save_lightning_checkpoint(tmp_path / "ok.ckpt", weights))
    assert f"{len(weights)} tensors" in summary and "keys and shapes match" in summary
    reshaped = dict(weights, **{"s_recycle.weight": torch.zeros(3, 3)})
    with pytest.raises(CheckpointError, match=r"s_recycle.weight \(3, 3\) != \(64, 64\)"):
        check_checkpoint(save_lightning_checkpoint(tmp_path / "shape.ckpt", reshaped))
    with pytest.raises(CheckpointError, match="checkpoint file not found"):
        check_checkpoint(tmp_path / "absent.ckpt")
    (tmp_path / "garbage.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a PyTorch zip-format weights file"):
        check_checkpoint(tmp_path / "garbage.ckpt")
