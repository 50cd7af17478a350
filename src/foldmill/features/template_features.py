"""Template features: one template row per template structure file, covering every query chain
aligned to that file (as OSS Boltz-2 groups them).

Per-residue arrays come from `foldmill.features.template_residues.template_features`; here they are
placed on the chains' tokens, and the cross-chain parts are added: `visibility_ids` (the row's
index on chains it templates, -1 - asym_id elsewhere, so chains templated by one structure see
each other's relative geometry), `template_force` and `template_force_threshold`.
Without templates the model gets one all-zero template row, and no force features.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.functional import one_hot

from foldmill.features.template_residues import template_features as residue_template_features
from foldmill.features.tokenize import Tokenized
from foldmill.templates.types import TemplateAlignment
from foldmill.vocab import NUM_TOKENS

_PER_TOKEN = (
    "template_frame_rot", "template_frame_t", "template_cb", "template_ca",
    "template_mask_cb", "template_mask_frame", "template_mask", "query_to_template",
)  # fmt: skip


@dataclass(frozen=True)
class ChainTemplate:
    """A template alignment for one query chain, with the user's force settings."""

    chain_id: str
    alignment: TemplateAlignment
    force: bool = False
    threshold: float | None = None


def template_features(tokenized: Tokenized, templates: list[ChainTemplate]) -> dict[str, torch.Tensor]:
    n_tokens = len(tokenized.tokens)
    if not templates:
        return _empty_rows(1, n_tokens)
    rows: dict[str, list[ChainTemplate]] = {}
    for template in templates:
        rows.setdefault(template.alignment.source, []).append(template)
    features = _empty_rows(len(rows), n_tokens)
    restype = np.zeros((len(rows), n_tokens), dtype=np.int64)
    visibility = -1.0 - tokenized.tokens.asym_id.astype(np.float32)
    features["visibility_ids"] = torch.from_numpy(np.tile(visibility, (len(rows), 1)))
    force, threshold = [], []
    for row, members in enumerate(rows.values()):
        for member in members:
            chain = tokenized.structure.chain_by_name[member.chain_id]
            on_chain = np.flatnonzero(tokenized.tokens.asym_id == chain.asym_id)
            aligned = member.alignment.query_index
            templated = torch.from_numpy(on_chain[aligned])  # polymer chains: one token per residue
            values = residue_template_features([member.alignment], len(chain.residues))
            restype[row, on_chain[aligned]] = values["template_restype_ids"][0, aligned]
            for key in _PER_TOKEN:
                features[key][row, templated] = torch.from_numpy(values[key][0, aligned]).to(features[key].dtype)
            if len(aligned):
                features["visibility_ids"][row, torch.from_numpy(on_chain)] = float(row)
        force.append(members[-1].force)
        threshold.append(members[-1].threshold if members[-1].threshold is not None else float("inf"))
    features["template_restype"] = one_hot(torch.from_numpy(restype), NUM_TOKENS)
    features["template_force"] = torch.tensor(force, dtype=torch.bool)
    features["template_force_threshold"] = torch.tensor(threshold, dtype=torch.float32)
    return features


def _empty_rows(n_rows: int, n_tokens: int) -> dict[str, torch.Tensor]:
    zeros = lambda *shape, dtype=torch.float32: torch.zeros(n_rows, n_tokens, *shape, dtype=dtype)  # noqa: E731
    return {
        "template_restype": one_hot(torch.zeros(n_rows, n_tokens, dtype=torch.long), NUM_TOKENS),
        "template_frame_rot": zeros(3, 3),
        "template_frame_t": zeros(3),
        "template_cb": zeros(3),
        "template_ca": zeros(3),
        "template_mask_cb": zeros(),
        "template_mask_frame": zeros(),
        "template_mask": zeros(),
        "query_to_template": zeros(dtype=torch.long),
        "visibility_ids": zeros(),
    }
