"""The diffusion score model restructured for sampling: the same function, less work per step.

`FastScoreModel(score_model)` computes what `DiffusionModule.forward` computes (foldmill.model.
diffusion) for the M samples of a sampling run, from the same weights, with three changes of
schedule that the reference's module boundaries hide:

- Work no step changes is done once per sampling run (`prepare` -> `ScorePlan`): the atom
  transformers' AdaLN scales/shifts and output gates depend only on the conditioning c, so all
  of them are computed once (the reference recomputes them for every sample at every step); the
  attention biases get their key masks folded in once (the reference adds the mask to every
  layer's bias at every step), the atom biases already laid out per sample row; the atom <-> token
  maps become index tables (the reference rebuilds a (B*M, N, T) fp32 one-hot product per step).
- Work shared by the samples is done once per record: the single conditioning s depends on the
  noise level and the trunk only, so it and every token-transformer layer's s terms are computed
  for B rows instead of B*M, each set of terms (24 layers x 6) by one matrix product, with the
  s_norm weights folded into the projections.
- Per layer, the elementwise chains become single kernels (foldmill.model.layers.modulation:
  LayerNorm * scale + shift, the SwiGLU product; gated residual adds in place), and the q/k/v/g
  and swish/a_to_b projections are one matrix product each.

The result equals the reference up to rounding (tests/test_fast_score.py: fp32 on the CPU, and bf16
on the GPU). The plan reads the conditioning's tensors in place and masks the token
transformer's bias in place: the conditioning is the plan's from then on (FastBoltz2 makes one per
prediction and drops it after sampling). Weights are read when the FastScoreModel is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from foldmill import kernels
from foldmill.model.atom_attention import AtomWindows, atom_token_index, mean_atoms_per_token
from foldmill.model.diffusion import DiffusionModule
from foldmill.model.diffusion_conditioning import DiffusionConditioningOutput
from foldmill.model.diffusion_transformer import DiffusionTransformerLayer
from foldmill.model.layers.modulation import gated_add_, gated_product, modulate, residual_modulate

# Logit added for masked keys: the reference adds -1e6 * (1 - mask) (AttentionPairBias.inf); any
# value this low gives those keys a weight of exactly 0 in fp32.
MASKED_KEY_BIAS = -1e6


@dataclass
class ScorePlan:
    """What the score model reads that no sampling step changes, for `samples` samples per record.

    Shapes: B records, T tokens, N atoms (K = N / W windows of W queries and H keys), D widths.
    """

    samples: int
    embedded_trunk: Tensor  # (B, T, 2*token_s): SingleConditioning.embed_trunk, once per record
    q: Tensor  # (B, N, atom_s) fp32: the atom encoder's input q
    encoder_terms: Tensor  # (B, N, 2, depth, 2, atom_s): [scale | shift] x layer x [attention | transition]
    encoder_gates: Tensor  # (B, N, depth, 2, atom_s): output gates, after their sigmoid
    encoder_bias: Tensor  # (depth, B*M*K, heads, W, H): per sample row, key mask folded in
    decoder_terms: Tensor
    decoder_gates: Tensor
    decoder_bias: Tensor
    token_bias: Tensor  # (B, depth, heads, T, T), key mask folded in (the conditioning's storage)
    atom_index: Tensor  # (B, N) int64: the token of each atom (0 where none)
    atom_has_token: Tensor  # (B, N, 1) in the compute dtype
    token_starts: Tensor  # (B, T + 1) int32: token t's atoms are token_starts[t]:token_starts[t+1]
    token_inverse_counts: Tensor  # (B, T) fp32: 1 / (atoms + 1e-6), as the reference's mean
    max_atoms: int  # most atoms of one token; 0: atoms are not contiguous per token (dense mean)
    atom_to_token: Tensor  # (B, N, T) one-hot, for the dense mean only


class ConditioningTerms(nn.Module):
    """The s-dependent terms of a stack of DiffusionTransformerLayers, from two matrix products.

    Per layer: AdaLN scale (through its sigmoid) and shift, for the attention and for the
    transition, and both output gates (through their sigmoid). s_norm(s) = LN(s) * w, so
    W @ s_norm(s) = (W * w) @ LN(s): the norm weights are folded into the projections.
    """

    @torch.no_grad()  # copies of inference weights: no autograd history
    def __init__(self, layers: list[DiffusionTransformerLayer]) -> None:
        super().__init__()
        adalns = [(layer.adaln, layer.transition.adaln) for layer in layers]
        dtype = layers[0].adaln.s_scale.weight.dtype

        def folded(linear: nn.Linear, norm: nn.LayerNorm) -> Tensor:
            return linear.weight.float() * norm.weight.float()[None, :]

        scales = [folded(adaln.s_scale, adaln.s_norm) for pair in adalns for adaln in pair]
        shifts = [folded(adaln.s_bias, adaln.s_norm) for pair in adalns for adaln in pair]
        scale_bias = [adaln.s_scale.bias.float() for pair in adalns for adaln in pair]
        gates = [(layer.output_projection_linear, layer.transition.output_projection[0]) for layer in layers]
        self.depth, self.width = len(layers), layers[0].adaln.s_scale.weight.shape[0]
        self.eps = layers[0].adaln.s_norm.eps
        self.register_buffer("norm_weight", torch.cat(scales + shifts).to(dtype), persistent=False)
        self.register_buffer(
            "norm_bias", torch.cat(scale_bias + [torch.zeros_like(b) for b in scale_bias]).to(dtype), persistent=False
        )
        self.register_buffer(
            "gate_weight", torch.cat([g.weight for pair in gates for g in pair]).to(dtype), persistent=False
        )
        self.register_buffer("gate_bias", torch.cat([g.bias for pair in gates for g in pair]).to(dtype), persistent=False)

    def forward(self, s: Tensor) -> tuple[Tensor, Tensor]:
        """s (B, L, C) -> terms (B, L, 2, depth, 2, D) and gates (B, L, depth, 2, D)."""
        normed = F.layer_norm(s.float(), s.shape[-1:], eps=self.eps).to(self.norm_weight.dtype)
        terms = F.linear(normed, self.norm_weight, self.norm_bias)
        gates = F.linear(s.to(self.gate_weight.dtype), self.gate_weight, self.gate_bias).sigmoid_()
        terms = terms.view(*s.shape[:2], 2, self.depth, 2, self.width)
        terms[:, :, 0].sigmoid_()
        return terms, gates.view(*s.shape[:2], self.depth, 2, self.width)


class FusedLayerWeights(nn.Module):
    """A stack's per-layer projections concatenated: q|k|v|g (q's bias, zeros elsewhere), o,
    swish_gate|a_to_b (x | gates | y, see modulation.swiglu_product) and b_to_a."""

    @torch.no_grad()  # copies of inference weights: no autograd history
    def __init__(self, layers: list[DiffusionTransformerLayer], take_storage: bool = False) -> None:
        """take_storage: the layers' own q/k/v/g and swish/a_to_b weights become views of the fused
        tensors (the same values, no second copy on the device); only for layers the caller owns."""
        super().__init__()
        attention = [layer.pair_bias_attn for layer in layers]
        self.heads = attention[0].num_heads
        projections = [[a.proj_q, a.proj_k, a.proj_v, a.proj_g] for a in attention]
        self.register_buffer("qkvg", _stacked(projections, take_storage), persistent=False)
        q_bias = [a.proj_q.bias for a in attention]
        self.register_buffer(
            "qkvg_bias", torch.stack([torch.cat([b, torch.zeros_like(b).repeat(3)]) for b in q_bias]), persistent=False
        )
        self.o = [a.proj_o.weight for a in attention]
        transitions = [layer.transition for layer in layers]
        swiglu = [[t.swish_gate[0], t.a_to_b] for t in transitions]
        self.register_buffer("swiglu", _stacked(swiglu, take_storage), persistent=False)
        self.b_to_a = [t.b_to_a.weight for t in transitions]


def _stacked(linears_per_layer: list[list[nn.Linear]], take_storage: bool) -> Tensor:
    """(layers, sum of out features, in features): each layer's weights concatenated, layers stacked;
    with take_storage the linears' weights are then views of it."""
    stacked = torch.stack([torch.cat([linear.weight for linear in linears]) for linears in linears_per_layer])
    if take_storage:
        for layer, linears in zip(stacked, linears_per_layer):
            start = 0
            for linear in linears:
                rows = linear.weight.shape[0]
                linear.weight = nn.Parameter(layer[start : start + rows], requires_grad=False)
                start += rows
    return stacked


