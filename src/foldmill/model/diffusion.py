"""Structure module: the score model and the EDM sampler (AF3 Algorithms 18-21, Boltz-2 variant).

- DiffusionModule (`structure_module.score_model`): noisy atom coordinates (B*M, N, 3) and
  the noise level -> coordinate update (B*M, N, 3). Atom encoder -> token transformer
  (width 2*token_s) -> atom decoder, conditioned on the trunk through SingleConditioning and
  the precomputed DiffusionConditioningOutput.
- AtomDiffusion (`structure_module`): EDM preconditioning and the stochastic sampler on a
  Karras schedule. Every step re-centres and randomly rotates/translates the sample, adds
  noise, denoises, rigidly aligns the noisy sample onto the denoised one and takes an Euler
  step. All M samples of all B records share one batched pass; at most
  `max_parallel_samples` samples go through the score model at once.

Random numbers come from one torch.Generator, drawn in Boltz-2's order (initial noise; per
step: rotation quaternions, translations, step noise), so a generator seeded like Boltz-2's
global RNG reproduces its samples. (Boltz-2's trunk also draws unused dropout masks from that
RNG in eval mode, so it reproduces them when its RNG is seeded as sampling starts.)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from foldmill.model.atom_attention import AtomAttentionDecoder, AtomAttentionEncoder
from foldmill.model.config import Boltz2Config
from foldmill.model.diffusion_conditioning import DiffusionConditioningOutput
from foldmill.model.diffusion_transformer import DiffusionTransformer
from foldmill.model.layers.fourier_embedding import FourierEmbedding
from foldmill.model.layers.layer_norm import LayerNorm
from foldmill.model.layers.transition import Transition

# The score model's call: (r_noisy, times, embedded_trunk, feats, conditioning, multiplicity) -> update.
ScoreCall = Callable[[Tensor, Tensor, Tensor, dict, DiffusionConditioningOutput, int], Tensor]


class SingleConditioning(nn.Module):
    """Token conditioning of the score model: trunk s and s_inputs plus Fourier features of the noise level."""

    def __init__(self, token_s: int, dim_fourier: int, num_transitions: int, expansion_factor: int = 2) -> None:
        super().__init__()
        width = 2 * token_s
        self.norm_single = LayerNorm(width)
        self.single_embed = nn.Linear(width, width)
        self.fourier_embed = FourierEmbedding(dim_fourier)
        self.norm_fourier = LayerNorm(dim_fourier)
        self.fourier_to_single = nn.Linear(dim_fourier, width, bias=False)
        self.transitions = nn.ModuleList(
            Transition(dim=width, hidden=expansion_factor * width) for _ in range(num_transitions)
        )

    def embed_trunk(self, s_trunk: Tensor, s_inputs: Tensor) -> Tensor:
        """The noise-independent part: (B*M, T, token_s) x 2 -> (B*M, T, 2*token_s)."""
        return self.single_embed(self.norm_single(torch.cat((s_trunk, s_inputs), dim=-1)))

    def forward(self, times: Tensor, embedded_trunk: Tensor) -> Tensor:
        """times: (B*M,) scaled noise levels; embedded_trunk from `embed_trunk`."""
        fourier = self.fourier_to_single(self.norm_fourier(self.fourier_embed(times)))
        s = fourier[:, None, :] + embedded_trunk
        for transition in self.transitions:
            s = transition(s) + s
        return s


class DiffusionModule(nn.Module):
    """The score network: predicts a coordinate update from scaled noisy coordinates."""

    def __init__(self, config: Boltz2Config) -> None:
        super().__init__()
        token_s, atom_s = config.token_s, config.atom_s
        self.single_conditioner = SingleConditioning(
            token_s=token_s,
            dim_fourier=config.dim_fourier,
            num_transitions=config.conditioning_transition_layers,
        )
        self.atom_attention_encoder = AtomAttentionEncoder(
            atom_s=atom_s,
            token_s=token_s,
            atoms_per_window_queries=config.atoms_per_window_queries,
            atoms_per_window_keys=config.atoms_per_window_keys,
            atom_encoder_depth=config.diffusion_atom_encoder_depth,
            atom_encoder_heads=config.diffusion_atom_encoder_heads,
            structure_prediction=True,
        )
        self.s_to_a_linear = nn.Sequential(LayerNorm(2 * token_s), nn.Linear(2 * token_s, 2 * token_s, bias=False))
        self.token_transformer = DiffusionTransformer(
            depth=config.token_transformer_depth,
            heads=config.token_transformer_heads,
            dim=2 * token_s,
            dim_single_cond=2 * token_s,
        )
        self.a_norm = LayerNorm(2 * token_s)
        self.atom_attention_decoder = AtomAttentionDecoder(
            atom_s=atom_s,
            token_s=token_s,
            attn_window_queries=config.atoms_per_window_queries,
            attn_window_keys=config.atoms_per_window_keys,
            atom_decoder_depth=config.atom_decoder_depth,
            atom_decoder_heads=config.atom_decoder_heads,
        )

    def forward(
        self,
        r_noisy: Tensor,
        times: Tensor,
        embedded_trunk: Tensor,
        feats: dict[str, Tensor],
        conditioning: DiffusionConditioningOutput,
        multiplicity: int,
    ) -> Tensor:
        """r_noisy: (B*M, N, 3); times: (B*M,); embedded_trunk: SingleConditioning.embed_trunk of the
        trunk's s and s_inputs repeated M times. Returns the coordinate update (B*M, N, 3).

        The conditioning's attention biases are read in their stored dtype (the attention kernels
        compute logits in fp32 or round the bias to the query's dtype themselves): an fp32 copy of
        the token bias per step would be 51 GiB at 6,000 tokens. q and c (atom residual streams) are fp32."""
        s = self.single_conditioner(times, embedded_trunk)
        a, q_skip, c_skip = self.atom_attention_encoder(
            feats=feats,
            q=conditioning.q.float(),
            c=conditioning.c.float(),
            bias=conditioning.atom_enc_bias,
            r=r_noisy,
            multiplicity=multiplicity,
        )
        a = a + self.s_to_a_linear(s)
        token_mask = feats["token_pad_mask"].repeat_interleave(multiplicity, 0).float()
        a = self.token_transformer(
            a, s=s, bias=conditioning.token_trans_bias, mask=token_mask, multiplicity=multiplicity
        )
        a = self.a_norm(a)
        return self.atom_attention_decoder(
            a=a,
            q=q_skip,
            c=c_skip,
            bias=conditioning.atom_dec_bias,
            feats=feats,
            multiplicity=multiplicity,
        )


def random_rotations(count: int, generator: torch.Generator, device: torch.device) -> Tensor:
    """Uniform random rotation matrices (count, 3, 3) from normalised Gaussian quaternions."""
    return rotations_from_quaternions(torch.randn((count, 4), generator=generator, device=device))


def rotations_from_quaternions(quaternion: Tensor) -> Tensor:
    """Rotation matrices (..., 3, 3) of quaternions (..., 4) (real part first), normalised here; q and -q
    give the same rotation."""
    norm = torch.sqrt((quaternion * quaternion).sum(-1))
    # Unit quaternion with a non-negative real part.
    quaternion = quaternion / torch.where(quaternion[..., 0] < 0, -norm, norm)[..., None]
    r, i, j, k = torch.unbind(quaternion, -1)
    two_s = 2.0 / (quaternion * quaternion).sum(-1)
    matrix = torch.stack(
        (
            1 - two_s * (j * j + k * k),
            two_s * (i * j - k * r),
            two_s * (i * k + j * r),
            two_s * (i * j + k * r),
            1 - two_s * (i * i + k * k),
            two_s * (j * k - i * r),
            two_s * (i * k - j * r),
            two_s * (j * k + i * r),
            1 - two_s * (i * i + j * j),
        ),
        -1,
    )
    return matrix.reshape(*quaternion.shape[:-1], 3, 3)


def kabsch_rotation(covariance: Tensor) -> Tensor:
    """The rotation R (..., 3, 3) maximising sum w t.(R x) for covariance = sum w t x^T, by SVD with the
    reflection fix (Boltz-2's computation; on CUDA the SVD synchronises with the host)."""
    u, _, v_h = torch.linalg.svd(covariance.float())
    v = v_h.mH
    rotation = torch.einsum("...ij,...kj->...ik", u, v)
    # Reflections are not rigid motions: flip the least significant axis if det < 0.
    reflection_fix = torch.eye(3, dtype=u.dtype, device=u.device).repeat(*covariance.shape[:-2], 1, 1)
    reflection_fix[..., -1, -1] = torch.det(rotation)
    return torch.einsum("...ij,...jk,...lk->...il", u, reflection_fix, v)


# Squarings of the shifted 4x4 matrix in quaternion_rotation: its top eigenvector dominates once
# (second / top eigenvalue)^(2^24) is negligible, i.e. for eigengaps above ~1e-6 of its scale; closer
# eigenvalues mean nearly equally good rotations.
QUATERNION_SQUARINGS = 24


def quaternion_rotation(covariance: Tensor) -> Tensor:
    """The same rotation as kabsch_rotation, from fixed-count device arithmetic (no host
    synchronisation, so a CUDA graph can hold it): the optimal rotation's quaternion is the top
    eigenvector of a symmetric 4x4 matrix of the covariance (Horn 1987), found here by repeated
    squaring of that matrix shifted to be positive semi-definite, in float64."""
    m = covariance.double().transpose(-1, -2)  # m[a, b] = sum w x_a t_b
    xx, xy, xz = m[..., 0, 0], m[..., 0, 1], m[..., 0, 2]
    yx, yy, yz = m[..., 1, 0], m[..., 1, 1], m[..., 1, 2]
    zx, zy, zz = m[..., 2, 0], m[..., 2, 1], m[..., 2, 2]
    rows = (
        (xx + yy + zz, yz - zy, zx - xz, xy - yx),
        (yz - zy, xx - yy - zz, xy + yx, zx + xz),
        (zx - xz, xy + yx, yy - xx - zz, yz + zy),
        (xy - yx, zx + xz, yz + zy, zz - xx - yy),
    )
    horn = torch.stack([torch.stack(row, -1) for row in rows], -2)
    # Its eigenvalues lie within +-(sum of singular values) <= sqrt(3) * |covariance|_F.
    shift = 3**0.5 * torch.linalg.matrix_norm(m) + 1e-300
    power = horn + shift[..., None, None] * torch.eye(4, dtype=m.dtype, device=m.device)
    for squaring in range(QUATERNION_SQUARINGS):
        if squaring % 4 == 0:  # trace 1: eigenvalues in [0, 1], the top one >= 1/4: no over- or underflow
            power = power / power.diagonal(dim1=-2, dim2=-1).sum(-1)[..., None, None]
        power = power @ power
    column = power.diagonal(dim1=-2, dim2=-1).argmax(-1)  # ~ c v v^T: its largest column is along v
    quaternion = torch.gather(power, -1, column[..., None, None].expand(*power.shape[:-1], 1)).squeeze(-1)
    return rotations_from_quaternions(quaternion)


def weighted_rigid_align(
    coords: Tensor,
    target: Tensor,
    weights: Tensor,
    mask: Tensor,
    rotation_of: Callable[[Tensor], Tensor] = kabsch_rotation,
) -> Tensor:
    """Rigidly move `coords` (B, N, 3) onto `target` (B, N, 3), minimising the weighted squared
    distance over masked atoms (weighted Kabsch, AF3 Algorithm 28). Returns moved coords.
    `rotation_of(covariance)` finds the rotation (kabsch_rotation or quaternion_rotation)."""
    weights = (mask * weights).unsqueeze(-1)
    total = weights.sum(dim=-2, keepdim=True)
    coords_centroid = (coords * weights).sum(dim=-2, keepdim=True) / total
    target_centroid = (target * weights).sum(dim=-2, keepdim=True) / total
    coords_centered = coords - coords_centroid
    target_centered = target - target_centroid

    covariance = torch.einsum("...ni,...nj->...ij", weights * target_centered, coords_centered)
    rotation = rotation_of(covariance).to(coords.dtype)
    return torch.einsum("...ni,...ji->...nj", coords_centered, rotation) + target_centroid


def sample_chunks(batch: int, multiplicity: int, max_parallel: int, device: torch.device) -> list[Tensor]:
    """Row indices of the (B*M) record-major sample stack, grouped into chunks of at most
    `max_parallel` samples per record (each chunk holds every record's share, record-major)."""
    rows = torch.arange(batch * multiplicity, device=device).view(batch, multiplicity)
    return [rows[:, start : start + max_parallel].reshape(-1) for start in range(0, multiplicity, max_parallel)]


class AtomDiffusion(nn.Module):
    """EDM sampler around the score model (`structure_module` in the checkpoint)."""

    def __init__(self, config: Boltz2Config) -> None:
        super().__init__()
        self.score_model = DiffusionModule(config)
        self.sigma_min = config.sigma_min
        self.sigma_max = config.sigma_max
        self.sigma_data = config.sigma_data
        self.rho = config.rho
        self.gamma_0 = config.gamma_0
        self.gamma_min = config.gamma_min
        self.noise_scale = config.noise_scale
        self.step_scale = config.step_scale
        self.alignment_reverse_diff = config.alignment_reverse_diff

    # EDM preconditioning (Karras et al. 2022, Table 1)
    def c_skip(self, sigma: Tensor) -> Tensor:
        return (self.sigma_data**2) / (sigma**2 + self.sigma_data**2)

    def c_out(self, sigma: Tensor) -> Tensor:
        return sigma * self.sigma_data / torch.sqrt(self.sigma_data**2 + sigma**2)

    def c_in(self, sigma: Tensor) -> Tensor:
        return 1 / torch.sqrt(sigma**2 + self.sigma_data**2)

    def c_noise(self, sigma: Tensor) -> Tensor:
        return torch.log((sigma / self.sigma_data).clamp(min=1e-20)) * 0.25

    def noise_schedule(self, num_steps: int, device: torch.device) -> Tensor:
        """Karras schedule: num_steps noise levels from sigma_max to sigma_min (times sigma_data), then 0."""
        inv_rho = 1 / self.rho
        steps = torch.arange(num_steps, device=device, dtype=torch.float32)
        sigmas = (
            self.sigma_max**inv_rho + steps / (num_steps - 1) * (self.sigma_min**inv_rho - self.sigma_max**inv_rho)
        ) ** self.rho
        sigmas = sigmas * self.sigma_data
        return torch.nn.functional.pad(sigmas, (0, 1), value=0.0)

    def denoise(
        self,
        noisy: Tensor,
        sigma: float,
        embedded_trunk: Tensor,
        feats: dict[str, Tensor],
        conditioning: DiffusionConditioningOutput,
        multiplicity: int,
        score: ScoreCall | None = None,
    ) -> Tensor:
        """Preconditioned score model: noisy coordinates at noise level sigma -> denoised coordinates.
        `score`: what runs the score model (default: the module itself), called with DiffusionModule's
        arguments in order; an inference runner passes a low-precision copy or its CUDA-graph replay."""
        sigma_rows = torch.full((noisy.shape[0],), sigma, device=noisy.device)
        padded_sigma = sigma_rows[:, None, None]
        score = score or self.score_model
        update = score(
            self.c_in(padded_sigma) * noisy,
            self.c_noise(sigma_rows),
            embedded_trunk,
            feats,
            conditioning,
            multiplicity,
        )
        return self.c_skip(padded_sigma) * noisy + self.c_out(padded_sigma) * update

    @torch.no_grad()
    def sample(
        self,
        s_trunk: Tensor,
        s_inputs: Tensor,
        feats: dict[str, Tensor],
        conditioning: DiffusionConditioningOutput,
        num_sampling_steps: int,
        multiplicity: int,
        max_parallel_samples: int,
        generator: torch.Generator,
        score: ScoreCall | None = None,
    ) -> Tensor:
        """Draw `multiplicity` structures per record: (B*M, N, 3), record-major. `score`: see `denoise`."""
        atom_mask = feats["atom_pad_mask"].float()
        batch, device = atom_mask.shape[0], atom_mask.device
        atom_mask = atom_mask.repeat_interleave(multiplicity, 0)
        shape = (*atom_mask.shape, 3)
        chunks = sample_chunks(batch, multiplicity, max_parallel_samples, device)

        # The score model's noise-independent token conditioning, once per chunk size.
        embedded_trunk = {}
        for chunk in chunks:
            size = chunk.numel() // batch
            if size not in embedded_trunk:
                embedded_trunk[size] = self.score_model.single_conditioner.embed_trunk(
                    s_trunk.repeat_interleave(size, 0), s_inputs.repeat_interleave(size, 0)
                )

        sigmas = self.noise_schedule(num_sampling_steps, device)
        gammas = torch.where(sigmas > self.gamma_min, self.gamma_0, 0.0)
        coords = sigmas[0] * torch.randn(shape, generator=generator, device=device)

        for sigma_prev, sigma_next, gamma in zip(sigmas[:-1].tolist(), sigmas[1:].tolist(), gammas[1:].tolist()):
            rotation = random_rotations(shape[0], generator, device)
            translation = torch.randn((shape[0], 1, 3), generator=generator, device=device)
            coords = coords - coords.mean(dim=-2, keepdim=True)  # over all atoms, padding too, as Boltz-2
            coords = torch.einsum("bmd,bds->bms", coords, rotation) + translation

            t_hat = sigma_prev * (1 + gamma)
            noise_var = self.noise_scale**2 * (t_hat**2 - sigma_prev**2)
            noisy = coords + math.sqrt(noise_var) * torch.randn(shape, generator=generator, device=device)

            denoised = torch.zeros_like(noisy)
            for chunk in chunks:
                size = chunk.numel() // batch
                denoised[chunk] = self.denoise(
                    noisy[chunk], t_hat, embedded_trunk[size], feats, conditioning, size, score
                )

            if self.alignment_reverse_diff:
                noisy = weighted_rigid_align(noisy.float(), denoised.float(), atom_mask, atom_mask).to(denoised)

            step = (noisy - denoised) / t_hat
            coords = noisy + self.step_scale * (sigma_next - t_hat) * step
        return coords
