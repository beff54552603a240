"""One image file as the square uint8 array a dataset holds: 8-bit images as they are; 16-bit PNG and TIFF scans
and DICOM files (their rescale slope and intercept applied) mapped to 8 bits through a window, never clipped by a
mode conversion."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError

DICOM_SUFFIXES = frozenset({".dcm", ".dicom"})
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
                           | DICOM_SUFFIXES)
GREY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
HIGH_DEPTH_MODES = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
SIXTEEN_BITS = (0.0, 65535.0)
# A high-depth image's own low and high values, for the DP vote on a window: its 1st and 99th percentiles.
VOTE_PERCENTILES = (1.0, 99.0)
Window = tuple[float, float]


@dataclass(frozen=True)
class Scan:
    """An opened image: a PIL image (``L`` or ``RGB`` for 8 bits, ``F`` holding the values of a high-depth one)
    and, for a high-depth image, the range its stored type can hold, in its values' units (16 bits for PNG and
    TIFF; a DICOM file's bits stored through its rescale) and a DICOM file's own window where it states one."""

    image: Any
    full_range: Window | None = None
    window: Window | None = None  # a DICOM file's own window (Window Center and Width), in its values' units

    def share(self, values: np.ndarray) -> np.ndarray:
        """``values`` as shares of the full range (0: its low end, 1: its high end)."""
        assert self.full_range is not None
        low, high = self.full_range
        return (values - low) / (high - low)


DICOM_PREAMBLE = 128  # bytes before a DICOM file's "DICM" marker (PS3.10, 7.1)
PYDICOM_HINT = ("reading DICOM files needs pydicom: pip install pydicom into dpsynth's environment (.venv/bin/pip "
                "install pydicom; from a source checkout, pip install -e '.[dicom]')")


def is_dicom(path: Path) -> bool:
    """Whether ``path`` is a DICOM file: by its suffix, or, whatever its suffix (PACS exports often have none), by
    the "DICM" marker after its 128-byte preamble."""
    if path.suffix.lower() in DICOM_SUFFIXES:
        return True
    try:
        with path.open("rb") as handle:
            head = handle.read(DICOM_PREAMBLE + 4)
    except OSError:
        return False
    return head[DICOM_PREAMBLE:] == b"DICM"


def is_image(path: Path) -> bool:
    """Whether ``path`` is a file dpsynth reads as an image: an image format's suffix, or a DICOM file."""
    return path.suffix.lower() in IMAGE_SUFFIXES or is_dicom(path)


def open_scan(path: Path, channels: int) -> Scan:
    """``path`` opened for ``channels`` (1: grey, 3: RGB; a high-depth image stays one channel of values);
    DataError naming the file when it cannot be read."""
    from PIL import Image, UnidentifiedImageError

    try:
        if is_dicom(path):
            return _dicom_scan(path, channels)
        with Image.open(path) as opened:
            if opened.mode in HIGH_DEPTH_MODES:
                return Scan(Image.fromarray(np.asarray(opened, dtype=np.float32), "F"), SIXTEEN_BITS)
            return Scan(opened.convert("L" if channels == 1 else "RGB"))
    except (UnidentifiedImageError, OSError, ValueError, AttributeError, KeyError) as exc:
        raise DataError(f"{path}: unreadable image file ({exc})") from None


def _dicom_scan(path: Path, channels: int) -> Scan:
    """A single-frame DICOM file: colour as 8-bit RGB; grey as its values after the rescale slope and intercept
    (MONOCHROME1, where low values are bright, turned so that high values are bright)."""
    from PIL import Image

    try:
        import pydicom
        from pydicom.pixels import apply_rescale
    except ImportError:
        raise DataError(f"{path}: {PYDICOM_HINT}") from None
    try:
        dataset = pydicom.dcmread(path)
        pixels = dataset.pixel_array
    except (pydicom.errors.InvalidDicomError, AttributeError, ValueError, NotImplementedError, RuntimeError) as exc:
        raise DataError(f"{path}: unreadable DICOM file ({exc})") from None
    if int(getattr(dataset, "NumberOfFrames", 1) or 1) > 1:
        raise DataError(f"{path}: a DICOM file of {dataset.NumberOfFrames} frames; dpsynth reads single-frame "
                        "images (save each frame as its own file)")
    if int(getattr(dataset, "SamplesPerPixel", 1)) == 3:
        return Scan(Image.fromarray(pixels.astype(np.uint8), "RGB").convert("L" if channels == 1 else "RGB"))
    bits, signed = int(dataset.BitsStored), int(getattr(dataset, "PixelRepresentation", 0)) == 1
    stored = (-(2.0 ** (bits - 1)), 2.0 ** (bits - 1) - 1) if signed else (0.0, 2.0 ** bits - 1)
    values = apply_rescale(pixels, dataset).astype(np.float32)
    low, high = sorted(float(apply_rescale(np.array(stored), dataset)[i]) for i in (0, 1))
    window = _own_window(dataset)
    if getattr(dataset, "PhotometricInterpretation", "") == "MONOCHROME1":
        values = low + high - values
        window = None if window is None else (low + high - window[1], low + high - window[0])
    return Scan(Image.fromarray(values, "F"), (low, high), window)


