"""Shared fixtures: small dataset files written in the real on-disk formats; running and killing `dpsynth run`;
opening a run's report.html in a real headless browser."""
from __future__ import annotations

import contextlib
import gzip
import html
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import threadpoolctl
import torch
from PIL import Image

from dpsynth.api import resolve_config
from dpsynth.cli import main
from dpsynth.data import load_dataset
from dpsynth.doctor import COMMON, stopped_after_checkpoint
from dpsynth.hardware import usable_cores
from dpsynth.methods import declarations, run_config_of
from dpsynth.privacy import PrivacyLedger
from dpsynth.privacy.randomness import SecretStream, derived_key
from dpsynth.runs import RunDirectory


def smoke(method: str) -> list[str]:
    """``--set`` pairs of ``method``'s declared smoke run (a few steps of every stage) on this CPU."""
    return [*declarations()[method].smoke, *COMMON, "run.device=cpu"]


def secret_stream(seed: int = 0) -> SecretStream:
    """A noise stream keyed from ``seed``: recomputable, so for tests only."""
    return SecretStream(derived_key(seed, "test"))


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n N``) each worker, and every process it starts, keeps to its own share of the
    cores with one thread per core: workers that each took every core would oversubscribe them, and the
    waiting threads of OpenMP and OpenBLAS then slow everything many times over. One thread also keeps the
    thread governor of a run at one count, so a resumed run rounds as its clean run did."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None or not hasattr(os, "sched_setaffinity"):
        return
    cores, workers = sorted(os.sched_getaffinity(0)), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    index = int(worker.removeprefix("gw"))
    share = cores[index::workers] if workers <= len(cores) else [cores[index % len(cores)]]
    os.sched_setaffinity(0, share)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(len(share))
    threadpoolctl.threadpool_limits(len(share))
    torch.set_num_threads(len(share))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker, tests marked ``alone`` are skipped: another worker shares the machine. The
    README's test command runs them after the workers, with ``-m alone``."""
    if os.environ.get("PYTEST_XDIST_WORKER") is not None:
        for item in items:
            if item.get_closest_marker("alone"):
                item.add_marker(pytest.mark.skip(reason="needs the machine to itself: run with pytest -m alone"))


@pytest.fixture(scope="session", autouse=True)
def session_ledgers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every ledger in the session's folder, set before any module's or session's fixture runs (a test's own, below,
    are set for the test alone): never the user's holder's ledger."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DPSYNTH_LEDGER_DIR", str(tmp_path_factory.mktemp("session-ledgers")))
        patch.setenv("DPSYNTH_RELEASES", str(tmp_path_factory.mktemp("session-holder") / "releases.json"))
        yield


@pytest.fixture(autouse=True)
def evaluation_ledgers(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                       ) -> Path:
    """Each test's model-selection ledgers (``dpsynth evaluate``) and holder's ledger of releases in its own folder,
    not the user's."""
    monkeypatch.setenv("DPSYNTH_LEDGER_DIR", str(tmp_path / "evaluation-ledgers"))
    monkeypatch.setenv("DPSYNTH_RELEASES", str(tmp_path_factory.mktemp("holder") / "releases.json"))
    return tmp_path / "evaluation-ledgers"


def idx_bytes(array: np.ndarray) -> bytes:
    """An unsigned-byte IDX file holding ``array``."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx_set(directory: Path, n_train: int = 120, n_test: int = 30, compress: bool = True,
                  seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The four MNIST-style IDX files with random 28 x 28 images; returns the training images and labels."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    parts = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        parts[prefix] = (images, labels)
        for kind, array, ndim in (("images", images, 3), ("labels", labels, 1)):
            name = f"{prefix}-{kind}-idx{ndim}-ubyte"
            data = idx_bytes(array)
            if compress:
                (directory / f"{name}.gz").write_bytes(gzip.compress(data))
            else:
                (directory / name).write_bytes(data)
    return parts["train"]


@pytest.fixture
def idx_dir(tmp_path: Path) -> Path:
    write_idx_set(tmp_path / "idx")
    return tmp_path / "idx"


def kill_after_recorded_steps(process: subprocess.Popen, run_dir: Path, steps: int, timeout: float) -> None:
    """SIGKILL ``process`` as soon as the run's ledger records at least ``steps`` mechanism steps."""
    ledger, deadline = run_dir / "ledger.json", time.time() + timeout
    while time.time() < deadline:
        if ledger.exists() and sum(getattr(e, "steps", 0) for e in PrivacyLedger.load(ledger).events()) >= steps:
            break
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()


