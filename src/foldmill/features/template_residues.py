"""Boltz-2 template feature arrays of one query chain from its template alignments.

`template_features(alignments, query_length)` returns, for T = len(alignments) templates and
L = query_length residues (T x L leading dimensions; query residues a template does not cover
stay zero, as in Boltz-2):

  template_restype_ids (T, L) int64    vocabulary class (`foldmill.vocab.TOKEN_ID`) of the
                                       aligned template residue; 0 (<pad>) where not aligned.
                                       One-hot it (33 classes) for Boltz-2's `template_restype`.
  template_frame_rot   (T, L, 3, 3)    backbone frame, columns e1, e2, e3: e1 = unit(C - CA),
                                       e2 = unit(N - CA minus its e1 component), e3 = e1 x e2.
                                       Identity for aligned residues lacking N/CA/C, zero elsewhere.
  template_frame_t     (T, L, 3)       CA (the frame origin)
  template_cb          (T, L, 3)       CB, or CA for glycine (Boltz's distogram atom)
  template_ca          (T, L, 3)       CA
  template_mask_frame  (T, L) float32  N, CA and C resolved
  template_mask_cb     (T, L) float32  the distogram atom resolved
  template_mask        (T, L) float32  1 where the query residue is aligned to the template
  query_to_template    (T, L) int64    template sequence position of the aligned residue
                                       (Boltz-2 leaves this zero; the model does not read it)

Per-chain only: across chains the featurizer concatenates these, sets `visibility_ids` (the same
id for chains templated by the same structure) and adds `template_force`/`threshold`.
Modified template residues take their parent's class (MSE -> MET, SEP -> SER); Boltz-2 maps
only MSE and otherwise drops them from the template.
"""

from __future__ import annotations

import numpy as np

from foldmill.templates.structure import one_letter
from foldmill.templates.types import TemplateAlignment
from foldmill.vocab import TOKEN_ID, residue_name

N, CA, C, CB = range(4)
_GLYCINE = TOKEN_ID["GLY"]
_EPSILON = 1e-10


def residue_class(name: str) -> int:
    """Vocabulary class of a template residue name (standard, else its parent's, else UNK)."""
    if name in TOKEN_ID:
        return TOKEN_ID[name]
    return TOKEN_ID[residue_name("protein", one_letter(name))]


def backbone_frames(n: np.ndarray, ca: np.ndarray, c: np.ndarray) -> np.ndarray:
    """(..., 3, 3) rotations from N, CA, C coordinates (..., 3); see the module docstring."""
    e1 = c - ca
    e1 = e1 / (np.linalg.norm(e1, axis=-1, keepdims=True) + _EPSILON)
    v2 = n - ca
    u2 = v2 - e1 * np.sum(e1 * v2, axis=-1, keepdims=True)
    e2 = u2 / (np.linalg.norm(u2, axis=-1, keepdims=True) + _EPSILON)
    e3 = np.cross(e1, e2)
    return np.stack([e1, e2, e3], axis=-1)


def template_features(alignments: list[TemplateAlignment], query_length: int) -> dict[str, np.ndarray]:
    """The template feature arrays of one query chain (see the module docstring)."""
    t, length = len(alignments), query_length
    features = {
        "template_restype_ids": np.zeros((t, length), dtype=np.int64),
        "template_frame_rot": np.zeros((t, length, 3, 3), dtype=np.float32),
        "template_frame_t": np.zeros((t, length, 3), dtype=np.float32),
        "template_cb": np.zeros((t, length, 3), dtype=np.float32),
        "template_ca": np.zeros((t, length, 3), dtype=np.float32),
        "template_mask_frame": np.zeros((t, length), dtype=np.float32),
        "template_mask_cb": np.zeros((t, length), dtype=np.float32),
        "template_mask": np.zeros((t, length), dtype=np.float32),
        "query_to_template": np.zeros((t, length), dtype=np.int64),
    }
    for k, alignment in enumerate(alignments):
        q = alignment.query_index
        if len(q) and (q.min() < 0 or q.max() >= length):
            raise ValueError(f"template {alignment.template_id} maps residues outside a query of length {length}")
        coords = alignment.coords.astype(np.float64)
        mask = alignment.atom_mask
        classes = np.array([residue_class(str(name)) for name in alignment.template_residue_names], dtype=np.int64)
        glycine = classes == _GLYCINE
        has_frame = mask[:, N] & mask[:, CA] & mask[:, C]
        rotations = np.broadcast_to(np.eye(3), (len(q), 3, 3)).copy()
        rotations[has_frame] = backbone_frames(coords[has_frame, N], coords[has_frame, CA], coords[has_frame, C])
        features["template_restype_ids"][k, q] = classes
        features["template_frame_rot"][k, q] = rotations
        features["template_frame_t"][k, q] = np.where(has_frame[:, None], coords[:, CA], 0.0)
        features["template_ca"][k, q] = coords[:, CA]
        features["template_cb"][k, q] = np.where(glycine[:, None], coords[:, CA], coords[:, CB])
        features["template_mask_frame"][k, q] = has_frame
        features["template_mask_cb"][k, q] = np.where(glycine, mask[:, CA], mask[:, CB])
        features["template_mask"][k, q] = 1.0
        features["query_to_template"][k, q] = alignment.template_index
    return features
