"""Your own images: a folder with one sub-folder per class, each person's images in a sub-folder of their own (or
named in ``groups.csv``); 8-bit images, 16-bit PNG and TIFF scans and DICOM files; decoded in parallel processes
and cached per folder, so a second run reads them back from a memory map."""
from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import stat
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..errors import DataError
from .base import RawDataset
from .pixels import (
    GREY_MODES,
    HIGH_DEPTH_MODES,
    IMAGE_SUFFIXES,
    Window,
    WindowRule,
    is_dicom,
    is_image,
    open_scan,
    square_pixels,
    window_shares,
)
from .sources import AUTO, LoadOptions, group_ids, require_dir

FOLDER_HINT = "a directory with one sub-folder of images per class"
GROUPS_CSV = "groups.csv"
LABELS_CSV = "labels.csv"  # a patient-first folder: person,label per top-level sub-folder
PERSON_FOLDERS = "a sub-folder per person"
PERSON_FIRST = f"a folder per person, labelled in {LABELS_CSV}"
# The resolutions a folder is read at when dataset.resolution is auto: the largest not above the images' median
# short side (the smallest where they are smaller); above the last, set dataset.resolution yourself. With
# dataset.channels auto, a folder is read in colour when at least COLOUR_SHARE of its images have colour (a
# majority: the rule furthest from both an all-grey and an all-colour folder, so the least swayed by noise).
FOLDER_SIDES = (28, 32, 64, 128)
COLOUR_SHARE = 0.5
# The bins of the vote on a 16-bit window (dataset.window auto): each high-depth image votes for the bins of its own
# low and high values as shares of its type's full range (dpsynth.data.pixels.window_shares).
WINDOW_BINS = 32
WINDOW_QUANTILES = (0.1, 0.9)  # of the lows and of the highs: the window keeps most images' own range
WINDOW_MIN_SHARE = 0.05  # of the votes' weight from high-depth images, below which the full range is used
# Below this many images a folder is decoded and voted on in this process (starting workers costs more than it
# saves).
PARALLEL_FROM = 2000
CACHE_VERSION = 2  # of the decoded-array cache's layout and of the decoding itself
PARTIAL = ".partial"  # the suffix of a cache file still being decoded, after its writer's process id
T = TypeVar("T")


@dataclass(frozen=True)
class FolderLayout:
    """A class folder's image files, their labels, the class names (the sub-folders' names, in order), each file's
    group where the folder names them (``group_source``: groups.csv or a sub-folder per person) and the files
    whose suffix is no image format's (skipped, named by ``dpsynth data info``)."""

    root: Path
    files: list[Path]
    labels: list[int]
    class_names: list[str]
    groups: np.ndarray | None
    group_source: str | None
    skipped: list[Path]


def _visible(path: Path, root: Path) -> bool:
    return not any(part.startswith(".") for part in path.relative_to(root).parts)


def folder_layout(root: Path) -> FolderLayout:
    """The layout of ``root``: ``class/image`` or ``class/person/...image`` (every image under a person's folder, at
    any depth, is that person's; the same folder name under two classes is the same person). A class folder may be
    empty (a folder names a class whether or not it holds images); DataError when no folder holds an image or one
    holds both images and person folders. With ``labels.csv`` the folder is patient-first instead
    (:func:`person_first_layout`)."""
    if (root / LABELS_CSV).exists():
        return person_first_layout(root)
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not class_dirs:
        raise DataError(f"{root}: no class sub-folders found ({FOLDER_HINT})")
    files, labels, people, skipped = [], [], [], []
    for label, class_dir in enumerate(class_dirs):
        entries = sorted(p for p in class_dir.iterdir() if not p.name.startswith("."))
        persons = [p for p in entries if p.is_dir()]
        found = [p for p in entries if p.is_file() and is_image(p)]
        if persons and found:
            raise DataError(f"{class_dir}: holds both image files ({found[0].name}) and sub-folders "
                            f"({persons[0].name}/); keep either the images of a class or a sub-folder per person")
        skipped += [p for p in entries if p.is_file() and p not in found]
        for person in persons:
            inside = sorted(p for p in person.rglob("*") if p.is_file() and _visible(p, root))
            owned = [p for p in inside if is_image(p)]
            skipped += [p for p in inside if p not in owned]
            found += owned
            people += [person.name] * len(owned)
        if not found:
            warnings.warn(f"{class_dir}: class folder holds no image files; the class is kept (a folder names a "
                          "class whether or not it holds images, so a neighbouring set has the same classes)",
                          stacklevel=4)
        files += found
        labels += [label] * len(found)
    if not files:
        raise DataError(f"{root}: its class folders hold no image files ({', '.join(sorted(IMAGE_SUFFIXES))}, or "
                        "DICOM files of any name)")
    groups, source = _groups(root, files, people)
    return FolderLayout(root, files, labels, [p.name for p in class_dirs], groups, source, skipped)


