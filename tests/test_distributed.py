"""Data parallelism on the CPU with gloo and 2 processes: the same mechanism as 1 process, step for step."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    RDP,
    TINY_DP_IMGSYN,
    TINY_DPDM,
    TINY_FETA_PRO,
    TINY_PE,
    dpsynth_main,
    dpsynth_run,
    privacy_report,
    secret_stream,
    setting_args,
    started,
    tiny_dp_sad,
)

from dpsynth.api import dataset_from_config, plan_budget_for, resolve_config
from dpsynth.config import dump_config
from dpsynth.privacy import PrivacyLedger, budget_report
from dpsynth.privacy.mechanisms import poisson_sample
from dpsynth.runs import RunDirectory

WORKER = Path(__file__).with_name("distributed_worker.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def worker(scenario: str, out: Path, processes: int) -> list[dict]:
    """Each rank's result of ``scenario`` in ``processes`` processes (1: no torchrun at all)."""
    out.mkdir()
    launcher = [*TORCHRUN, f"--nproc_per_node={processes}"] if processes > 1 else [sys.executable]
    done = subprocess.run([*launcher, str(WORKER), scenario, str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(processes)]


@pytest.fixture(scope="module")
def dpsgd_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], list[dict]]:
    root = tmp_path_factory.mktemp("dpsgd")
    return worker("dpsgd", root / "one", 1), worker("dpsgd", root / "two", 2)


def test_ranks_never_see_the_same_example_and_together_draw_the_one_process_sample(dpsgd_runs):
    (one,), two = dpsgd_runs
    for step, (mine, theirs) in enumerate(zip(two[0]["seen"], two[1]["seen"], strict=True)):
        assert not set(mine) & set(theirs), step
        assert all(i % 2 == 0 for i in mine) and all(i % 2 == 1 for i in theirs)
        assert len(set(mine)) == len(mine)
    first = poisson_sample(1000, 0.1, secret_stream(7)).tolist()  # the worker's seed and rate
    assert sorted(two[0]["seen"][0] + two[1]["seen"][0]) == one["seen"][0] == first
    assert sorted(two[0]["seen"][-1] + two[1]["seen"][-1]) == list(range(1000))  # the rate-1 step: every example


def test_the_noise_of_the_aggregated_update_is_sigma_c_not_scaled_by_the_world_size(dpsgd_runs):
    (one,), two = dpsgd_runs
    sigma_c = 2.0 * 1.0  # the worker's sigma and C; 100,000 noise values estimate the std within ~0.5 %
    for result in (one, *two):
        assert result["noise_std"] == pytest.approx(sigma_c, rel=0.03)
    assert two[0]["weights"] == two[1]["weights"]  # one noise draw, identical models on every rank


def test_clipped_sums_are_reduced_over_ranks_exactly_once(dpsgd_runs):
    (one,), two = dpsgd_runs
    assert all(result["exact_error"] < 1e-3 for result in (one, *two))  # sum of all 1000 clipped gradients


def test_two_process_ledger_equals_the_one_process_ledger(dpsgd_runs):
    (one,), two = dpsgd_runs
    assert two[0]["ledger"] == two[1]["ledger"] == one["ledger"]


def test_pe_votes_reduced_over_shards_equal_one_process_votes(tmp_path):
    (one,), two = worker("pe", tmp_path / "one", 1), worker("pe", tmp_path / "two", 2)
    assert two[0]["votes"] == two[1]["votes"] == one["votes"]
    assert sum(one["votes"]) == one["shard"] == two[0]["shard"] + two[1]["shard"]
    assert all(result["embedding_error"] == 0 for result in (one, *two))  # the gathered lookahead embeddings


# Each method's tiny run from its own tests, with fewer steps and RDP (a later --set wins): the ledger must be
# the plan whatever the count and the accountant (DPDM's: the clean run of the kill-and-resume test below;
# DP-FETA's stages are FETA-Pro's first three, central images, their warm-up and DP-SGD, on the same code).
# DP-SAD's fixed thread count (for its resume test) would oversubscribe two processes.
METHODS = {"feta-pro": [*TINY_FETA_PRO, *setting_args("dpsgd.epochs=0.15", "warmup.iterations=3",
                                                      "frequency_warmup.iterations=4")],
           "pe": TINY_PE, "dp-imgsyn": [*TINY_DP_IMGSYN, "--public", "digits"],
           "dp-sad": [*tiny_dp_sad(Path("overridden"), threads="auto"),  # run.out_dir is set again below
                      *setting_args("teacher.epochs=0.25", "student.epochs=0.25")]}


def _processes(args: list[str], out: Path) -> list[str]:
    return [*args, "--nproc", "2", "--set", f"run.out_dir={out}"]