def _own_window(dataset: Any) -> Window | None:
    """A DICOM file's window (its first Window Center and Width, in rescaled units), or None without one."""
    center, width = getattr(dataset, "WindowCenter", None), getattr(dataset, "WindowWidth", None)
    if center is None or width is None:
        return None
    center, width = (float(value[0] if hasattr(value, "__len__") and not isinstance(value, str) else value)
                     for value in (center, width))
    return (center - width / 2, center + width / 2) if width > 0 else None


@dataclass(frozen=True)
class WindowRule:
    """How a high-depth image's values map to 8 bits: linearly from a window to 0 .. 255, values outside it at its
    ends. The window is ``declared`` (in the images' units: raw values, Hounsfield units), else each DICOM file's
    ``own`` (where it states one), else ``shares`` of each image's full range (a DP vote's; (0, 1): the full range
    itself)."""

    declared: Window | None = None
    shares: Window = (0.0, 1.0)
    own: bool = False  # each DICOM file's own window where it states one (a per-file map: no ε)

    def of(self, scan: Scan) -> Window:
        """The window of ``scan`` (a high-depth image)."""
        if self.declared is not None:
            return self.declared
        if self.own and scan.window is not None:
            return scan.window
        assert scan.full_range is not None
        low, high = scan.full_range
        return low + self.shares[0] * (high - low), low + self.shares[1] * (high - low)

    def words(self) -> str:
        """The rule in words, for data info and the datasheet."""
        if self.declared is not None:
            return f"16-bit and DICOM values map to 8 bits from the declared window {list(self.declared)}"
        if self.own:
            return ("DICOM values map to 8 bits through each file's own window (its Window Center and Width), "
                    "16-bit images and DICOM files without one from their type's full range")
        if self.shares == (0.0, 1.0):
            return "16-bit and DICOM values map to 8 bits from their type's full range"
        return (f"16-bit and DICOM values map to 8 bits from {self.shares[0]:.3g} to {self.shares[1]:.3g} of their "
                "type's full range")


def square_pixels(scan: Scan, resolution: int, channels: int, window: WindowRule, path: Path) -> np.ndarray:
    """``scan`` resized (bicubic) so its short side is ``resolution``, centre-cropped square, as uint8 C x H x W; a
    high-depth image's values mapped to 8 bits by ``window``."""
    from PIL import Image

    image = scan.image
    scale = resolution / min(image.size)
    size = (max(resolution, round(image.width * scale)), max(resolution, round(image.height * scale)))
    image = image.resize(size, Image.Resampling.BICUBIC)
    left, top = (image.width - resolution) // 2, (image.height - resolution) // 2
    array = np.asarray(image.crop((left, top, left + resolution, top + resolution)))
    if scan.full_range is not None:
        low, high = window.of(scan)
        if not high > low:
            raise DataError(f"{path}: window [{low}, {high}] is empty; its high end must lie above its low end")
        array = np.clip(np.round((array.astype(np.float64) - low) * (255.0 / (high - low))), 0, 255).astype(np.uint8)
        if channels == 3:
            array = np.repeat(array[..., None], 3, axis=2)
    array = array.astype(np.uint8)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)


def window_shares(scan: Scan) -> tuple[float, float] | None:
    """A high-depth image's own low and high values (:data:`VOTE_PERCENTILES`) as shares of its full range,
    within [0, 1]; None for an 8-bit image (it casts no vote on the window)."""
    if scan.full_range is None:
        return None
    low, high = np.percentile(np.asarray(scan.image, dtype=np.float64), VOTE_PERCENTILES)
    return tuple(float(share) for share in np.clip(scan.share(np.array([low, high])), 0.0, 1.0))  # type: ignore[return-value]