def _attention_gate(qkvg: Tensor, attended: Tensor) -> Tensor:
    """sigmoid(g) * attention output in the (rows, L, heads * head_dim) layout proj_o reads;
    `attended` is the output viewed as the gate split into heads: (rows, ..., heads, head_dim)."""
    width = qkvg.shape[-1] // 4
    gate = qkvg[..., 3 * width :].sigmoid()
    gate.view(attended.shape).mul_(attended)
    return gate


def _shared_bias_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, samples: int) -> Tensor:
    """SDPA of (B*M, heads, L, head_dim) inputs with a bias (B, heads, L, K) shared by each record's M
    samples: a stride-0 view per record, never a copy per sample."""
    scale = q.shape[-1] ** -0.5
    if bias.shape[0] == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.expand(samples, -1, -1, -1), scale=scale)
    parts = [
        F.scaled_dot_product_attention(
            q[rows], k[rows], v[rows], attn_mask=bias[record : record + 1].expand(samples, -1, -1, -1), scale=scale
        )
        for record, rows in enumerate(slice(r * samples, (r + 1) * samples) for r in range(bias.shape[0]))
    ]
    return torch.cat(parts)


class FastScoreModel(nn.Module):
    """DiffusionModule.forward over a ScorePlan (see the module docstring)."""

    def __init__(self, score_model: DiffusionModule, owns_weights: bool = False) -> None:
        """owns_weights: `score_model` is this model's alone (a private copy), so its fused projections
        may take over its weights' storage (see FusedLayerWeights)."""
        super().__init__()
        self.score_model = score_model
        encoder = score_model.atom_attention_encoder.atom_encoder
        decoder = score_model.atom_attention_decoder.atom_decoder
        self.windows: AtomWindows = encoder.windows
        self.token_layers = list(score_model.token_transformer.layers)
        encoder_layers = list(encoder.diffusion_transformer.layers)
        decoder_layers = list(decoder.diffusion_transformer.layers)
        self.token_terms = ConditioningTerms(self.token_layers)
        self.encoder_terms = ConditioningTerms(encoder_layers)
        self.decoder_terms = ConditioningTerms(decoder_layers)
        self.token_weights = FusedLayerWeights(self.token_layers, owns_weights)
        self.encoder_weights = FusedLayerWeights(encoder_layers, owns_weights)
        self.decoder_weights = FusedLayerWeights(decoder_layers, owns_weights)
        self.eps = self.token_layers[0].adaln.a_norm.eps  # every AdaLN's: LayerNorm's default

    @property
    def dtype(self) -> torch.dtype:
        return self.token_weights.qkvg.dtype

    # Per sampling run

    @torch.no_grad()
    def prepare(
        self, conditioning: DiffusionConditioningOutput, feats: dict[str, Tensor], embedded_trunk: Tensor, samples: int
    ) -> ScorePlan:
        """The plan for `samples` samples per record; embedded_trunk: SingleConditioning.embed_trunk of
        the trunk's s and s_inputs, (B, T, 2*token_s)."""
        atom_mask = feats["atom_pad_mask"].bool()
        encoder_terms, encoder_gates = self.encoder_terms(conditioning.c.float())
        decoder_terms, decoder_gates = self.decoder_terms(conditioning.c.float())
        atom_to_token = feats["atom_to_token"]
        index, has_token = atom_token_index(atom_to_token)
        starts, inverse_counts, max_atoms = _token_segments(atom_to_token, index, has_token)
        return ScorePlan(
            samples=samples,
            embedded_trunk=embedded_trunk,
            q=conditioning.q.float(),
            encoder_terms=encoder_terms,
            encoder_gates=encoder_gates,
            encoder_bias=self._atom_bias(conditioning.atom_enc_bias, atom_mask, self.encoder_weights.heads, samples),
            decoder_terms=decoder_terms,
            decoder_gates=decoder_gates,
            decoder_bias=self._atom_bias(conditioning.atom_dec_bias, atom_mask, self.decoder_weights.heads, samples),
            token_bias=self._token_bias(conditioning, feats["token_pad_mask"].bool()),
            atom_index=index,
            atom_has_token=has_token.unsqueeze(-1).to(self.dtype),
            token_starts=starts,
            token_inverse_counts=inverse_counts,
            max_atoms=max_atoms,
            atom_to_token=atom_to_token,
        )

    def _atom_bias(self, bias: Tensor, atom_mask: Tensor, heads: int, samples: int) -> Tensor:
        """(B, K, W, H, depth*heads) -> (depth, B*M*K, heads, W, H) with the windowed key mask folded in."""
        batch, windows, queries, keys, _ = bias.shape
        per_layer = bias.view(batch, windows, queries, keys, -1, heads).permute(4, 0, 1, 5, 2, 3)
        key_mask = self.windows.key_window(atom_mask.unsqueeze(-1)).view(batch, windows, 1, 1, keys)
        masked = per_layer.to(self.dtype).masked_fill(~key_mask, MASKED_KEY_BIAS)
        depth = masked.shape[0]
        repeated = masked.unsqueeze(2).expand(depth, batch, samples, *masked.shape[2:])
        return repeated.reshape(depth, batch * samples * windows, heads, queries, keys)

    def _token_bias(self, conditioning: DiffusionConditioningOutput, token_mask: Tensor) -> Tensor:
        """The token transformer's (B, T, T, depth*heads) layer-major bias as (B, depth, heads, T, T),
        its masked key columns set in place."""
        bias = conditioning.token_trans_bias
        batch, tokens = bias.shape[:2]
        heads = self.token_weights.heads
        storage = bias.view(batch, tokens, tokens, -1, heads).permute(0, 3, 4, 1, 2)
        if not storage.is_contiguous() or storage.dtype != self.dtype:
            storage = storage.to(self.dtype, memory_format=torch.contiguous_format)
        if not bool(token_mask.all()):
            storage.masked_fill_(~token_mask[:, None, None, None, :], MASKED_KEY_BIAS)
        return storage

    # Per step

    def forward(self, r_noisy: Tensor, times: Tensor, plan: ScorePlan) -> Tensor:
        """r_noisy (B*M, N, 3), times (B*M,) -> the coordinate update (B*M, N, 3) fp32."""
        model, samples = self.score_model, plan.samples
        batch = plan.q.shape[0]
        s = model.single_conditioner(times.view(batch, samples)[:, 0], plan.embedded_trunk)

        encoder = model.atom_attention_encoder
        q = encoder.r_to_q_trans(r_noisy)
        q.view(batch, samples, *q.shape[1:]).add_(plan.q[:, None])
        q = self._atom_transformer(
            q, self.encoder_weights, plan.encoder_terms, plan.encoder_gates, plan.encoder_bias, samples
        )
        a = self._token_mean(encoder.atom_to_token_trans(q), plan)
        a.view(batch, samples, *a.shape[1:]).add_(model.s_to_a_linear(s)[:, None])
        a = self._token_transformer(a, s, plan)
        a = model.a_norm(a)

        decoder = model.atom_attention_decoder
        tokens = decoder.a_to_q_trans(a.float())
        q = q + self._tokens_to_atoms(tokens, plan).to(q)
        q = self._atom_transformer(
            q, self.decoder_weights, plan.decoder_terms, plan.decoder_gates, plan.decoder_bias, samples
        )
        return decoder.atom_feat_to_atom_pos_update(q).float()

    def _token_transformer(self, a: Tensor, s: Tensor, plan: ScorePlan) -> Tensor:
        """a (B*M, T, D) fp32, updated in place and returned; s (B, T, D) the single conditioning."""
        terms, gates = self.token_terms(s)
        weights, samples = self.token_weights, plan.samples
        rows, tokens, width = a.shape
        head_dim = width // weights.heads

        def attention(b: Tensor, layer: int) -> Tensor:
            qkvg = F.linear(b, weights.qkvg[layer], weights.qkvg_bias[layer])
            q, k, v = (
                qkvg[..., i * width : (i + 1) * width].view(rows, tokens, weights.heads, head_dim).transpose(1, 2)
                for i in range(3)
            )
            attended = _shared_bias_attention(q, k, v, plan.token_bias[:, layer], samples)
            return F.linear(_attention_gate(qkvg, attended.transpose(1, 2)), weights.o[layer])

        return self._layers(a, terms, gates, weights, samples, attention)

    def _layers(
        self,
        a: Tensor,
        terms: Tensor,
        gates: Tensor,
        weights: FusedLayerWeights,
        samples: int,
        attention: Callable[[Tensor, int], Tensor],
    ) -> Tensor:
        """A stack of DiffusionTransformerLayers on a (updated in place): per layer, attention then the
        conditioned transition, each a gated residual update; a residual add and the next AdaLN run as
        one kernel (modulation.residual_modulate)."""
        depth = terms.shape[3]
        b = modulate(a, terms[:, :, 0, 0, 0], terms[:, :, 1, 0, 0], samples, self.eps)
        for layer in range(depth):
            update = attention(b, layer)
            b = residual_modulate(
                a, gates[:, :, layer, 0], update, terms[:, :, 0, layer, 1], terms[:, :, 1, layer, 1], samples, self.eps
            )
            update = F.linear(gated_product(F.linear(b, weights.swiglu[layer])), weights.b_to_a[layer])
            if layer + 1 < depth:
                following = (terms[:, :, 0, layer + 1, 0], terms[:, :, 1, layer + 1, 0])
                b = residual_modulate(a, gates[:, :, layer, 1], update, *following, samples, self.eps)
            else:
                gated_add_(a, gates[:, :, layer, 1], update, samples)
        return a

    def _atom_transformer(
        self, q: Tensor, weights: FusedLayerWeights, terms: Tensor, gates: Tensor, bias: Tensor, samples: int
    ) -> Tensor:
        """q (B*M, N, D) fp32, updated in place and returned. Each window of W query atoms attends
        to its H key atoms, taken from the same sample row (AtomWindows)."""
        rows, atoms, width = q.shape
        windows, heads = self.windows, weights.heads
        num_windows, head_dim = atoms // windows.queries, width // heads
        window_rows = rows * num_windows

        def attention(b: Tensor, layer: int) -> Tensor:
            qkvg = F.linear(b, weights.qkvg[layer], weights.qkvg_bias[layer])
            query = qkvg[..., :width].reshape(window_rows, windows.queries, heads, head_dim).transpose(1, 2)
            key_value = windows.key_window(qkvg[..., width : 3 * width])
            key_value = key_value.reshape(window_rows, windows.keys, 2, heads, head_dim)
            attended = F.scaled_dot_product_attention(
                query,
                key_value[:, :, 0].transpose(1, 2),
                key_value[:, :, 1].transpose(1, 2),
                attn_mask=bias[layer],
                scale=head_dim**-0.5,
            )  # (window rows, heads, W, head_dim) -> (rows, windows, W, heads, head_dim)
            attended = attended.view(rows, num_windows, heads, windows.queries, head_dim).transpose(2, 3)
            return F.linear(_attention_gate(qkvg, attended), weights.o[layer])

        return self._layers(q, terms, gates, weights, samples, attention)

    def _token_mean(self, x: Tensor, plan: ScorePlan) -> Tensor:
        """Atom values (B*M, N, D) -> the mean of each token's atoms (B*M, T, D) fp32."""
        if plan.max_atoms == 0:
            return mean_atoms_per_token(x, plan.atom_to_token.repeat_interleave(plan.samples, 0))
        starts, inverse_counts = plan.token_starts, plan.token_inverse_counts
        return kernels.dispatch("token_mean", x.contiguous(), starts, inverse_counts, plan.samples, plan.max_atoms)

    def _tokens_to_atoms(self, values: Tensor, plan: ScorePlan) -> Tensor:
        """Token values (B*M, T, D) -> atom values (B*M, N, D); zero for atoms without a token."""
        batch, atoms = plan.atom_index.shape
        per_record = values.view(batch, plan.samples, *values.shape[1:])
        index = plan.atom_index[:, None, :, None].expand(batch, plan.samples, atoms, values.shape[-1])
        gathered = torch.gather(per_record, 2, index) * plan.atom_has_token[:, None].to(values)
        return gathered.view(-1, atoms, values.shape[-1])


