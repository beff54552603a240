"""Device-generic code without a GPU: the DP-SGD step and sampling on the ``meta`` device (any tensor left on the
CPU, any host synchronisation raises there), every random draw from a named CPU generator, OOM errors that
say what to lower, ``dpsynth doctor`` and resuming with other memory settings.

What this cannot check here: CUDA kernels themselves, NCCL, bf16/fp16 choices on a real GPU, pinned-memory
copies (``to_device`` takes its CUDA branch only on a GPU) and the paper presets' memory on a card."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from conftest import assert_report_matches, secret_stream, stopped_smoke_run

import dpsynth
from dpsynth.cli import main
from dpsynth.diffusion import Diffusion
from dpsynth.diffusion.ddpm import SAMPLERS
from dpsynth.errors import OutOfMemory
from dpsynth.methods import METHODS
from dpsynth.models import build_unet
from dpsynth.privacy import PrivacyLedger
from dpsynth.privacy.dpsgd import DPSGD, EMA, DpsgdSettings
from dpsynth.utils.device import memory_limited_by, to_device

META = torch.device("meta")
RANDOM_FACTORIES = {"rand", "randn", "randint", "randperm", "multinomial", "normal", "bernoulli", "poisson"}


def _meta_unet() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_unet(1, 8, 10, [8, 16], 1, True, 4).to(META)


@pytest.mark.parametrize("engine", ["vmap", "batched"])
def test_a_dp_sgd_step_stays_on_the_device_without_host_synchronisation(engine: str):
    model, diffusion = _meta_unet(), Diffusion(prediction="v")
    images, labels, generator = torch.rand(50, 1, 8, 8), torch.randint(0, 10, (50,)), torch.Generator().manual_seed(0)

    def make_batch(indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        times, noise = diffusion.training_inputs(len(indices), 2, (1, 8, 8), generator)
        return tuple(to_device(t, META) for t in (images[indices], labels[indices], times, noise))

    dpsgd = DPSGD(model, torch.optim.Adam(model.parameters()), diffusion.example_loss,
                  settings=DpsgdSettings(1.0, 1.0, 0.3, 8), num_records=50, ledger=PrivacyLedger(), stage="dp-sgd",
                  noise=secret_stream(), generator=generator,
                  batch_loss=diffusion.example_losses if engine == "batched" else None)
    if engine == "batched":  # the probe that picks it compares numbers once per run, which meta cannot
        dpsgd.engine = {"per_example": "batched", "why": "set by the test"}
    ema = EMA(model, 0.99)
    stats = dpsgd.step(make_batch)
    ema.update(model)
    assert stats["grad_norm"].device == META and stats["nonfinite_dropped"].device == META
    assert all(p.device == META for p in model.parameters()) and dpsgd.engine["per_example"] == engine


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_sampling_with_guidance_stays_on_the_device(sampler: str):
    diffusion = Diffusion(prediction="v")
    images = diffusion.denoise(_meta_unet().eval(), torch.arange(6) % 10, (1, 8, 8), 10,
                               diffusion.scheduler(sampler, 3), 1.0, torch.Generator().manual_seed(0))
    assert images.device == META and images.shape == (6, 1, 8, 8)


def _calls(name: str) -> list[tuple[Path, ast.Call]]:
    """Every ``torch.<name>(...)`` call in the package's source."""
    found = []
    for path in Path(dpsynth.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == name \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch":
                found.append((path, node))
    return found


def test_every_random_draw_names_a_cpu_generator():
    """Draws come from explicit CPU generators (secret streams) and are moved afterwards: the same numbers on
    every device, and no device generator whose state a checkpoint would have to carry."""
    draws = [(path, call) for name in RANDOM_FACTORIES for path, call in _calls(name)]
    assert len(draws) > 20
    keywords = {(f"{path.name}:{call.lineno}", tuple(sorted(k.arg for k in call.keywords if k.arg))) for path, call
                in draws}
    assert [site for site, names in keywords if "generator" not in names or "device" in names] == []
    assert [f"{path.name}:{call.lineno}" for path, call in _calls("Generator") if call.args or call.keywords] == []


def test_running_out_of_memory_names_the_setting_to_lower_and_the_run_to_resume():
    with pytest.raises(OutOfMemory, match=r"lower dpsgd.physical_batch_size \(now 64.*--set "
                                          r"dpsgd.physical_batch_size=32") as caught:
        with memory_limited_by("dpsgd.physical_batch_size", 64, "taking DP-SGD steps"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    named = str(caught.value.in_run("runs/dpdm-cifar10-eps10-20261125-120000"))  # as the pipeline re-raises it
    assert "e.g. dpsynth run --resume runs/dpdm-cifar10-eps10-20261125-120000 --set dpsgd.physical_batch_size=32" \
        in named and "RUN_DIR" not in named


def test_doctor_passes_every_method_on_the_cpu_and_each_run_has_its_report(capsys: pytest.CaptureFixture[str],
                                                                          tmp_path: Path):
    assert main(["doctor", "--device", "cpu", "--keep", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "dpsynth doctor on cpu" and len(lines) == 1 + len(METHODS)
    for line, method in zip(lines[1:], sorted(METHODS), strict=True):
        assert line.split()[:2] == [method, "ok"] and "resumed" in line and line.endswith("on cpu"), line
        assert ("its model reloaded and drew 7 more" in line) == (METHODS[method].no_generator is None), line
    runs = sorted(path.parent.parent for path in tmp_path.rglob("release/privacy.json"))
    assert len(runs) == len(METHODS)
    for run in runs:  # written at release: the evaluation is disabled in the doctor's runs
        shown = assert_report_matches(run)
        assert "Not evaluated yet: dpsynth evaluate" in shown["text"] and "Samples per class" in shown["text"]


def test_a_resumed_run_may_lower_memory_settings_and_nothing_else(tmp_path: Path):
    run = stopped_smoke_run("dpdm", tmp_path, epsilon=8)
    config = run.config()
    assert main(["run", "--resume", str(run.path), "--set", "dpsgd.lr=0.1"]) == 2
    assert main(["run", "--resume", str(run.path), "--dataset", "mnist-5k"]) == 2
    assert main(["run", "--resume", str(run.path), "--set", "dpsgd.physical_batch_size=4",
                 "--set", "sampling.batch_size=7"]) == 0
    resumed = run.config()
    assert (resumed["dpsgd"]["physical_batch_size"], resumed["sampling"]["batch_size"], resumed["dpsgd"]["lr"]) == \
        (4, 7, config["dpsgd"]["lr"])
    assert (run.path / "release" / "synthetic.npz").is_file()