def person_first_layout(root: Path) -> FolderLayout:
    """The layout of a patient-first folder: ``person/...image`` (any depth), each person's class in ``labels.csv``
    (columns ``person`` and ``label``; the classes are its labels, sorted); DataError naming a person folder the
    table does not label, a person it lists twice, or a table without those columns."""
    table = _labels_table(root / LABELS_CSV)
    class_names = sorted(set(table.values()))
    people = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    unlabelled = [person.name for person in people if person.name not in table]
    if unlabelled:
        raise DataError(f"{root / LABELS_CSV}: no label for {len(unlabelled)} person folder(s), e.g. "
                        f"{unlabelled[0]}; every folder of {root} needs a row person,label")
    files, labels, owners, skipped = [], [], [], []
    for person in people:
        inside = sorted(p for p in person.rglob("*") if p.is_file() and _visible(p, root))
        owned = [p for p in inside if is_image(p)]
        skipped += [p for p in inside if p not in owned]
        files += owned
        labels += [class_names.index(table[person.name])] * len(owned)
        owners += [person.name] * len(owned)
    if not files:
        raise DataError(f"{root}: its person folders hold no image files ({', '.join(sorted(IMAGE_SUFFIXES))}, or "
                        "DICOM files of any name)")
    groups = group_ids(np.array(owners), len(files), f"{root}: person folders")
    return FolderLayout(root, files, labels, class_names, groups, PERSON_FIRST, skipped)


def _labels_table(path: Path) -> dict[str, str]:
    """``labels.csv``'s label of each person; DataError for a missing column, a person listed twice or no row."""
    table = _csv_map(path, "person", "label")
    if not table:
        raise DataError(f"{path}: no rows; list each person folder's label as person,label")
    return table


def _csv_map(path: Path, key: str, value: str) -> dict[str, str]:
    """The ``value`` column of a CSV file by its ``key`` column; DataError for a missing column or a repeated key."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or not {key, value} <= set(reader.fieldnames):
            raise DataError(f"{path}: expected a header with columns {key},{value} (found {reader.fieldnames})")
        table: dict[str, str] = {}
        for row in reader:
            if row[key] in table:
                raise DataError(f"{path}: {row[key]} is listed twice")
            table[row[key]] = row[value]
    return table


def _groups(root: Path, files: list[Path], people: list[str]) -> tuple[np.ndarray | None, str | None]:
    """Each file's group: from ``groups.csv`` where there is one, else from the person folders (DataError when
    only some classes have them), else none."""
    listed = folder_groups(root, files)
    if listed is not None:
        return listed, GROUPS_CSV
    if not people:
        return None, None
    if len(people) < len(files):
        flat = next(file for file in files if file.parent.parent == root)
        raise DataError(f"{flat.parent}: holds its images directly while other class folders hold a sub-folder per "
                        f"person; use one layout (or name every image's person in {root / GROUPS_CSV})")
    return group_ids(np.array(people), len(files), f"{root}: person folders"), PERSON_FOLDERS


def folder_groups(root: Path, files: list[Path]) -> np.ndarray | None:
    """Each file's group from ``root/groups.csv`` (columns ``file`` and ``group``; files relative to ``root``, as
    ``class/name.png``), or None without that file; DataError naming a file it does not list, or lists twice."""
    path = root / GROUPS_CSV
    if not path.exists():
        return None
    listed = _csv_map(path, "file", "group")
    names = [file.relative_to(root).as_posix() for file in files]
    unlisted = [name for name in names if name not in listed]
    if unlisted:
        raise DataError(f"{path}: no group for {len(unlisted)} image(s), e.g. {unlisted[0]}; every image needs one")
    return group_ids(np.array([listed[name] for name in names]), len(names), str(path))


def _checked_layout(options: LoadOptions) -> FolderLayout:
    """The layout of ``options``' folder; DataError for settings a folder cannot take."""
    root = require_dir(options.data_dir, "folder", FOLDER_HINT)
    if options.channels not in (1, 3, AUTO):
        raise DataError(f"dataset 'folder': channels must be 1 (grayscale), 3 (RGB) or auto, got {options.channels}")
    if options.resolution != AUTO and (not isinstance(options.resolution, int) or options.resolution < 1):
        raise DataError(f"dataset 'folder': resolution must be a positive integer or auto, got {options.resolution}")
    return folder_layout(root)


