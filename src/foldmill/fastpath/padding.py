"""Token padding of a Boltz-2 feature dict to a multiple of 8 (tensor-core friendly pair shapes).

Padded tokens are what a batch collate adds: zeros everywhere, token_pad_mask 0, no atoms, so
every token mixing op masks them out and the real tokens' results do not change (up to
summation order). Predictions are cropped back with `crop_token_outputs`.

Token axes per feature name (the Boltz-2 feature spec, batch axis 0). A feature not listed has
no token axis (atom features, constraint index lists, ...).
"""

from __future__ import annotations

from torch import Tensor
from torch.nn import functional as F

TOKEN_AXES: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(
        (
            "token_index", "residue_index", "asym_id", "entity_id", "sym_id", "mol_type", "res_type",
            "disto_center", "token_pad_mask", "token_resolved_mask", "token_disto_mask", "method_feature",
            "modified", "cyclic_period", "affinity_token_mask", "token_to_rep_atom", "r_set_to_rep_atom",
            "token_to_center_atom", "deletion_mean", "profile",
        ),
        (1,),
    ),
    **dict.fromkeys(("token_bonds", "type_bonds", "contact_conditioning", "contact_threshold", "disto_target"), (1, 2)),
    **dict.fromkeys(
        (
            "atom_to_token", "disto_coords_ensemble", "frames_idx", "frame_resolved_mask", "msa", "msa_paired",
            "deletion_value", "has_deletion", "msa_mask", "template_restype", "template_frame_rot",
            "template_frame_t", "template_cb", "template_ca", "template_mask_cb", "template_mask_frame",
            "template_mask", "query_to_template", "visibility_ids",
        ),
        (2,),
    ),
}  # fmt: skip

# Prediction outputs (foldmill.model.boltz2) with token axes.
OUTPUT_TOKEN_AXES: dict[str, tuple[int, ...]] = {
    "s": (1,),
    "z": (1, 2),
    "pdistogram": (1, 2),
    "pbfactor": (1,),
    "plddt": (1,),
    "pae": (1, 2),
    "pde": (1, 2),
}


def padded_size(num_tokens: int, multiple: int) -> int:
    return -(-num_tokens // multiple) * multiple


def _pad_axes(value: Tensor, axes: tuple[int, ...], size: int) -> Tensor:
    pads = [0, 0] * value.dim()
    for axis in axes:
        pads[2 * (value.dim() - 1 - axis) + 1] = size - value.shape[axis]  # F.pad counts from the last axis
    return F.pad(value, pads) if any(pads) else value


def pad_token_features(feats: dict[str, Tensor], multiple: int) -> tuple[dict[str, Tensor], int]:
    """Features with the token axis padded to a multiple of `multiple`; returns them and the real token count."""
    num_tokens = feats["token_pad_mask"].shape[1]
    size = padded_size(num_tokens, multiple)
    if size == num_tokens:
        return feats, num_tokens
    padded = {
        name: _pad_axes(value, TOKEN_AXES[name], size) if name in TOKEN_AXES else value for name, value in feats.items()
    }
    return padded, num_tokens


def crop_token_outputs(out: dict[str, Tensor], num_tokens: int) -> dict[str, Tensor]:
    """Prediction outputs cut back to the real tokens."""
    cropped = dict(out)
    for name, axes in OUTPUT_TOKEN_AXES.items():
        if name in cropped:
            value = cropped[name]
            for axis in axes:
                value = value.narrow(axis, 0, num_tokens)
            cropped[name] = value
    return cropped
