"""The DP-SGD engine: per-example gradients, clipping, noise and the ledger record of every step."""
from __future__ import annotations

import pytest
import torch
from conftest import secret_stream
from torch import nn

from dpsynth.diffusion import Diffusion
from dpsynth.models import build_unet
from dpsynth.privacy import NonPrivateAccess, PrivacyLedger, SubsampledGaussianMechanism
from dpsynth.privacy.dpsgd import DPSGD, EMA, DpsgdSettings, clip_gradient, clipped_sum, per_example_gradients
from dpsynth.privacy.per_example import BatchedGradients


def small_unet() -> nn.Module:
    torch.manual_seed(0)
    return build_unet(1, 8, 3, [8, 16], norm_groups=4)


def test_per_example_gradients_equal_single_example_backward_passes():
    model, diffusion = small_unet(), Diffusion(timesteps=100)
    generator = torch.Generator().manual_seed(1)
    images, labels = torch.rand(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])  # 3 is the null class
    times, noise = diffusion.training_inputs(4, 2, (1, 8, 8), generator)
    params = {n: p.detach() for n, p in model.named_parameters()}
    grads = per_example_gradients(model, diffusion.example_loss, params, dict(model.named_buffers()),
                                  (images, labels, times, noise))
    for i in range(4):
        model.zero_grad()
        diffusion.example_loss(model, images[i], labels[i], times[i], noise[i]).backward()
        for name, param in model.named_parameters():
            assert torch.allclose(grads[name][i], param.grad, atol=1e-5, rtol=1e-4), name


def test_batched_per_example_gradients_equal_single_example_backward_passes():
    """Convolutions, linear layers (time embedding, attention), GroupNorm and the class embedding, K = 2 rows."""
    model, diffusion = small_unet(), Diffusion(timesteps=100)
    images, labels = torch.rand(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])
    times, noise = diffusion.training_inputs(4, 2, (1, 8, 8), torch.Generator().manual_seed(1))
    params = dict(model.named_parameters())
    grads = BatchedGradients(model, diffusion.example_losses, params)((images, labels, times, noise))
    assert set(grads) == set(params)
    for i in range(4):
        model.zero_grad()
        diffusion.example_loss(model, images[i], labels[i], times[i], noise[i]).backward()
        for name, param in model.named_parameters():
            assert torch.allclose(grads[name][i], param.grad, atol=1e-5, rtol=1e-4), name