def load_folder(options: LoadOptions) -> RawDataset:
    """One sub-folder per class of image files, resized and centre-cropped to a square resolution. A setting left
    ``auto`` (resolution, channels and with them the window) follows the exact vote of the images
    (:func:`folder_votes`), which is private: a run decides it by a DP vote instead and passes the result in
    ``options``."""
    layout = _checked_layout(options)
    side, channels, decision, voted = options.resolution, options.channels, None, None
    if AUTO in (side, channels):
        votes = shape_votes(layout.files, layout.groups, side, channels, options.window == AUTO)
        side, channels = votes.decide()
        voted = votes.window()
        decision = (f"{channels} x {side} x {side} by the exact vote of the images, private: a run decides it by a "
                    "DP vote instead (stage dataset-shape); dataset.resolution and dataset.channels declare it")
    rule = options.window_rule(voted)
    images = decoded_images(layout.files, int(side), int(channels), rule, options.cache_dir)
    return RawDataset(images, np.asarray(layout.labels, dtype=np.int64), layout.class_names, str(layout.root),
                      shape_decision=decision, groups=layout.groups, pixel_rule=rule.words(),
                      group_source=layout.group_source, skipped=tuple(str(p) for p in layout.skipped))


def folder_votes(options: LoadOptions) -> ShapeVotes:
    """The exact votes of a class folder's images on the settings of ``options`` left ``auto``
    (:func:`shape_votes`): private, for a DP mechanism to release."""
    layout = _checked_layout(options)
    return shape_votes(layout.files, layout.groups, options.resolution, options.channels, options.window == AUTO)


@dataclass(frozen=True)
class ShapeVotes:
    """A folder's images as votes on the settings left ``auto`` (a declared setting has one candidate and no votes):
    ``by_side[s]`` is the weight of the images whose short side falls in the bin of ``sides[s]`` (at least that
    side, below the next; the first bin takes every smaller one), ``by_colour`` the weight of grey and of coloured
    images, and with the window voted, ``by_low`` and ``by_high`` the weight of the high-depth images whose low and
    high values fall in each of :data:`WINDOW_BINS` shares of their full range (8-bit images cast no window vote).
    Each image weighs 1 / its group's images, so one unit moves each vector by at most 1 in L2 norm and all of
    them together by at most :attr:`sensitivity`."""

    sides: tuple[int, ...]
    channels: tuple[int, ...]
    by_side: np.ndarray
    by_colour: np.ndarray
    by_low: np.ndarray = field(default_factory=lambda: np.zeros(0))
    by_high: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def vectors(self) -> tuple[np.ndarray, ...]:
        return self.by_side, self.by_colour, self.by_low, self.by_high

    @property
    def sensitivity(self) -> float:
        return math.sqrt(sum(len(vector) > 0 for vector in self.vectors))

    def noisy(self, draw: Callable[[int], np.ndarray]) -> ShapeVotes:
        """These votes plus ``draw(n)`` (n noise values) on each vector."""
        return replace(self, **{name: vector + draw(len(vector)) for name, vector in
                                zip(("by_side", "by_colour", "by_low", "by_high"), self.vectors, strict=True)})

    def decide(self) -> tuple[int, int]:
        """(side, channels) from the votes, exact or noisy: the side whose bin holds the median vote, and colour
        when at least :data:`COLOUR_SHARE` of the votes have it."""
        side = self.sides[0]
        if len(self.by_side):
            side = self.sides[_quantile_bin(self.by_side)]
        colour = len(self.by_colour) > 0 and self.by_colour[1] >= COLOUR_SHARE * self.by_colour.sum()
        return side, self.channels[-1] if colour else self.channels[0]

    def window(self) -> Window | None:
        """The window as shares of the full range, from the votes: from the low edge of the bin that holds the
        :data:`WINDOW_QUANTILES` low quantile of the lows to the high edge of the bin that holds the high quantile
        of the highs (so most images keep their range); None (the full range is used) where the window was not voted
        on, the votes cross, or high-depth images weigh less than :data:`WINDOW_MIN_SHARE` of the votes (as in a
        folder of 8-bit images, which cast no window vote)."""
        if not len(self.by_low) or self.by_low.sum() < WINDOW_MIN_SHARE * self.total():
            return None
        low = _quantile_bin(self.by_low, WINDOW_QUANTILES[0]) / WINDOW_BINS
        high = (_quantile_bin(self.by_high, WINDOW_QUANTILES[1]) + 1) / WINDOW_BINS
        return (low, min(high, 1.0)) if high > low else None

    def total(self) -> float:
        """The votes' total weight (of whichever vector there is)."""
        return float(self.by_side.sum() if len(self.by_side) else self.by_colour.sum())