def finished_on_two_processes(args: list[str], out: Path) -> Path:
    """The run directory of `dpsynth run ARGS --nproc 2`, run to completion (in a subprocess: the ranks print)."""
    process = dpsynth_run(*_processes(args, out))
    run = started(process)
    assert process.wait(timeout=300) == 0, process.stderr.read()
    return run


def assert_ledger_is_the_plan(two: Path) -> None:
    """The two-process run's ledger is its plan, event for event, as a one-process run's is (the release checks
    that, every method's own tests run it), and its ε the plan's."""
    config = RunDirectory.open(two).config()
    plan = plan_budget_for(config, dataset_from_config(config).info)
    assert PrivacyLedger.load(two / "ledger.json").stages() == plan.stages
    assert privacy_report(two)["epsilon"] == pytest.approx(
        budget_report(plan.stages, plan.accountant, plan.delta)["epsilon"], rel=1e-9)
    with np.load(two / "release" / "synthetic.npz") as release:
        assert len(release["labels"]) > 0
    starts = [json.loads(line) for line in (two / "log.jsonl").read_text().splitlines()]
    assert starts[0]["event"] == "start" and starts[0]["processes"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_every_method_runs_on_two_processes_with_the_ledger_of_its_plan(tmp_path, method):
    assert_ledger_is_the_plan(finished_on_two_processes(METHODS[method], tmp_path / "two"))


@pytest.mark.slow
def test_two_process_run_killed_mid_training_resumes_to_the_unbroken_run(tmp_path):
    """DPDM's two-process run is also the one that shows its ledger is its plan."""
    dpdm = ["dpdm", *TINY_DPDM, *setting_args("dpsgd.epochs=0.5"), *RDP]  # 11 steps, checkpoints at 5, 10
    clean = finished_on_two_processes(dpdm, tmp_path / "clean")
    assert_ledger_is_the_plan(clean)
    crash = subprocess.Popen([sys.executable, "-m", "dpsynth", "run", *_processes(dpdm, tmp_path / "crash")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    crash_dir = started(crash)
    ledger = crash_dir / "ledger.json"
    while crash.poll() is None and (not ledger.exists() or sum(
            getattr(e, "steps", 0) for e in PrivacyLedger.load(ledger).events()) < 7):
        time.sleep(0.01)  # a checkpoint at step 5
    os.killpg(crash.pid, signal.SIGKILL)  # torchrun and both ranks
    crash.wait()
    assert not (crash_dir / "release" / "synthetic.npz").exists()
    resumed = dpsynth_run("--resume", str(crash_dir), "--nproc", "2")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    assert PrivacyLedger.load(ledger) == PrivacyLedger.load(clean / "ledger.json")
    with np.load(crash_dir / "release" / "synthetic.npz") as a, np.load(clean / "release" / "synthetic.npz") as b:
        assert np.array_equal(a["images"], b["images"])  # the shared generator restored, example generators reseeded


@pytest.mark.parametrize(("args", "message"), [
    (["dpdm", *TINY_DPDM, "--nproc", "0"], "--nproc must be at least 1, got 0"),
    (["dpdm", *TINY_DPDM, "--nproc", "2", "--set", "dpsgd.clip=-1"], "dpsgd.clip"),  # checked before any process starts
    (["--resume", "no-such-run", "--nproc", "2"], "no-such-run: not a dpsynth run directory"),
])
def test_bad_input_with_nproc_stops_with_one_line_before_starting_processes(tmp_path, args, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    done = dpsynth_main("run", *args, *(["--set", f"run.out_dir={tmp_path}"] if "--resume" not in args else []))
    assert done.code == 2 and message in done.err and "Traceback" not in done.err
    assert "OMP_NUM_THREADS" not in done.err and not any(tmp_path.iterdir())  # no torchrun, no run directory


def test_a_damaged_config_is_refused_before_resuming(tmp_path):
    (tmp_path / "config.yaml").write_text("method: dpdm\n")
    done = dpsynth_main("run", "--resume", str(tmp_path))
    assert done.code == 2 and "Traceback" not in done.err
    assert f"{tmp_path / 'config.yaml'}: missing " in done.err


def test_a_failing_rank_ends_the_run_with_one_line_naming_it(tmp_path):
    config = resolve_config("dpdm", dataset="digits", epsilon=8, overrides=["model.block_channels=[8, 16]"])
    (tmp_path / "config.yaml").write_text(dump_config(config))
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")  # rank 0 fails on it; rank 1 waits for it
    done = subprocess.run([sys.executable, "-m", "dpsynth", "run", "--resume", str(tmp_path), "--nproc", "2"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "checkpoint.pt: unreadable checkpoint" in done.stderr
    last = done.stderr.rstrip().splitlines()[-1]  # rank 0 fails; whichever exits first, the other is stopped
    assert last.startswith("dpsynth: error: rank(s) 0 (exit status ") and "of the 2 processes failed" in last
