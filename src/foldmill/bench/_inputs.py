"""Synthetic benchmark inputs for `foldmill bench forward`: random proteins, featurized once, stored compactly.

An input spec is a comma-separated list of items `LENGTHS[@DEPTH]`: LENGTHS is one chain length
(`300`) or copies x length (`2x300`) or lengths joined by `+` (`300+120`); DEPTH is the depth of
a synthetic MSA per chain (query + mutated copies, 0 or absent = single sequence). Example:
`150,2x197@256,700`. Sequences and MSAs are seeded by the item, so every machine builds the same
features. Features are written as compressed .npz (one-hot tensors compress to almost nothing)
and read back with allow_pickle=False, so a GPU machine without the featurizer's chemistry
libraries can load them.
"""

from __future__ import annotations

import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from foldmill.bench._synthetic import AMINO_ACIDS, synthetic_msa
from foldmill.errors import FoldmillError


@dataclass(frozen=True)
class BenchInput:
    chain_lengths: tuple[int, ...]
    msa_depth: int = 0

    @property
    def name(self) -> str:
        lengths = "+".join(map(str, self.chain_lengths))
        if len(set(self.chain_lengths)) == 1 and len(self.chain_lengths) > 1:
            lengths = f"{len(self.chain_lengths)}x{self.chain_lengths[0]}"
        return lengths + (f"@{self.msa_depth}" if self.msa_depth else "")

    @property
    def kind(self) -> str:
        return "monomer" if len(self.chain_lengths) == 1 else f"{len(self.chain_lengths)}-mer"

    @property
    def tokens(self) -> int:
        return sum(self.chain_lengths)


def parse_inputs(spec: str) -> list[BenchInput]:
    inputs = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        lengths_text, _, depth_text = item.partition("@")
        try:
            if "x" in lengths_text:
                copies, length = lengths_text.split("x")
                lengths = (int(length),) * int(copies)
            else:
                lengths = tuple(int(length) for length in lengths_text.split("+"))
            depth = int(depth_text) if depth_text else 0
        except ValueError:
            raise FoldmillError(f"bad benchmark input {item!r}: expected LENGTHS[@DEPTH], e.g. 2x300@256") from None
        if not lengths or min(lengths) < 1 or depth < 0:
            raise FoldmillError(f"bad benchmark input {item!r}: lengths must be >= 1, depth >= 0")
        inputs.append(BenchInput(lengths, depth))
    return inputs


def featurize_input(item: BenchInput) -> dict[str, Tensor]:
    """The Boltz-2 feature dict (batch 1) of a synthetic input, via foldmill.features."""
    from foldmill.features import featurize
    from foldmill.io.targets import Entity, Target

    rng = np.random.default_rng(zlib.crc32(item.name.encode()))
    with tempfile.TemporaryDirectory() as scratch:
        entities = []
        for index, length in enumerate(item.chain_lengths):
            sequence = "".join(rng.choice(AMINO_ACIDS, size=length))
            msa = "empty"
            if item.msa_depth > 1:
                msa = str(Path(scratch) / f"chain{index}.a3m")
                Path(msa).write_text(synthetic_msa(sequence, item.msa_depth, rng))
            entities.append(Entity("protein", (chr(ord("A") + index),), sequence=sequence, msa=msa))
        target = Target(item.name, tuple(entities), source="bench", record=item.name)
        return featurize(target, seed=0).features


def feature_path(directory: Path, item: BenchInput) -> Path:
    return directory / f"features_{item.name.replace('+', 'p').replace('@', '_msa')}.npz"


def save_features(path: Path, features: dict[str, Tensor]) -> None:
    from foldmill.io.atomic import atomic_path

    with atomic_path(path) as temporary, open(temporary, "wb") as handle:
        np.savez_compressed(handle, **{name: value.numpy() for name, value in features.items()})


def load_features(path: Path, device: str | torch.device = "cpu") -> dict[str, Tensor]:
    with np.load(path, allow_pickle=False) as data:
        return {name: torch.from_numpy(data[name]).to(device) for name in data.files}


def get_features(item: BenchInput, directory: Path | None, device: str | torch.device) -> dict[str, Tensor]:
    """Stored features of `item` if `directory` holds them, else featurized now (and stored there), on
    `device` without the training-only ones (the distogram target is 8.6 GiB at 6,000 tokens; no
    contender's inference reads it). Featurizing is quadratic in memory (2,000 tokens: 3.4 s, 3.3 GiB
    of RAM on CPU), so a 6,000-token monomer needs ~30 GiB: featurize it on the GPU machine."""
    from foldmill.fastpath.runner import inference_features

    path = feature_path(directory, item) if directory is not None else None
    stored = path is not None and path.is_file()
    features = load_features(path) if stored else featurize_input(item)
    features = inference_features(features)
    if path is not None and not stored:  # without the training-only ones (64 of the 81 MB compressed at 6,000 tokens)
        save_features(path, features)
    return {name: value.to(device) for name, value in features.items()}