def _quantile_bin(weights: np.ndarray, quantile: float = 0.5) -> int:
    """The bin that holds ``quantile`` of ``weights`` (noisy weights may be negative; the last bin at most)."""
    return min(int(np.searchsorted(np.cumsum(weights), weights.sum() * quantile)), len(weights) - 1)


def shape_votes(files: list[Path], groups: np.ndarray | None, resolution: int | str, channels: int | str,
                window: bool = False) -> ShapeVotes:
    """The votes of ``files`` (their groups' ids, if any) on the settings left ``auto``: each file's short side, its
    colour (any pixel whose red, green and blue differ) for ``channels`` auto and, with ``window``, a high-depth
    image's low and high values (:func:`~dpsynth.data.pixels.window_shares`)."""
    sides = FOLDER_SIDES if resolution == AUTO else (int(resolution),)
    depths = (1, 3) if channels == AUTO else (int(channels),)
    weights = np.ones(len(files)) if groups is None else 1.0 / np.bincount(groups)[groups]
    by_side, by_colour = np.zeros(len(sides) if resolution == AUTO else 0), np.zeros(2 if channels == AUTO else 0)
    by_low, by_high = np.zeros(WINDOW_BINS if window else 0), np.zeros(WINDOW_BINS if window else 0)
    for index, (short, coloured, shares) in _each_file(_facts_of, files, channels == AUTO, window):
        weight = weights[index]
        if len(by_side):
            by_side[max(int(np.searchsorted(sides, short, "right")) - 1, 0)] += weight
        if len(by_colour):
            by_colour[int(coloured)] += weight
        if shares is not None:
            by_low[min(int(shares[0] * WINDOW_BINS), WINDOW_BINS - 1)] += weight
            by_high[min(int(shares[1] * WINDOW_BINS), WINDOW_BINS - 1)] += weight
    return ShapeVotes(sides, depths, by_side, by_colour, by_low, by_high)


def _facts_of(files: list[Path], colour: bool, window: bool) -> list[tuple[int, bool, Window | None]]:
    return [_image_facts(path, colour, window) for path in files]


def _image_facts(path: Path, colour: bool, window: bool) -> tuple[int, bool, Window | None]:
    """An image file's short side, whether it has colour (asked with ``colour``: never for a grey image, else
    whether any pixel's red, green and blue differ) and, with ``window``, its window shares (None for 8 bits)."""
    from PIL import Image, UnidentifiedImageError

    if is_dicom(path):
        scan = open_scan(path, 3)
        coloured = colour and scan.image.mode == "RGB" and _has_colour(np.asarray(scan.image))
        return min(scan.image.size), coloured, window_shares(scan) if window else None
    try:
        with Image.open(path) as opened:
            short, mode = min(opened.size), opened.mode
            pixels = np.asarray(opened.convert("RGB")) if colour and mode not in GREY_MODES else None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable image file ({exc})") from None
    shares = window_shares(open_scan(path, 1)) if window and mode in HIGH_DEPTH_MODES else None
    return short, pixels is not None and _has_colour(pixels), shares


def _has_colour(pixels: np.ndarray) -> bool:
    """Whether any pixel's red, green and blue differ."""
    return bool((pixels[..., :1] != pixels[..., 1:]).any())


def decoded_images(files: list[Path], side: int, channels: int, rule: WindowRule, cache_dir: str | None
                   ) -> np.ndarray:
    """``files`` as uint8 N x C x side x side (:func:`~dpsynth.data.pixels.square_pixels`), decoded in parallel
    processes for a large folder; kept in ``cache_dir`` (None: no cache), keyed by the files' names, sizes and
    modification times and the shape and window, decoded straight into that file and read back from it as a
    memory map (so a folder larger than memory is never held whole). A new entry, once written, replaces the folder's
    entries of other files (a person removed from the folder leaves no pixels behind); the partial files of writers
    that died mid-decode are removed first."""
    cached = _cache_path(files, side, channels, rule, cache_dir)
    if cached is not None and cached.exists():
        return np.load(cached, mmap_mode="r")
    shape = (len(files), channels, side, side)
    if cached is not None:
        _remove_orphans(cached.parent)
    partial = None if cached is None else _private_file(cached.with_suffix(f".{os.getpid()}{PARTIAL}"))
    images = np.empty(shape, np.uint8) if partial is None else np.lib.format.open_memmap(partial, "w+", np.uint8,
                                                                                       shape)
    try:
        for chunk, part in _in_chunks(_decode_chunk, files, side, channels, rule):
            images[chunk[0]:chunk[-1] + 1] = part  # each part copied as it comes, then dropped
    except BaseException:
        if partial is not None:
            partial.unlink(missing_ok=True)  # no half-decoded private images left behind
        raise
    if partial is None or cached is None:
        return images
    assert isinstance(images, np.memmap)
    images.flush()
    del images
    partial.replace(cached)
    _evict(cached)
    return np.load(cached, mmap_mode="r")