def dpsynth_run(*args: str) -> subprocess.Popen:
    """`python -m dpsynth run ARGS` in the background, output unbuffered."""
    return subprocess.Popen([sys.executable, "-m", "dpsynth", "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@dataclass(frozen=True)
class Done:
    """What a finished command left: its exit status and what it printed."""

    code: int
    out: str
    err: str


def dpsynth_main(*argv: str) -> Done:
    """`dpsynth ARGV` in this process: a subprocess would add only an interpreter's start (seconds of imports).
    Kills, signals and several processes need :func:`dpsynth_run`. torch's thread count, which a run's governor
    may change, is restored."""
    out, err, threads = io.StringIO(), io.StringIO(), torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exit_:  # argparse's usage errors
                code = int(exit_.code or 0)
    finally:
        torch.set_num_threads(threads)
    return Done(code, out.getvalue(), err.getvalue())


def run_directory(printed: str) -> Path:
    """The run directory a run prints first."""
    line = printed.splitlines()[0] if printed else ""
    assert line.startswith("run directory: "), printed
    return Path(line.split(": ", 1)[1].strip())


def finished_run(*args: str) -> Path:
    """The run directory of `dpsynth run ARGS`, run to completion in this process (its stderr shown if it fails)."""
    done = dpsynth_main("run", *args)
    assert done.code == 0, done.err
    return run_directory(done.out)


def absolute_paths(text: str) -> list[str]:
    """The absolute file paths (``/a/b``...) in ``text``; a URL's path is none."""
    return re.findall(r"(?<![\w.:/~-])/[\w.-]+(?:/[\w.-]+)+", text)


def privacy_report(run: Path) -> dict:
    """The run's privacy.json."""
    return json.loads((run / "release" / "privacy.json").read_text())


def started(process: subprocess.Popen) -> Path:
    """The run directory a run in a subprocess prints first."""
    line = process.stdout.readline()
    return run_directory(line or process.stderr.read())


def kill_when_logged(process: subprocess.Popen, run: Path, matches: Callable[[dict], bool],
                     timeout: float = 300) -> None:
    """SIGKILL ``process`` once the run's log has an entry that ``matches`` (logged after a checkpoint)."""
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        log = run / "log.jsonl"
        entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        if any(matches(entry) for entry in entries):
            break
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait()


def warmup_step_logged(step: int, phase: str) -> Callable[[dict], bool]:
    """Matches the log entry of step ``step`` (or later) of warm-up ``phase``."""
    return lambda e: e.get("event") == "warm-up" and e["phase"] == phase and e["step"] >= step


def assert_killed_run_resumes_to(clean_dir: Path, args: list[str], matches: Callable[[dict], bool]) -> None:
    """A run of ``args`` killed once it logs an entry that ``matches`` resumes to ``clean_dir``'s ledger and images."""
    crash = dpsynth_run(*args)
    crash_dir = started(crash)
    kill_when_logged(crash, crash_dir, matches)
    assert not (crash_dir / "release" / "synthetic.npz").exists()
    resumed = dpsynth_main("run", "--resume", str(crash_dir))
    assert resumed.code == 0, resumed.err
    assert PrivacyLedger.load(crash_dir / "ledger.json") == PrivacyLedger.load(clean_dir / "ledger.json")
    with np.load(crash_dir / "release" / "synthetic.npz") as a, np.load(clean_dir / "release" / "synthetic.npz") as b:
        assert np.array_equal(a["images"], b["images"])


# Appended to a copy of the page: once it has loaded, what it shows, as JSON in a <pre id="probe">.
PROBE = """<script>window.addEventListener("load", () => {
  const shown = {images: [...document.images].map(i => ({alt: i.alt, loaded: i.complete && i.naturalWidth > 0})),
                 epsilon: document.getElementById("epsilon")?.textContent ?? null, text: document.body.innerText};
  const pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = JSON.stringify(shown);
  document.body.appendChild(pre);
});</script>"""


def shown_in_browser(page: Path) -> dict:
    """Open ``page`` in headless Chromium (Debian's ``chromium``) from disk; what it shows once loaded: each
    image's alt text and whether it decoded, the text of the element ``#epsilon``, and the page's text."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("the report test needs Debian's chromium: `bash scripts/setup.sh --tests` installs it")
    probe = page.with_name(f".probe-{page.name}")
    probe.write_text(page.read_text().replace("</body>", f"{PROBE}</body>"))
    done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                           "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    probe.unlink()
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.DOTALL)
    assert found, f"chromium showed no probe (exit {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1)))


def assert_report_matches(run: Path) -> dict:
    """The run's report.html opens from disk, every picture decodes and it shows privacy.json's epsilon;
    returns what it showed."""
    shown = shown_in_browser(run / "report.html")
    assert shown["images"] and all(image["loaded"] for image in shown["images"]), shown["images"]
    epsilon = privacy_report(run)["epsilon"]
    assert shown["epsilon"] == (f"{epsilon:.4f}" if epsilon is not None else "none")
    assert "The release, which may be shared: the folder release/" in shown["text"]
    return shown


@pytest.fixture
def own_npz(tmp_path) -> str:
    """All 1,797 of scikit-learn's digits as an npz: own data, whose number of images is not public."""
    digits = load_dataset("digits")
    images = torch.cat([digits.train.images, digits.val.images, digits.test.images])
    labels = torch.cat([digits.train.labels, digits.val.labels, digits.test.labels])
    np.savez(tmp_path / "own.npz", images=images.numpy(), labels=labels.numpy(),
             class_names=np.asarray(digits.info.class_names))
    return str(tmp_path / "own.npz")


def stopped_smoke_run(method: str, root: Path, epsilon: float = 5.0) -> RunDirectory:
    """A smoke run of ``method`` on sklearn's digits (its ``cpu`` preset) under ``root``, stopped as a crash would stop
    it right after its first checkpoint that follows a recorded mechanism (the doctor's stop)."""
    config = resolve_config(method, dataset="digits", epsilon=epsilon, preset="cpu",
                            overrides=[*smoke(method), f"run.out_dir={root}"])
    return stopped_after_checkpoint(run_config_of(config))[1]


def setting_args(*settings: str) -> list[str]:
    """``--set`` before each ``key=value`` of ``settings``."""
    return [arg for setting in settings for arg in ("--set", setting)]


# Each method's tiny run on the command line (its own tests and the two-process tests): a few steps of every stage on
# sklearn's digits or mnist-5k. RDP where the accountant is not under test: it calibrates 4x faster than PLD.
RDP = setting_args("privacy.accountant=rdp")
TINY_UNET = ("model.block_channels=[8, 16]", "model.norm_groups=4")
TINY_DPDM = ["--dataset", "digits", "--epsilon", "8", "--device", "cpu", *setting_args(
    *TINY_UNET, "dpsgd.batch_size=64", "dpsgd.epochs=1", "dpsgd.checkpoint_every=5", "dpsgd.noise_multiplicity=2",
    "sampling.num_samples=30", "diffusion.sample_steps=4", "evaluation.enabled=false",
    "run.seed=0")]  # a known seed (never for a real release): clean and resumed runs must agree
TINY_DP_FETA = ["dp-feta", "--dataset", "digits", "--epsilon", "8", "--device", "cpu", *setting_args(
    *TINY_UNET, "dpsgd.batch_size=64", "dpsgd.epochs=0.5", "dpsgd.checkpoint_every=5", "central.count=2",
    "central.batch_size=300", "central.clip=8.0", "warmup.iterations=12", "warmup.batch_size=8",
    "warmup.checkpoint_every=4", "sampling.num_samples=20", "diffusion.sample_steps=3", "evaluation.enabled=false",
    "run.seed=0"), *RDP]
TINY_FETA_PRO = ["feta-pro", "--dataset", "digits", "--epsilon", "8", "--device", "cpu", *setting_args(
    *TINY_UNET, "dpsgd.batch_size=64", "dpsgd.epochs=0.3", "dpsgd.checkpoint_every=5", "central.count=2",
    "central.batch_size=300", "central.clip=8.0", "warmup.iterations=6", "warmup.batch_size=8",
    "warmup.checkpoint_every=3", "frequency.features=200", "generator.epochs=2", "generator.iterations_per_epoch=5",
    "generator.images=100", "generator.latent=8", "generator.width=16", "frequency_warmup.iterations=8",
    "frequency_warmup.batch_size=8", "frequency_warmup.checkpoint_every=4", "frequency_warmup.sample_steps=2",
    "sampling.num_samples=20", "diffusion.sample_steps=3", "evaluation.enabled=false", "run.seed=0"), *RDP]
TINY_DP_IMGSYN = ["dp-imgsyn", "--dataset", "mnist-5k", "--epsilon", "2", *setting_args(
    "teacher.epochs=0.1", "teacher.batch_size=256", "sampling.num_samples=60", "alignment.iterations=3",
    "alignment.batch_size=20", "alignment.temperature=4", "evaluation.enabled=false", "teacher.checkpoint_every=1",
    "run.seed=0"), *RDP]
TINY_PE = ["pe", "--api", "drawtext", "--dataset", "mnist-5k", "--epsilon", "10", *setting_args(
    "pe.population=40", "pe.iterations=3", "pe.lookahead=1", "evaluation.enabled=false", "sampling.num_samples=60",
    "run.seed=0"), *RDP]


def tiny_dp_sad(out_dir: Path, *extra: str, threads: str | None = None) -> list[str]:
    """DP-SAD's tiny run into ``out_dir``, at a fixed thread count (default: the cores this process may use, counted
    when called, after :func:`pytest_configure` kept a worker to its share): under load the thread governor would
    change it, and with it the float rounding, between a clean and a resumed run (the discriminator then drifts
    them apart)."""
    threads = threads or str(usable_cores())
    return ["dp-sad", "--dataset", "digits", "--epsilon", "8", "--device", "cpu", *extra, *setting_args(
        *TINY_UNET, "teacher.batch_size=64", "teacher.epochs=0.5", "student.batch_size=64", "student.epochs=0.5",
        "teacher.checkpoint_every=3", "student.checkpoint_every=3", "sampling.num_samples=30",
        "diffusion.sample_steps=4", "discriminator.pool=40", "discriminator.pool_steps=4",
        "discriminator.batch_size=16", "evaluation.enabled=false", "run.seed=0", f"run.out_dir={out_dir}",
        f"run.threads={threads}"), *RDP]


MERF = smoke("dp-merf")


def write_patients(root, patients: int = 12, scans: int = 2, side: int = 28) -> None:
    """Two class folders of a sub-folder per patient, each holding ``scans`` grey ``side`` x ``side`` PNGs."""
    rng = np.random.default_rng(0)
    for patient in range(patients):
        folder = root / ("healthy" if patient % 2 else "sick") / f"patient-{patient:03d}"
        folder.mkdir(parents=True)
        for scan in range(scans):
            Image.fromarray(rng.integers(0, 256, (side, side), dtype=np.uint8)).save(folder / f"scan-{scan}.png")
