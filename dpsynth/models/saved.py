"""A model trained on PUBLIC images only and kept in a folder, as the release's upscaler and DP-LDM's autoencoder
are: ``KIND.safetensors`` (the weights, whose SHA-256 names the model in a release), ``KIND.json`` (its shape, and
how and on which public images it was trained) and ``fingerprints.npy`` (those images' fingerprints, so a run
checks that none of them is a private image).
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..data.fingerprints import FINGERPRINTS, fingerprints, load_fingerprints
from ..errors import ConfigError, DataError
from ..utils.io import sha256


@dataclass(frozen=True)
class SavedModel:
    """A saved public model: the model, its folder, its record (the card) and the SHA-256 of its weights.
    Subclasses name their ``kind`` (the files' stem) and the ``command`` that writes one."""

    model: nn.Module
    folder: Path
    record: dict[str, Any]
    weights_sha256: str
    kind: ClassVar[str] = "model"
    command: ClassVar[str] = "dpsynth pretrain"

    @property
    def name(self) -> str:
        return str(self.record.get("name") or self.folder.name)

    def fingerprints(self) -> np.ndarray:
        """The fingerprints of the public images it was trained on (DataError when the folder lacks them)."""
        prints = load_fingerprints(self.folder, self.record.get("fingerprints"))
        if prints is None:
            raise DataError(f"{self.folder}: no {FINGERPRINTS}: nothing shows that the {self.kind}'s training images "
                            f"are not private ones; write it again with {self.command}")
        return prints

    @classmethod
    def files(cls) -> tuple[str, str]:
        """The weights' and the card's file names."""
        return f"{cls.kind}.safetensors", f"{cls.kind}.json"


def fresh_folder(out: str | Path) -> Path:
    """``out`` as a path; ConfigError when it is a folder that is not empty (a model is never written over one)."""
    out = Path(out).expanduser()
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out}: the directory exists and is not empty; choose a new one")
    return out


def save_model(saved: type[SavedModel], model: nn.Module, shape: Any, record: dict[str, Any],
               public: Sequence[torch.Tensor], out: Path) -> None:
    """Write ``model`` (its weights), ``shape`` (a dataclass) with ``record`` (the card) and the fingerprints of the
    ``public`` images it was trained on into the folder ``out``, whole or not at all (written beside it, then
    renamed)."""
    weights, card = saved.files()
    prints = np.unique(np.concatenate([fingerprints(images) for images in public]))
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_file({name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()},
              str(partial / weights))
    (partial / card).write_text(json.dumps({"shape": asdict(shape), **record, "fingerprints": len(prints)},
                                           indent=1) + "\n")
    np.save(partial / FINGERPRINTS, prints)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)


def read_model(saved: type[SavedModel], folder: str | Path, setting: str,
               build: Callable[[dict[str, Any]], nn.Module]) -> tuple[nn.Module, Path, dict[str, Any], str]:
    """The model saved in ``folder`` (``build(card)`` makes it, raising ValueError, KeyError or TypeError for a
    card it cannot read), its folder, card and weights' SHA-256; ConfigError naming ``setting`` otherwise."""
    folder = Path(folder).expanduser()
    weights, card = saved.files()
    if not (folder / weights).is_file() or not (folder / card).is_file():
        raise ConfigError(f"{setting}: {folder} holds no {saved.kind} (expected {weights} and {card}); write one with "
                          f"{saved.command} --dataset PUBLIC --out DIR")
    try:
        record = json.loads((folder / card).read_text())
        model = build(record)
        model.load_state_dict(load_file(str(folder / weights)))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise ConfigError(f"{setting}: {folder / card} or {weights} is damaged ({exc})") from None
    return model.eval(), folder, record, sha256(folder / weights)
