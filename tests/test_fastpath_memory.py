"""Memory at scale (6,000 tokens on one H200), on CPU: the diffusion conditioning built by blocks of
token rows equals the unblocked computation bitwise; the score model takes the conditioning in its
stored (bf16) dtype with the same results as an fp32 copy; CUDA-graph bookkeeping for inputs read in place."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from oss_oracle import one_torch_thread  # noqa: F401 - fixture (tiny models run fastest on one thread)

from foldmill.bench._inputs import BenchInput, featurize_input
from foldmill.fastpath.cuda_graphs import GraphedCall
from foldmill.fastpath.prepare import low_precision_network, low_precision_score_model
from foldmill.fastpath.runner import FastBoltz2, FastPathOptions
from foldmill.kernels.token_rows import by_token_rows, rows_per_block
from foldmill.model import Boltz2Config, demo_model


@pytest.fixture(scope="module")
def model(one_torch_thread):  # noqa: F811 - the imported fixture, requested by name
    return demo_model(Boltz2Config.small(), seed=7)


@pytest.fixture(scope="module")
def features():
    """A 2-chain protein of 21 tokens, single-sequence MSA."""
    pytest.importorskip("biotite")  # the featurizer's CCD
    return featurize_input(BenchInput((9, 12)))


@pytest.fixture(scope="module")
def trunk(model, features):
    with torch.no_grad():
        return model.trunk(features, recycling_steps=0)


def _conditioning(model, trunk, features, pairs_per_block):
    with torch.no_grad():
        return model.diffusion_conditioning(
            trunk.s, trunk.z, trunk.relative_position_encoding, features, pairs_per_block=pairs_per_block
        )


def test_rows_per_block_bounds_the_pairs_of_a_block():
    assert rows_per_block(1000, 1 << 19) == 524 and rows_per_block(6000, 1 << 19) == 87
    assert rows_per_block(100, 1 << 19) >= 100  # small inputs: one block, the unblocked computation
    assert rows_per_block(10**7, 1 << 19) == 1


def test_by_token_rows_assembles_blocks_in_their_dtype():
    full = torch.randn(2, 7, 7, 3).to(torch.bfloat16)
    blocks = []

    def pair_fn(rows: slice) -> torch.Tensor:
        blocks.append(full[:, rows].shape[1])
        return full[:, rows] * 2

    out = by_token_rows(pair_fn, tokens=7, rows=3)
    assert blocks == [3, 3, 1] and out.dtype == torch.bfloat16 and torch.equal(out, full * 2)


def test_conditioning_by_token_rows_equals_unblocked_bitwise_fp32(model, trunk, features):
    tokens = trunk.z.shape[1]
    whole = _conditioning(model, trunk, features, pairs_per_block=tokens * tokens)
    for rows in (1, 4, tokens - 1):
        blocked = _conditioning(model, trunk, features, pairs_per_block=rows * tokens)
        for field in dataclasses.fields(whole):
            ours, reference = getattr(blocked, field.name), getattr(whole, field.name)
            assert ours.dtype == torch.float32 and torch.equal(ours, reference), (rows, field.name)
    # The reference of both: the per-layer projections concatenated (Boltz-2's computation).
    module = model.diffusion_conditioning
    with torch.no_grad():
        z = module.pairwise_conditioner(trunk.z, trunk.relative_position_encoding)
        concatenated = torch.cat([project(z) for project in module.token_trans_proj_z], dim=-1)
    assert torch.equal(whole.token_trans_bias, concatenated)


def test_token_bias_is_stored_layer_major(model, trunk, features):
    bias = _conditioning(model, trunk, features, pairs_per_block=5 * trunk.z.shape[1]).token_trans_bias
    depth = len(model.diffusion_conditioning.token_trans_proj_z)
    layer = bias.view(*bias.shape[:3], depth, -1)[:, :, :, depth - 1].movedim(-1, 1)  # what the token transformer reads
    assert layer.is_contiguous()


def test_bf16_conditioning_by_token_rows_stays_bf16_and_close(model, trunk, features):
    network = low_precision_network(model, torch.bfloat16)
    tokens = trunk.z.shape[1]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        whole = _conditioning(network, trunk, features, pairs_per_block=tokens * tokens)
        blocked = _conditioning(network, trunk, features, pairs_per_block=3 * tokens)
    for name in ("atom_enc_bias", "atom_dec_bias", "token_trans_bias"):
        assert blocked.token_trans_bias.dtype == torch.bfloat16
        torch.testing.assert_close(getattr(blocked, name), getattr(whole, name), rtol=1e-2, atol=1e-2, msg=name)


def test_score_model_reads_bf16_conditioning_as_an_fp32_copy_would(model, trunk, features):
    """The attention kernels read the bias in fp32 or round it to bf16 themselves: feeding the stored bf16
    conditioning (no per-step fp32 copy) gives the same coordinates as an fp32 copy of the same values."""
    network = low_precision_network(model, torch.bfloat16)
    score_model = low_precision_score_model(model.structure_module.score_model, torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        conditioning = _conditioning(network, trunk, features, pairs_per_block=4 * trunk.z.shape[1])
    assert conditioning.token_trans_bias.dtype == torch.bfloat16
    as_fp32 = dataclasses.replace(
        conditioning, **{f.name: getattr(conditioning, f.name).float() for f in dataclasses.fields(conditioning)}
    )
    samples = 2
    noisy = 10 * torch.randn(samples, features["atom_pad_mask"].shape[1], 3, generator=torch.Generator().manual_seed(3))
    times = torch.full((samples,), 0.3)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        embedded = score_model.single_conditioner.embed_trunk(
            trunk.s.repeat_interleave(samples, 0), trunk.s_inputs.repeat_interleave(samples, 0)
        )
        ours = score_model(noisy, times, embedded, features, conditioning, multiplicity=samples)
        reference = score_model(noisy, times, embedded, features, as_fp32, multiplicity=samples)
    assert torch.isfinite(ours).all() and torch.equal(ours, reference)


@dataclasses.dataclass
class _Conditioning:
    bias: torch.Tensor


def test_graph_in_place_inputs_are_recognised_by_address():
    """Bookkeeping of GraphedCall (CPU cannot capture): a graph is replayed only while the in-place inputs
    fn read are the same memory as at capture; per-call inputs and unread dict entries do not matter."""
    graphed = GraphedCall(lambda x, feats, cond: x, per_call=(True, False, False))
    feats = {"read": torch.ones(4), "unread": torch.ones(4)}
    conditioning = _Conditioning(torch.zeros(3, 3))
    read_keys = [None, {"read"}, None]
    captured = graphed.in_place_addresses((torch.ones(2), feats, conditioning), read_keys)
    # Same run: new per-call values, the same conditioning and features; unread entries may change.
    same_run = (torch.zeros(2), {**feats, "unread": torch.zeros(4)}, conditioning)
    assert graphed.in_place_addresses(same_run, read_keys) == captured
    # A new run: conditioning elsewhere (same shape), or a read feature elsewhere: stale.
    new_conditioning = _Conditioning(conditioning.bias.clone())
    assert graphed.in_place_addresses((torch.ones(2), feats, new_conditioning), read_keys) != captured
    new_feats = {**feats, "read": feats["read"].clone()}
    assert graphed.in_place_addresses((torch.ones(2), new_feats, conditioning), read_keys) != captured
    # Same memory, other strides (a transposed view): stale too.
    transposed = _Conditioning(conditioning.bias.t())
    assert graphed.in_place_addresses((torch.ones(2), feats, transposed), read_keys) != captured


def test_fast_path_graphs_copy_only_the_noisy_coordinates_and_noise_level(model):
    """The score-model graph's per-call inputs (copied before every replay) are the coordinates and the noise
    level; the sampling run's plan, or the features and conditioning (GiBs at scale), are read in place."""
    assert FastBoltz2(model, FastPathOptions()).graphs.per_call == (True, True, False)
    assert FastBoltz2(model, FastPathOptions(kernels=False)).graphs.per_call == (True, True, False, False, False, False)