def _in_chunks(function: Callable[..., T], files: list[Path], *args: Any) -> Iterator[tuple[np.ndarray, T]]:
    """(indices, ``function(those files, *args)``) for consecutive chunks of ``files``, in order; in parallel
    processes (one per core) for a folder of :data:`PARALLEL_FROM` files or more."""
    workers = min(len(os.sched_getaffinity(0)), len(files) // (PARALLEL_FROM // 2)) if len(files) >= PARALLEL_FROM \
        else 1
    chunks = [chunk for chunk in np.array_split(np.arange(len(files)), max(1, workers * 8)) if len(chunk)]
    jobs = [([files[i] for i in chunk], *args) for chunk in chunks]
    if workers == 1:
        yield from zip(chunks, (function(*job) for job in jobs), strict=True)
        return
    with ProcessPoolExecutor(workers) as pool:
        yield from zip(chunks, pool.map(function, *zip(*jobs, strict=True)), strict=True)


def _each_file(function: Callable[..., list[T]], files: list[Path], *args: Any) -> Iterator[tuple[int, T]]:
    """(index, result) for each of ``files``, where ``function`` maps a chunk of files to a result each
    (:func:`_in_chunks`)."""
    for chunk, results in _in_chunks(function, files, *args):
        yield from zip(chunk.tolist(), results, strict=True)


def _decode_chunk(files: list[Path], side: int, channels: int, rule: WindowRule) -> np.ndarray:
    return np.stack([square_pixels(open_scan(path, channels), side, channels, rule, path) for path in files])


def _cache_path(files: list[Path], side: int, channels: int, rule: WindowRule, cache_dir: str | None) -> Path | None:
    """Where the decoded array of ``files`` at this shape and window is cached (None without a cache): named by the
    folder, the files (names, sizes, modification times) and the shape and window, in that order."""
    if cache_dir is None:
        return None
    stats = [(str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns) for path in files]
    root = os.path.commonpath([name for name, _, _ in stats]) if stats else ""
    reading = json.dumps([CACHE_VERSION, side, channels, rule.declared, rule.shares, rule.own])
    name = "-".join(_digest(part) for part in (root, json.dumps(stats), reading))
    return Path(cache_dir).expanduser() / f"{name}.npy"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _evict(cached: Path) -> None:
    """Remove the cache's entries of the same folder as ``cached`` with other files (written before it)."""
    folder, files = cached.stem.split("-")[:2]
    for entry in cached.parent.glob(f"{folder}-*.npy"):
        if entry.stem.split("-")[1] != files:
            entry.unlink(missing_ok=True)


def _remove_orphans(cache: Path) -> None:
    """Remove the partial files in ``cache`` whose writer is gone (killed mid-decode)."""
    for entry in cache.glob(f"*{PARTIAL}") if cache.is_dir() else ():
        if not _alive(int(entry.name.split(".")[-2])):
            entry.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clear_cache(cache_dir: str | Path) -> tuple[int, int]:
    """Remove every decoded image and partial file under ``cache_dir``; the number of files and bytes removed."""
    root = Path(cache_dir).expanduser()
    found = [path for path in root.rglob("*") if path.is_file() or path.is_symlink()] if root.is_dir() else []
    size = sum(path.lstat().st_size for path in found)
    for path in found:
        path.unlink(missing_ok=True)
    return len(found), size


def _private_file(path: Path) -> Path:
    """``path``, created new and readable by its owner alone (the images are private), in a folder of its owner's
    that only they can open: DataError for a folder another user owns or a link in place of the folder or file."""
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    status = os.lstat(folder)
    if stat.S_ISLNK(status.st_mode) or status.st_uid != os.getuid():
        raise DataError(f"{folder}: the cache of decoded private images must be a folder of your own, not a link or "
                        "another user's folder; set dataset.cache_dir to a folder only you can open")
    if status.st_mode & 0o077:
        os.chmod(folder, 0o700)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        raise DataError(f"{path}: exists already (a link, or another writer's file); remove it and run again") from None
    return path
