"""Sequence-local atom attention, AF3 Algorithms 5, 6 and 7 (Boltz-2 variant).

Atoms (padded to a multiple of 32) are cut into windows of W=32 query atoms; each window
attends to H=128 key atoms centred on it (48 atoms either side, zeros past the ends).

- AtomEncoder: per-atom features -> single atom features q, c (B, N, atom_s) and windowed
  atom-pair features p (B, N/W, W, H, atom_z). With `structure_prediction` it also adds the
  trunk's s (to c) and a conditioned z (to p); that variant lives in diffusion conditioning.
- AtomTransformer: a DiffusionTransformer run window by window.
- AtomAttentionEncoder: atom transformer, then atoms averaged into tokens (B, T, token width);
  in the score model, noisy coordinates enter through r_to_q_trans.
- AtomAttentionDecoder: token activations broadcast back to atoms, atom transformer,
  per-atom coordinate update (B, N, 3).

Atom-token maps come in as the one-hot feats["atom_to_token"] (B, N, T). Parameter names
match the Boltz-2 checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from foldmill.model.diffusion_transformer import DiffusionTransformer, KeyWindows
from foldmill.model.layers.layer_norm import LayerNorm

# Characters of an atom name (4) x 64 classes, flattened into the atom features.
ATOM_NAME_FEATURES = 4 * 64


@dataclass(frozen=True)
class AtomWindows:
    """Query windows of `queries` atoms and their centred key windows of `keys` atoms."""

    queries: int = 32
    keys: int = 128

    def key_window(self, x: Tensor) -> Tensor:
        """(B, N, ...) -> (B, N/queries, keys, ...): each query window's keys, zero beyond the ends."""
        margin = (self.keys - self.queries) // 2
        trailing = x.dim() - 2
        padded = F.pad(x, (0, 0) * trailing + (margin, margin))
        windows = padded.unfold(1, self.keys, self.queries)  # (B, K, ..., keys)
        return windows.movedim(-1, 2)

    def row_key_window(self, batch: int) -> KeyWindows:
        """The same map for tensors already cut into rows of query windows: (batch*K, W, D) -> (batch*K, H, D)."""

        def keys_of_rows(x: Tensor) -> Tensor:
            rows, width = x.shape[:2]
            flat = x.reshape(batch, (rows // batch) * width, -1)
            return self.key_window(flat).reshape(rows, self.keys, -1)

        return keys_of_rows


def atom_token_index(atom_to_token: Tensor) -> tuple[Tensor, Tensor]:
    """One-hot (B, N, T) -> token index of each atom (B, N) and whether it has one (B, N) float."""
    return atom_to_token.argmax(dim=-1), atom_to_token.sum(dim=-1).clamp(max=1).float()


def broadcast_tokens_to_atoms(values: Tensor, atom_to_token: Tensor) -> Tensor:
    """Token values (B, T, D) -> atom values (B, N, D); zero for padding atoms (no token)."""
    index, has_token = atom_token_index(atom_to_token)
    gathered = torch.gather(values, 1, index.unsqueeze(-1).expand(-1, -1, values.shape[-1]))
    return gathered * has_token.unsqueeze(-1).to(values)


def mean_atoms_per_token(atom_values: Tensor, atom_to_token: Tensor) -> Tensor:
    """Atom values (B, N, D) -> mean over each token's atoms (B, T, D)."""
    atom_to_token = atom_to_token.float()
    weights = atom_to_token / (atom_to_token.sum(dim=1, keepdim=True) + 1e-6)
    return torch.bmm(weights.transpose(1, 2), atom_values.float())


class AtomEncoder(nn.Module):
    """Embeds reference-conformer atom features into q, c and windowed pair features p."""

    def __init__(
        self,
        atom_s: int,
        atom_z: int,
        token_s: int,
        token_z: int,
        atoms_per_window_queries: int,
        atoms_per_window_keys: int,
        atom_feature_dim: int,
        structure_prediction: bool = True,
    ) -> None:
        super().__init__()
        self.windows = AtomWindows(atoms_per_window_queries, atoms_per_window_keys)
        self.structure_prediction = structure_prediction
        self.embed_atom_features = nn.Linear(atom_feature_dim, atom_s)
        self.embed_atompair_ref_pos = nn.Linear(3, atom_z, bias=False)
        self.embed_atompair_ref_dist = nn.Linear(1, atom_z, bias=False)
        self.embed_atompair_mask = nn.Linear(1, atom_z, bias=False)
        if structure_prediction:
            self.s_to_c_trans = nn.Sequential(LayerNorm(token_s), nn.Linear(token_s, atom_s, bias=False))
            self.z_to_p_trans = nn.Sequential(LayerNorm(token_z), nn.Linear(token_z, atom_z, bias=False))
        self.c_to_p_trans_k = nn.Sequential(nn.ReLU(), nn.Linear(atom_s, atom_z, bias=False))
        self.c_to_p_trans_q = nn.Sequential(nn.ReLU(), nn.Linear(atom_s, atom_z, bias=False))
        self.p_mlp = nn.Sequential(
            nn.ReLU(),
            nn.Linear(atom_z, atom_z, bias=False),
            nn.ReLU(),
            nn.Linear(atom_z, atom_z, bias=False),
            nn.ReLU(),
            nn.Linear(atom_z, atom_z, bias=False),
        )

    def forward(
        self, feats: dict[str, Tensor], s_trunk: Tensor | None = None, z: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Returns q, c (B, N, atom_s) and p (B, K, W, H, atom_z); s_trunk and z only with structure_prediction."""
        ref_pos = feats["ref_pos"].float()
        batch, num_atoms, _ = ref_pos.shape
        windows = self.windows
        num_windows = num_atoms // windows.queries
        atom_mask = feats["atom_pad_mask"].bool()
        space_uid = feats["ref_space_uid"]

        atom_features = torch.cat(
            [
                ref_pos,
                feats["ref_charge"].float().unsqueeze(-1),
                feats["ref_element"].float(),
                feats["ref_atom_name_chars"].float().reshape(batch, num_atoms, ATOM_NAME_FEATURES),
            ],
            dim=-1,
        )
        c = self.embed_atom_features(atom_features)

        # Pair features of each query atom with its window's key atoms, kept only for atom
        # pairs of the same reference conformer (same residue / ligand).
        query_shape = (batch, num_windows, windows.queries, 1)
        key_shape = (batch, num_windows, 1, windows.keys)
        offset = windows.key_window(ref_pos).reshape(*key_shape, 3) - ref_pos.view(*query_shape, 3)
        inverse_sq_dist = 1 / (1 + torch.sum(offset * offset, dim=-1, keepdim=True))
        same_conformer = (
            atom_mask.view(query_shape)
            & windows.key_window(atom_mask).reshape(key_shape)
            & (space_uid.view(query_shape) == windows.key_window(space_uid).reshape(key_shape))
        )
        valid = same_conformer.float().unsqueeze(-1)
        p = self.embed_atompair_ref_pos(offset) * valid
        p = p + self.embed_atompair_ref_dist(inverse_sq_dist) * valid
        p = p + self.embed_atompair_mask(valid) * valid

        q = c
        if self.structure_prediction:
            atom_to_token = feats["atom_to_token"]
            c = c + broadcast_tokens_to_atoms(self.s_to_c_trans(s_trunk.float()), atom_to_token)
            p = p + self._pair_from_tokens(z, atom_to_token, lambda pairs: self.z_to_p_trans(pairs.float()))

        p = p + self.c_to_p_trans_q(c.view(batch, num_windows, windows.queries, 1, c.shape[-1]))
        p = p + self.c_to_p_trans_k(windows.key_window(c).reshape(batch, num_windows, 1, windows.keys, c.shape[-1]))
        p = p + self.p_mlp(p)
        return q, c, p

    def _pair_from_tokens(self, z: Tensor, atom_to_token: Tensor, transform: Callable[[Tensor], Tensor]) -> Tensor:
        """`transform` of the token-pair values (B, T, T, C) at the windowed atom pairs -> (B, K, W, H, D).

        `transform` acts on each pair alone, so it runs on whichever is smaller: the token pairs
        before the gather, or the gathered atom pairs (large inputs: in fp32 the whole pair tensor
        would be 17 GiB at 6,000 tokens, the atom pairs about a tenth of that).
        """
        batch, num_tokens = z.shape[:2]
        windows = self.windows
        index, has_token = atom_token_index(atom_to_token)
        query_index = index.view(batch, -1, windows.queries, 1)
        key_index = windows.key_window(index).unsqueeze(2)
        pair_index = (query_index * num_tokens + key_index).flatten(1)  # (B, K*W*H)
        transform_first = num_tokens * num_tokens <= pair_index.shape[1]
        if transform_first:
            z = transform(z)
        values = torch.gather(z.reshape(batch, num_tokens * num_tokens, -1), 1,
                              pair_index.unsqueeze(-1).expand(-1, -1, z.shape[-1]))
        if not transform_first:
            values = transform(values)
        values = values.view(*query_index.shape[:3], windows.keys, -1)
        # Padding atoms and keys beyond the ends have no token: zero.
        query_valid = has_token.view(batch, -1, windows.queries, 1, 1)
        key_valid = windows.key_window(has_token).reshape(batch, -1, 1, windows.keys, 1)
        return values * query_valid.to(values) * key_valid.to(values)


class AtomTransformer(nn.Module):
    """DiffusionTransformer over atoms, query window by query window."""

    def __init__(self, attn_window_queries: int, attn_window_keys: int, depth: int, heads: int, dim: int) -> None:
        super().__init__()
        self.windows = AtomWindows(attn_window_queries, attn_window_keys)
        self.diffusion_transformer = DiffusionTransformer(depth=depth, heads=heads, dim=dim, dim_single_cond=dim)

    def forward(self, q: Tensor, c: Tensor, bias: Tensor, mask: Tensor, multiplicity: int = 1) -> Tensor:
        """q, c: (B*M, N, dim); bias: (B, K, W, H, depth*heads) shared by the M samples; mask: (B*M, N)."""
        batch, num_atoms, dim = q.shape
        rows = batch * (num_atoms // self.windows.queries)
        bias = bias.repeat_interleave(multiplicity, 0)
        q = self.diffusion_transformer(
            a=q.view(rows, self.windows.queries, -1),
            s=c.view(rows, self.windows.queries, -1),
            bias=bias.view(rows, self.windows.queries, self.windows.keys, -1),
            mask=mask.view(rows, self.windows.queries).float(),
            key_windows=self.windows.row_key_window(batch),
        )
        return q.view(batch, num_atoms, dim)


class AtomAttentionEncoder(nn.Module):
    """Atom transformer over q (optionally with noisy coordinates added), then atoms -> tokens."""

    def __init__(
        self,
        atom_s: int,
        token_s: int,
        atoms_per_window_queries: int,
        atoms_per_window_keys: int,
        atom_encoder_depth: int = 3,
        atom_encoder_heads: int = 4,
        structure_prediction: bool = True,
    ) -> None:
        super().__init__()
        self.structure_prediction = structure_prediction
        if structure_prediction:
            self.r_to_q_trans = nn.Linear(3, atom_s, bias=False)
        self.atom_encoder = AtomTransformer(
            attn_window_queries=atoms_per_window_queries,
            attn_window_keys=atoms_per_window_keys,
            depth=atom_encoder_depth,
            heads=atom_encoder_heads,
            dim=atom_s,
        )
        token_width = 2 * token_s if structure_prediction else token_s
        self.atom_to_token_trans = nn.Sequential(nn.Linear(atom_s, token_width, bias=False), nn.ReLU())

    def forward(
        self,
        feats: dict[str, Tensor],
        q: Tensor,
        c: Tensor,
        bias: Tensor,
        r: Tensor | None = None,
        multiplicity: int = 1,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Returns token activations a (B*M, T, width) and the atom-level q, c for the decoder's skip."""
        if self.structure_prediction:
            q = q.repeat_interleave(multiplicity, 0) + self.r_to_q_trans(r)
        c = c.repeat_interleave(multiplicity, 0)
        atom_mask = feats["atom_pad_mask"].bool().repeat_interleave(multiplicity, 0)
        q = self.atom_encoder(q=q, c=c, bias=bias, mask=atom_mask, multiplicity=multiplicity)
        atom_to_token = feats["atom_to_token"].repeat_interleave(multiplicity, 0)
        a = mean_atoms_per_token(self.atom_to_token_trans(q), atom_to_token)
        return a.to(q), q, c


class AtomAttentionDecoder(nn.Module):
    """Token activations -> atoms (skip-connected to the encoder's q, c) -> coordinate updates."""

    def __init__(
        self,
        atom_s: int,
        token_s: int,
        attn_window_queries: int,
        attn_window_keys: int,
        atom_decoder_depth: int = 3,
        atom_decoder_heads: int = 4,
    ) -> None:
        super().__init__()
        self.a_to_q_trans = nn.Linear(2 * token_s, atom_s, bias=False)
        self.atom_decoder = AtomTransformer(
            attn_window_queries=attn_window_queries,
            attn_window_keys=attn_window_keys,
            depth=atom_decoder_depth,
            heads=atom_decoder_heads,
            dim=atom_s,
        )
        self.atom_feat_to_atom_pos_update = nn.Sequential(LayerNorm(atom_s), nn.Linear(atom_s, 3, bias=False))

    def forward(
        self, a: Tensor, q: Tensor, c: Tensor, bias: Tensor, feats: dict[str, Tensor], multiplicity: int = 1
    ) -> Tensor:
        """a: (B*M, T, 2*token_s); q, c: (B*M, N, atom_s) -> coordinate update (B*M, N, 3)."""
        atom_to_token = feats["atom_to_token"].repeat_interleave(multiplicity, 0)
        q = q + broadcast_tokens_to_atoms(self.a_to_q_trans(a.float()), atom_to_token).to(q)
        atom_mask = feats["atom_pad_mask"].repeat_interleave(multiplicity, 0)
        q = self.atom_decoder(q=q, c=c, bias=bias, mask=atom_mask, multiplicity=multiplicity)
        return self.atom_feat_to_atom_pos_update(q)
