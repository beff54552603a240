"""Scans as hospitals keep them: 16-bit PNG and TIFF and DICOM files mapped to 8 bits by a stated window (declared,
voted with DP, or the full range), a sub-folder per person as groups, files of no image format named, unreadable
ones refused by name, the decoded folder cached and read back as a memory map."""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import dpsynth_main, smoke
from PIL import Image

from dpsynth.api import resolve_config
from dpsynth.data import folder as folder_module
from dpsynth.data import load_dataset
from dpsynth.data.folder import WINDOW_BINS, decoded_images, folder_layout, folder_votes
from dpsynth.data.pixels import WindowRule
from dpsynth.data.sources import LoadOptions
from dpsynth.errors import ConfigError, DataError
from dpsynth.utils.images import as_floats


def write_dicom(path: Path, stored: np.ndarray, bits: int = 12, intercept: float = -1024.0,
                photometric: str = "MONOCHROME2", window: tuple[float, float] | None = None) -> None:
    """A single-frame grey DICOM file of ``stored`` values (unsigned, ``bits`` stored) through pydicom's writer,
    with ``window`` (center, width) as its own window when given."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID = SecondaryCaptureImageStorage, generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    scan = Dataset()
    scan.file_meta = meta
    scan.SOPClassUID, scan.SOPInstanceUID = SecondaryCaptureImageStorage, meta.MediaStorageSOPInstanceUID
    scan.Rows, scan.Columns = stored.shape
    scan.SamplesPerPixel, scan.PhotometricInterpretation = 1, photometric
    scan.BitsAllocated, scan.BitsStored, scan.HighBit, scan.PixelRepresentation = 16, bits, bits - 1, 0
    scan.RescaleSlope, scan.RescaleIntercept = 1, intercept
    scan.PixelData = stored.astype(np.uint16).tobytes()
    if window is not None:
        scan.WindowCenter, scan.WindowWidth = window
    scan.save_as(path, enforce_file_format=True)


def sixteen_bit_folder(root: Path, people: int = 3, per_person: int = 2, low: int = 18000, high: int = 40000,
                       suffix: str = ".png") -> Path:
    """Two classes (class ``b`` brighter) of 16-bit grey scans of 40 x 36 px in a sub-folder per patient."""
    rng = np.random.default_rng(0)
    for label, name in enumerate("ab"):
        for person in range(people):
            folder = root / name / f"patient-{person}"
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(per_person):
                middle = low + (high - low) * (0.3 + 0.4 * label)
                values = np.clip(rng.normal(middle, 2000, (40, 36)), low, high).astype(np.uint16)
                Image.fromarray(values).save(folder / f"scan-{index}{suffix}")
    return root


def test_a_16_bit_scan_is_windowed_never_clipped_white(tmp_path):
    root = sixteen_bit_folder(tmp_path / "scans")
    assert Image.open(next(root.rglob("*.png"))).mode == "I;16"
    full = load_dataset("folder", root, resolution=32, channels=1, window="full")
    images = as_floats(full.train.joined(full.val).joined(full.test).images)
    assert 0.25 < float(images.mean()) < 0.5 and float(images.max()) < 0.65  # 18,000-40,000 of 65,535: not white
    declared = load_dataset("folder", root, resolution=32, channels=1, window=(18000.0, 40000.0))
    spread = as_floats(declared.train.joined(declared.val).joined(declared.test).images)
    assert float(spread.min()) < 0.1 and float(spread.max()) > 0.9  # the declared window spans 0 .. 255
    assert declared.info.pixel_rule.endswith("from the declared window [18000.0, 40000.0]")
    assert full.info.pixel_rule.endswith("from their type's full range")


def test_a_tiff_scan_reads_as_a_png_one(tmp_path):
    png = load_dataset("folder", sixteen_bit_folder(tmp_path / "png"), resolution=28, channels=1, split_seed=1)
    tiff = load_dataset("folder", sixteen_bit_folder(tmp_path / "tiff", suffix=".tif"), resolution=28, channels=1,
                        split_seed=1)
    assert Image.open(next((tmp_path / "tiff").rglob("*.tif"))).mode.startswith("I;16")
    assert np.array_equal(png.train.images.numpy(), tiff.train.images.numpy())


def test_the_window_vote_is_a_vote_of_people_and_finds_the_scans_range(tmp_path, monkeypatch):
    root = sixteen_bit_folder(tmp_path / "scans", people=4, per_person=3)
    votes = folder_votes(LoadOptions(root))
    monkeypatch.setattr(folder_module, "PARALLEL_FROM", 4)  # worker processes vote alike
    assert all(np.array_equal(serial, parallel) for serial, parallel in
               zip(votes.vectors, folder_votes(LoadOptions(root)).vectors, strict=True))
    monkeypatch.undo()
    assert len(votes.by_low) == len(votes.by_high) == WINDOW_BINS and votes.sensitivity == 2.0
    assert votes.by_low.sum() == pytest.approx(4)  # four people (the same names in both classes), twelve scans each
    low, high = votes.window()
    assert 0.25 <= low <= 0.31 and 0.58 <= high <= 0.65  # class a's scans lie near 0.30-0.45, b's near 0.44-0.58
    declared = folder_votes(LoadOptions(root, window=(0.0, 1000.0)))
    assert len(declared.by_low) == 0 and declared.window() is None and declared.sensitivity == np.sqrt(2)
    eight_bit = tmp_path / "eight" / "a"
    eight_bit.mkdir(parents=True)
    Image.fromarray(np.full((30, 30), 9, np.uint8)).save(eight_bit / "x.png")
    assert folder_votes(LoadOptions(eight_bit.parent)).by_low.sum() == 0  # an 8-bit image casts no window vote


def test_dicom_files_are_read_with_their_rescale_and_photometry(tmp_path):
    root = tmp_path / "dicom"
    for label, name in enumerate("ab"):
        (root / name / "p1").mkdir(parents=True)
        write_dicom(root / name / "p1" / "slice.dcm", np.full((30, 34), 1000 + 1000 * label))
    (root / "b" / "p2").mkdir()
    write_dicom(root / "b" / "p2" / "inverted.dcm", np.full((30, 34), 1000), photometric="MONOCHROME1")
    hounsfield = load_dataset("folder", root, resolution=28, channels=1, window=(-1024.0, 976.0), val_size=0,
                              test_size=0)
    by_label = {int(label): float(image.mean()) for image, label in zip(as_floats(hounsfield.train.images),
                                                                        hounsfield.train.labels, strict=True)}
    assert by_label[0] == pytest.approx(1000 / 2000, abs=0.01)  # stored 1000 is -24 HU: mid-window
    full = load_dataset("folder", root, resolution=28, channels=3, window="full", val_size=0, test_size=0)
    means = sorted(float(image.mean()) for image in as_floats(full.train.images))
    assert full.train.images.shape[1:] == (3, 28, 28)
    assert means == pytest.approx([1000 / 4095, 2000 / 4095, (4095 - 1000) / 4095], abs=0.01)  # MONOCHROME1 turned


def test_a_sub_folder_per_person_gives_groups_and_bad_layouts_are_named(tmp_path):
    root = sixteen_bit_folder(tmp_path / "scans")
    (root / "a" / "patient-0" / "notes.txt").write_text("not an image")
    layout = folder_layout(root)
    assert layout.group_source == "a sub-folder per person" and len(set(layout.groups)) == 3
    assert [path.name for path in layout.skipped] == ["notes.txt"]
    nested = root / "a" / "patient-1" / "study-2"
    nested.mkdir()
    Image.fromarray(np.zeros((30, 30), np.uint16)).save(nested / "deep.png")
    deep = folder_layout(root)
    assert deep.groups[deep.files.index(nested / "deep.png")] == deep.groups[deep.files.index(
        root / "a" / "patient-1" / "scan-0.png")]
    Image.fromarray(np.zeros((30, 30), np.uint8)).save(root / "b" / "loose.png")
    with pytest.raises(DataError, match=r"scans/b: holds both image files \(loose.png\) and sub-folders"):
        folder_layout(root)
    (root / "b" / "loose.png").unlink()
    (root / "c").mkdir()
    Image.fromarray(np.zeros((30, 30), np.uint8)).save(root / "c" / "flat.png")
    with pytest.raises(DataError, match="scans/c: holds its images directly while other class folders hold a"):
        folder_layout(root)
    (root / "c" / "flat.png").unlink()
    (root / "c").rmdir()
    (root / "a" / "patient-2" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"broken.png: unreadable image file"):
        load_dataset("folder", tmp_path / "scans", resolution=28, channels=1)


def test_a_decoded_folder_is_cached_privately_and_read_back_as_a_memory_map(tmp_path, monkeypatch):
    root = sixteen_bit_folder(tmp_path / "scans", people=2, per_person=5)
    files, cache = folder_layout(root).files, tmp_path / "cache"
    first = decoded_images(files, 28, 1, WindowRule(), str(cache))
    stored = list(cache.iterdir())
    assert len(stored) == 1 and stored[0].suffix == ".npy" and (stored[0].stat().st_mode & 0o777) == 0o600
    again = decoded_images(files, 28, 1, WindowRule(), str(cache))
    assert isinstance(again, np.memmap) and np.array_equal(first, again)
    os.utime(files[0], ns=(0, 0))  # a changed file is decoded again, under a new key that replaces the old one
    decoded_images(files, 28, 1, WindowRule(), str(cache))
    assert len(list(cache.iterdir())) == 1 and list(cache.iterdir()) != stored
    decoded_images(files, 32, 1, WindowRule(), str(cache))  # the same files at another side are kept beside
    assert len(list(cache.iterdir())) == 2
    monkeypatch.setattr(folder_module, "PARALLEL_FROM", 4)  # worker processes decode alike
    assert np.array_equal(decoded_images(files, 28, 1, WindowRule(), None), first)
    files[1].write_bytes(b"not a png any more")
    with pytest.raises(DataError, match="scan-1.png: unreadable image file"):
        decoded_images(files, 28, 1, WindowRule(), str(cache))
    assert len(list(cache.iterdir())) == 2  # the failed decode left no partial file


def test_a_window_is_declared_as_low_below_high():
    with pytest.raises(ConfigError, match=r"dataset.window must be auto, full, dicom or \[low, high\] with low below"):
        resolve_config("dpdm", dataset="folder", overrides=["dataset.window=[5, 1]"])
    with pytest.raises(ConfigError, match="dataset.window must be auto or full or dicom or a list"):
        resolve_config("dpdm", dataset="folder", overrides=["dataset.window=wide"])


def test_data_info_names_the_unit_the_window_and_skipped_files(tmp_path):
    root = sixteen_bit_folder(tmp_path / "scans")
    (root / "a" / "patient-0" / "notes.txt").write_text("x")
    cache = f"dataset.cache_dir={tmp_path / 'cache'}"
    done = dpsynth_main("data", "info", "folder", "--data-dir", str(root), "--set", cache)
    assert done.code == 0, done.err
    assert "unit:     one group of images (a person; from a sub-folder per person)" in done.out
    assert "pixels:   16-bit and DICOM values map to 8 bits from" in done.out
    assert "skipped:  1 file(s) of no image format (" in done.out and "notes.txt" in done.out
    flat = tmp_path / "flat" / "a"
    flat.mkdir(parents=True)
    for index in range(3):
        Image.fromarray(np.full((30, 30), index * 40, np.uint8)).save(flat / f"{index}.png")
    done = dpsynth_main("data", "info", "folder", "--data-dir", str(flat.parent), "--set", cache)
    assert "unit:     one image. A person with k images in the data is protected as k records" in done.out
    assert "class/person/image" in done.out and "groups.csv" in done.out


def test_a_scan_folder_of_16_bit_pngs_and_dicom_files_runs_end_to_end(tmp_path):
    root = sixteen_bit_folder(tmp_path / "scans", people=6, per_person=2)
    for person in range(6):
        write_dicom(root / "b" / f"patient-{person}" / "slice.dcm", np.full((40, 36), 2000))
    overrides = [*smoke("dp-merf"), f"run.out_dir={tmp_path / 'runs'}",
                 f"dataset.cache_dir={tmp_path / 'cache'}", "dataset.resolution=28", "privacy.dataset_size=6",
                 "dataset.val_size=1", "dataset.test_size=1"]
    args = ["run", "dp-merf", "--dataset", "folder", "--data-dir", str(root), "--epsilon", "5", "--preset", "cpu"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny configuration's own warnings
        done = dpsynth_main(*args, *sum((["--set", item] for item in overrides), []))
    assert done.code == 0, done.err
    assert "unit of privacy: one group of images (a person; from a sub-folder per person)" in done.out
    run = next((tmp_path / "runs").iterdir())
    report = json.loads((run / "release" / "privacy.json").read_text())
    assert report["stages"][0]["name"] == "dataset-shape"
    assert report["unit"].startswith("one person (all of a person's images, from a sub-folder per person)")
    with np.load(run / "release" / "synthetic.npz") as release:
        assert release["images"].shape[1:] in ((1, 28, 28), (3, 28, 28))
    window = yaml.safe_load((run / "config.yaml").read_text())["drawn"]["window"]
    assert window is None or 0 <= window[0] < window[1] <= 1  # drawn with the shape, as shares of the full range


def test_a_dicom_file_is_known_by_its_header_whatever_its_name(tmp_path):
    root = sixteen_bit_folder(tmp_path / "scans", people=2, per_person=1)
    write_dicom(root / "a" / "patient-0" / "IM0001", np.full((40, 36), 1000))  # as a PACS export names them
    write_dicom(root / "b" / "patient-1" / "slice.dcm", np.full((40, 36), 3000))
    (root / "b" / "patient-1" / "notes").write_bytes(b"\0" * 128 + b"DICX not a scan")
    layout = folder_layout(root)
    assert root / "a" / "patient-0" / "IM0001" in layout.files and root / "b" / "patient-1" / "slice.dcm" in \
        layout.files and layout.skipped == [root / "b" / "patient-1" / "notes"]
    images = load_dataset("folder", root, resolution=28, channels=1, window=(-1024.0, 1976.0), test_size=0,
                          val_size=0).train.images  # stored 1000 is -24 HU, a third of the way up the window
    assert len(images) == 6 and 85 in images.float().mean(dim=(1, 2, 3)).round().int().tolist()


def test_a_patient_first_folder_takes_its_labels_from_a_table(tmp_path):
    root = tmp_path / "export"
    rng = np.random.default_rng(0)
    for patient in range(6):
        study = root / f"patient-{patient}" / "study-1"
        study.mkdir(parents=True)
        for scan in range(2):
            Image.fromarray(rng.integers(0, 256, (30, 30), dtype=np.uint8)).save(study / f"{scan}.png")
    rows = [f"patient-{patient},{'sick' if patient % 3 == 0 else 'healthy'}" for patient in range(6)]
    (root / "labels.csv").write_text("person,label\n" + "\n".join([*rows, "patient-9,unsure"]) + "\n")
    layout = folder_layout(root)
    assert layout.class_names == ["healthy", "sick", "unsure"] and layout.group_source.endswith("labels.csv")
    assert layout.labels == [1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0] and len(set(layout.groups.tolist())) == 6
    dataset = load_dataset("folder", root, resolution=28, channels=1, val_size=1, test_size=1)
    assert dataset.info.unit == "group" and dataset.info.group_counts == {"train": 4, "val": 1, "test": 1}
    (root / "patient-7").mkdir()
    with pytest.raises(DataError, match=r"labels.csv: no label for 1 person folder\(s\), e.g. patient-7"):
        folder_layout(root)
    (root / "labels.csv").write_text("patient,class\n")
    with pytest.raises(DataError, match="expected a header with columns person,label"):
        folder_layout(root)


def test_each_dicom_file_can_be_read_through_its_own_window(tmp_path):
    root = tmp_path / "scans"
    for name, stored, window in (("lung", 1000, (-500.0, 1000.0)), ("bone", 1000, (300.0, 1500.0)),
                                 ("plain", 1000, None)):
        (root / "a" / name).mkdir(parents=True)
        write_dicom(root / "a" / name / "slice.dcm", np.full((40, 36), stored), window=window)
    files = folder_layout(root).files  # bone, lung, plain: -24 HU each
    images = decoded_images(files, 28, 1, LoadOptions(root, window="dicom").window_rule(), None)
    shade = [int(image.mean().round()) for image in images]
    lows = [300 - 750, -500 - 500, -1024]  # each file's window, the last its type's full range (12 bits, rescaled)
    highs = [300 + 750, -500 + 500, 4095 - 1024]
    assert shade == [round(255 * (-24 - low) / (high - low)) for low, high in zip(lows, highs, strict=True)]
    assert "through each file's own window" in LoadOptions(root, window="dicom").window_rule().words()
    config = resolve_config("dp-merf", dataset="folder", preset="cpu", overrides=["dataset.window=dicom"])
    assert config["dataset"]["window"] == "dicom"