def _token_segments(atom_to_token: Tensor, index: Tensor, has_token: Tensor) -> tuple[Tensor, Tensor, int]:
    """Token start offsets (B, T+1) int32, 1 / (atoms + 1e-6) (B, T), and the most atoms of a token.
    The last is 0 when some record's atoms are not laid out token by token from atom 0 (the
    featurizer's layout; anything else takes the dense mean)."""
    counts = atom_to_token.float().sum(dim=1)  # (B, T)
    ends = counts.long().cumsum(dim=1)
    atom = torch.arange(atom_to_token.shape[1], device=index.device).expand_as(index).contiguous()
    in_range = atom < ends[:, -1:]
    expected = torch.searchsorted(ends, atom, right=True)  # the token whose range holds each atom
    contiguous = torch.equal(has_token > 0, in_range) and torch.equal(index[in_range], expected[in_range])
    max_atoms = int(counts.max().item()) if contiguous else 0
    return F.pad(ends, (1, 0)).to(torch.int32), 1.0 / (counts + 1e-6), max_atoms


def token_mean(x: Tensor, starts: Tensor, inverse_counts: Tensor, samples: int, max_atoms: int) -> Tensor:
    """Reference of the "token_mean" op: x (B*M, N, D), atoms contiguous per token (see
    _token_segments) -> (B*M, T, D) fp32; sums each token's atoms in order, as the kernel does."""
    rows, atoms, width = x.shape
    batch, tokens = inverse_counts.shape
    first = starts[:, :-1].long().repeat_interleave(samples, 0)  # (B*M, T)
    end = starts[:, 1:].long().repeat_interleave(samples, 0)
    total = torch.zeros((rows, tokens, width), device=x.device, dtype=torch.float32)
    for offset in range(max_atoms):
        atom = first + offset
        valid = (atom < end).unsqueeze(-1)
        values = torch.gather(x, 1, atom.clamp(max=atoms - 1).unsqueeze(-1).expand(-1, -1, width))
        total += values.float() * valid
    return total * inverse_counts.repeat_interleave(samples, 0).unsqueeze(-1)


# The plain PyTorch implementations the kernel registry runs where no backend applies.
kernels.register_reference("token_mean", token_mean)