def test_predict_by_small_row_blocks_equals_unblocked_bitwise(model, features, monkeypatch):
    """Every row-blocked stage (the trunk's pair embedding, conditioning, the confidence embedding and
    metrics), in a whole fp32 prediction, with blocks of 2 token rows: the same outputs, bit for bit."""
    from foldmill.kernels import token_rows
    from foldmill.model import InferenceRecipe

    recipe = InferenceRecipe(recycling_steps=0, sampling_steps=2, diffusion_samples=2, max_parallel_samples=2, seed=3)
    tokens = features["token_pad_mask"].shape[1]
    expected = model.predict({name: value.clone() for name, value in features.items()}, recipe)
    monkeypatch.setattr(token_rows, "PAIRS_PER_BLOCK", 2 * tokens)
    assert token_rows.rows_per_block(tokens) == 2
    blocked = model.predict({name: value.clone() for name, value in features.items()}, recipe)
    for name, value in expected.items():
        assert torch.equal(blocked[name], value), name


@torch.no_grad()
def test_atom_pair_features_equal_whichever_side_is_transformed():
    """Inputs with more token pairs than windowed atom pairs gather first, then transform."""
    from foldmill.model.atom_attention import AtomEncoder

    encoder = AtomEncoder(8, 4, 16, 16, 32, 128, 10).eval()
    g = torch.Generator().manual_seed(0)
    for p in encoder.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    tokens, atoms = 200, 224  # one atom per token (ligand-like): 200^2 token pairs > 224 x 128 atom pairs
    z = torch.randn(1, tokens, tokens, 16, generator=g)
    atom_to_token = torch.zeros(1, atoms, tokens, dtype=torch.long)
    atom_to_token[0, torch.arange(tokens), torch.arange(tokens)] = 1  # the last 24 atoms are padding
    transform = encoder.z_to_p_trans
    gathered_first = encoder._pair_from_tokens(z, atom_to_token, transform)
    transformed_first = encoder._pair_from_tokens(transform(z), atom_to_token, lambda pairs: pairs)
    torch.testing.assert_close(gathered_first, transformed_first, rtol=1e-6, atol=1e-6)
    assert gathered_first[0, -1, tokens - 192 :].abs().sum() == 0  # padding query atoms 200..223: zero
    assert gathered_first[0, -1, : tokens - 192].abs().sum() > 0


def test_low_precision_runner_holds_one_score_model_and_leaves_the_callers_alone(model):
    """The bf16 network holds the runner's bf16 score model (not the caller's fp32 one), and the
    caller's weights keep their own storage."""
    before = {name: p.data_ptr() for name, p in model.named_parameters()}
    fast = FastBoltz2(model, FastPathOptions(precision="bf16"), device="cpu")
    assert fast.network.structure_module.score_model is fast.score_model
    assert fast.score_model is not model.structure_module.score_model
    assert fast.network.pairformer_module.stack.layers[0].tri_att_start.linear.weight.dtype == torch.bfloat16
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == before
    assert all(p.dtype == torch.float32 for p in model.parameters())