def _unet_steps(batch_loss: bool) -> tuple[nn.Module, DPSGD]:
    """One DP-SGD step of the small UNet on fixed data and noise, with or without the batched engine."""
    model, diffusion = small_unet(), Diffusion(timesteps=100)
    images, labels = torch.rand(6, 1, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    times, noise = diffusion.training_inputs(6, 1, (1, 8, 8), torch.Generator().manual_seed(2))
    engine = DPSGD(model, torch.optim.SGD(model.parameters(), lr=0.1), diffusion.example_loss,
                   settings=DpsgdSettings(1.0, 0.5, 1.0, 4), num_records=6, ledger=PrivacyLedger(), stage="dp-sgd",
                   noise=secret_stream(3),
                   batch_loss=diffusion.example_losses if batch_loss else None)
    engine.step(lambda index: (images[index], labels[index], times[index], noise[index]))
    return model, engine


def test_the_batched_engine_takes_the_step_the_vmap_engine_takes():
    batched, engine = _unet_steps(True)
    reference, vmap = _unet_steps(False)
    assert engine.engine == {"per_example": "batched",
                             "why": "agreed with vmap on a public probe batch, examples independent"}
    assert vmap.engine == {"per_example": "vmap", "why": "no batch loss"}
    for (name, ours), theirs in zip(batched.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(ours, theirs, atol=1e-6), name


class CentresTheBatch(nn.Module):
    """A layer whose output for one example depends on the others (as BatchNorm's in training mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x - x.mean(0))


@pytest.mark.parametrize("interacting, why", [(True, "the model is a CentresTheBatch, not on the batched engine's "
                                                    "allow-list"), (False, "the model is a Linear")])
def test_models_the_batched_rules_do_not_fit_keep_the_vmap_engine(interacting, why):
    """A module off the allow-list (a layer across the batch, this file's Linear) takes vmap up front; an allowed
    model whose loss mixes examples is caught by the probe (test_release_privacy.py)."""
    model, data = (CentresTheBatch(), torch.randn(8, 3)) if interacting else (Linear(), torch.randn(8, 2000))
    engine = DPSGD(model, torch.optim.SGD(model.parameters(), lr=0.1), lambda f, x: f(x[None]).pow(2).sum(),
                   settings=DpsgdSettings(1.0, 1.0, 1.0, 8), num_records=8, ledger=PrivacyLedger(), stage="dp-sgd",
                   noise=secret_stream(4),
                   batch_loss=lambda m, x: m(x).pow(2).flatten(1).sum(1))
    engine.step(lambda index: (data[index],))
    assert engine.engine["per_example"] == "vmap" and why in engine.engine["why"]


def test_clipping_bounds_every_example_norm():
    grads = {"a": torch.randn(16, 5, 3) * 10, "b": torch.randn(16, 7) * 0.01}
    factors = []
    for i in range(16):
        single = {name: g[i:i + 1] for name, g in grads.items()}
        summed, norms = clipped_sum(single, 1.0)
        clipped_norm = torch.sqrt(sum(v.pow(2).sum() for v in summed.values()))
        assert clipped_norm <= 1.0 + 1e-5
        factors.append(min(1.0, 1.0 / norms.item()))
    total, _ = clipped_sum(grads, 1.0)
    expected = sum(grads["b"][i] * factors[i] for i in range(16))
    assert torch.allclose(total["b"], expected, atol=1e-6)


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.weight * x).sum()


def test_noise_std_is_sigma_c_over_expected_batch_and_every_step_is_recorded():
    model, ledger = Linear(), PrivacyLedger()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    settings = DpsgdSettings(noise_multiplier=3.0, clip=0.5, sample_rate=0.1, physical_batch_size=7)
    engine = DPSGD(model, optimizer, lambda f, x: f(x) * 0.0, settings=settings, num_records=200, ledger=ledger,
                   stage="dp-sgd", noise=secret_stream())
    updates = []
    for _ in range(5):
        before = model.weight.detach().clone()
        stats = engine.step(lambda idx: (torch.ones(len(idx), 2000),))
        updates.append(before - model.weight.detach())
        assert stats["grad_norm"] == 0.0
    assert torch.cat(updates).std().item() == pytest.approx(3.0 * 0.5 / (0.1 * 200), rel=0.03)
    assert ledger.events() == [SubsampledGaussianMechanism(3.0, 0.1, steps=5)]


def test_clipped_signal_survives_without_noise_budget():
    """With a huge batch and tiny noise the step follows the clipped mean gradient direction."""
    model = Linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    engine = DPSGD(model, optimizer, lambda f, x: f(x), settings=DpsgdSettings(1e-6, 1.0, 1.0, 64), num_records=100,
                   ledger=PrivacyLedger(), stage="dp-sgd", noise=secret_stream())
    engine.step(lambda idx: (torch.full((len(idx), 2000), 5.0),))
    # each example's gradient (all 5s) is clipped to norm 1: entries 1/sqrt(2000); mean over q N = 100
    assert torch.allclose(-model.weight.detach(), torch.full((2000,), 2000 ** -0.5), rtol=1e-3)


def test_ema_warms_up_then_tracks_parameters_and_round_trips():
    model = Linear()
    ema = EMA(model, decay=0.5)
    with torch.no_grad():
        model.weight.fill_(2.0)
    ema.update(model)  # first update: decay min(0.5, 1/10) = 0.1
    assert torch.allclose(ema.shadow["weight"], torch.full((2000,), 1.8))
    ema.update(model)  # then min(0.5, 2/11)
    assert torch.allclose(ema.shadow["weight"], torch.full((2000,), 2.0 - 0.2 * 2 / 11))
    restored = EMA(Linear(), decay=0.5)
    restored.load_state_dict(ema.state_dict())
    assert restored.updates == 2 and torch.equal(restored.shadow["weight"], ema.shadow["weight"])


class Shift(nn.Module):
    """out = x + bias: the gradient with respect to ``bias`` is the gradient with respect to the output."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(3, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


def test_clip_gradient_bounds_each_examples_output_gradient_and_keeps_small_ones():
    model, clip = Shift(), 0.5
    targets = torch.cat([torch.randn(6, 3, 4) * 100, torch.randn(6, 3, 4) * 1e-3])  # large and small gradients

    def loss(model_fn, target, *, bound=clip):
        return (clip_gradient(model_fn(torch.zeros(3, 4)), bound) - target).pow(2).sum()

    params = {n: p.detach() for n, p in model.named_parameters()}
    clipped = per_example_gradients(model, loss, params, {}, (targets,))["bias"].flatten(1).norm(dim=1)
    raw = per_example_gradients(model, lambda f, t: loss(f, t, bound=float("inf")), params, {},
                                (targets,))["bias"].flatten(1).norm(dim=1)
    assert (clipped <= clip * (1 + 1e-6)).all()
    assert torch.allclose(clipped[:6], torch.full((6,), clip))  # the large ones are clipped to exactly C
    assert torch.allclose(clipped[6:], raw[6:])  # the small ones pass unchanged


def test_a_non_private_step_adds_no_noise_and_is_recorded_as_such():
    model, ledger = Linear(), PrivacyLedger()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    engine = DPSGD(model, optimizer, lambda f, x: f(x) * 0.0, settings=DpsgdSettings(None, 0.5, 0.1),
                   num_records=200, ledger=ledger, stage="teacher", noise=secret_stream())
    engine.step(lambda idx: (torch.ones(len(idx), 2000),))
    engine.step(lambda idx: (torch.ones(len(idx), 2000),))
    assert torch.count_nonzero(model.weight) == 0
    assert ledger.events() == [NonPrivateAccess(2)]
