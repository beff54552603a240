"""`dpsynth bench`: a grid of real tiny runs tabulated alike; resume without repeated work; failures and bad input."""
from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpsynth.bench import BenchSpec, Cell, _child, frontier, plans, record
from dpsynth.bench.results import cell_row, results_markdown
from dpsynth.cli import main
from dpsynth.config import SCHEMA
from dpsynth.errors import DpsynthError
from dpsynth.runs import RunDirectory

COMMON = ["--datasets", "digits", "--epsilons", "8", "--device", "cpu", "--set", "sampling.num_samples=40",
          "--set", "evaluation.num_synthetic=30", "--set", "evaluation.num_real=30",
          "--set", "evaluation.classifiers=[cnn]", "--set", "evaluation.classifier_epochs=2",
          "--set", "evaluation.classifier_seeds=2", "--set", "evaluation.kid_subsets=5",
          "--set", "evaluation.kid_subset_size=10", "--set", "privacy.accountant=rdp"]  # RDP: 4x faster to calibrate
TINY_DIFFUSION = ["model.block_channels=[8, 16]", "model.norm_groups=4", "dpsgd.batch_size=64", "dpsgd.epochs=0.25",
                  "diffusion.sample_steps=4"]
TINY = {"pdp-diffusion": TINY_DIFFUSION, "pe": ["pe.iterations=2", "pe.population=40"]}


def bench(tmp_path: Path, methods: list[str], *extra: str) -> int:
    """`dpsynth bench` of tiny ``methods`` on digits at epsilon 8; its exit status."""
    tiny = [arg for m in methods for pair in TINY.get(m, []) for arg in ("--set", f"{m}:{pair}")]
    return main(["bench", "--methods", *methods, "--out", str(tmp_path / "bench"), *COMMON, *tiny,
                 "--set", f"evaluation.cache_dir={tmp_path / 'cache'}", *extra])


def phases(cell: Path) -> list[str]:
    return [json.loads(line)["phase"] for line in (cell / "bench.jsonl").read_text().splitlines()]


def results(out: Path) -> list[dict[str, str]]:
    with (out / "results.csv").open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_bench_tabulates_every_cell_pretrains_a_public_model_once_and_resumes_without_repeating_work(
        tmp_path, capsys, monkeypatch):
    out, methods = tmp_path / "bench", ["pdp-diffusion", "pe"]  # PDP-Diffusion needs a public model: the bench's
    public = ["--public-iterations", "3"]
    assert bench(tmp_path, methods, *public) == 0
    rows = results(out)
    assert [(row["method"], row["status"]) for row in rows] == [("pdp-diffusion", "done"), ("pe", "done")]
    for row, stage in zip(rows, ["dp-sgd", "histograms"], strict=True):
        assert 7.9 < float(row["epsilon"]) <= 8.0 and stage in row["privacy_split"]
        assert float(row["fid"]) > 0 and 0 <= float(row["accuracy_cnn"]) <= 1 and float(row["accuracy_cnn_std"]) >= 0
        assert float(row["synthesis_cpu_min"]) > 0 and float(row["evaluation_wall_min"]) > 0
        assert float(row["peak_rss_gib"]) > 0.1 and row["selection_epsilon"] and "cores" in row["machine"]
    assert float(rows[0]["public_pretraining_min"]) >= 0 and not rows[1]["public_pretraining_min"]
    table = (out / "results.md").read_text()
    assert "## digits" in table and "| pdp-diffusion | 8 | 7.9" in table and "| pe | 8 | 8.000 |" in table
    assert "| acc. cnn |" in table and len(re.findall(r"\| \d+\.\d ± \d+\.\d % \|", table)) == 2  # mean ± std per run
    quoted = record.value(out, "pdp-diffusion", 8, "accuracy_cnn")  # what a docs page quotes is the table's cell
    assert re.fullmatch(r"\d+\.\d ± \d+\.\d %", quoted) and f"| {quoted} |" in table
    assert "| pdp-diffusion | 8 |" in record.table(out) and "cores" in record.table(out)
    for picture in ("fid.png", "accuracy.png", "samples-digits-eps8.png"):
        assert (out / picture).stat().st_size > 1000
    pretraining = json.loads((out / "public" / "pdp-diffusion-digits" / "pretraining.json").read_text())
    assert pretraining["dataset"] == "glyphs" and pretraining["step"] == 3
    assert pretraining["settings"]["block_channels"] == [8, 16]

    pdp, pe = out / "runs" / "pdp-diffusion-digits-eps8", out / "runs" / "pe-digits-eps8"
    (pe / "metrics.json").unlink()
    assert bench(tmp_path, methods, *public) == 0
    assert phases(pdp) == ["public", "synthesis", "evaluation"]  # its public model pre-trained once
    assert phases(pe) == ["synthesis", "evaluation", "evaluation"]

    capsys.readouterr()
    assert bench(tmp_path, methods, *public, "--set", "pdp-diffusion:dpsgd.epochs=2") == 2
    assert "pdp-diffusion-digits-eps8/config.yaml: this cell was started with another config (dpsgd.epochs: 0.25 " \
           "there, 2.0 now)" in capsys.readouterr().err

    config = pe / "config.yaml"  # a cell made before evaluation.distillation_temperature (and schema) existed
    text = config.read_text()
    assert text.startswith(f"schema: {SCHEMA}\n") and "  distillation_temperature: null\n" in text
    config.write_text(text.replace(f"schema: {SCHEMA}\n", "", 1).replace("  distillation_temperature: null\n", "", 1))
    monkeypatch.chdir(tmp_path)  # and the same bench named by a relative path (its cells record an absolute one)
    assert bench(tmp_path, methods, *public, "--out", "bench") == 0

    (pe / "metrics.json").unlink()
    with (pe / ".bench.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert bench(tmp_path, methods, *public) == 2
    assert "pe-digits-eps8: another process is running this cell" in capsys.readouterr().err
    assert phases(pe) == ["synthesis", "evaluation", "evaluation"]


def test_repeated_syntheses_are_cells_of_their_own_tabulated_with_their_spread(tmp_path, capsys):
    spec = BenchSpec(["dpdm", "pe"], ["digits"], [8.0], syntheses=2)
    assert [cell.name for cell in spec.cells()] == ["dpdm-digits-eps8", "pe-digits-eps8", "dpdm-digits-eps8-s2",
                                                    "pe-digits-eps8-s2"]
    measured = {"epsilon": 7.99, "fid": 110.0, "kid": 0.1, "precision": 0.1, "recall": 0.1, "accuracy_cnn_std": 0.01,
                "synthesis_wall_min": 1.0, "synthesis_cpu_min": 2.0, "public_pretraining_min": None,
                "evaluation_wall_min": 1.0, "evaluation_cpu_min": 2.0, "peak_rss_gib": 1.0, "peak_cuda_gib": None,
                "privacy_split": "dp-sgd 7.99", "status": "done"}
    rows = [{"dataset": "digits", "method": "dpdm", "target_epsilon": 8.0, "synthesis": k, **measured,
             "accuracy_cnn": accuracy, "fid_infinity": fid} for k, accuracy, fid in [(1, 0.72, 98.0), (2, 0.74, 102.0)]]
    table = results_markdown(rows, "cpu")
    assert "| dpdm | 8 | 2 | 7.990 |" in table  # the synthesis column
    assert "| dpdm | 8 | 2 | 73.0 ± 1.4 % | 100.0 ± 2.8 |" in table  # across syntheses
    assert "- every cell ran on:" not in table and "| machine |" not in table  # no attempt says where
    on_two = results_markdown([{**rows[0], "machine": "Xeon, AVX512"}, {**rows[1], "machine": "EPYC, AVX2"}], "cpu")
    assert "the cells ran on different machines" in on_two and on_two.count("| EPYC, AVX2 |") == 1
    assert "- every cell ran on: Xeon, AVX512" in results_markdown([{**rows[0], "machine": "Xeon, AVX512"}], "cpu")
    with (tmp_path / "results.csv").open("w", newline="") as handle:  # as a docs page reads the record back
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows + [{**rows[0], "method": "pe", "target_epsilon": 1.0, "status": "pending"}])
    (tmp_path / "results.md").write_text(table)
    assert record.value(tmp_path, "dpdm", 8, "accuracy_cnn") == "73.0 ± 1.4 %"
    assert record.value(tmp_path, "dpdm", 8, "kid") == "0.100 ± 0.000"
    assert record.value(tmp_path, "pe", 1, "fid") == record.NOT_YET  # a record still running
    with pytest.raises(DpsynthError, match="no cell pe at target epsilon 8"):
        record.value(tmp_path, "pe", 8, "fid")
    with pytest.raises(DpsynthError, match="no column 'fid_inf' to quote; one of epsilon, fid, kid"):
        record.value(tmp_path, "dpdm", 8, "fid_inf")
    assert bench(tmp_path, ["pe"], "--syntheses", "0") == 2
    assert "--syntheses must be a whole number above 0, got 0" in capsys.readouterr().err


def test_the_frontier_tabulates_committed_records_of_one_cpu_type_and_refuses_a_mix(tmp_path):
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    benches = [results / "cpu-frontier" / "dpdm-0.5h", results / "cpu-frontier" / "dpdm-1h"]
    table = frontier.table(benches)
    assert table.startswith("Measured on Intel(R) Xeon(R) Processor, 2 cores, 2026-11-26.")  # CPU and day(s)
    row = ("| dpdm | 10 | 32 x 32 RGB, [16, 32, 32] x1, batch 512, 6.0 epochs, 5,000 released | 0.42 (0.81) | "
           "72.6 ± 0.1 % | 101.8 |")
    assert row in table  # the shape as the config declared it
    levers = frontier.table([results / "cpu-levers-amx" / "lever-base-eps10"])
    assert "| 28 x 28 grey, [16, 32, 32] x1, batch 512, 6.0 epochs, 20,000 released |" in levers  # as released
    assert [p["bench"] for p in frontier.points(benches)] == ["dpdm-0.5h", "dpdm-1h"]  # by hours
    frontier.plot(frontier.points(benches), tmp_path / "frontier.png")
    assert (tmp_path / "frontier.png").stat().st_size > 1000
    other = tmp_path / "epyc"
    other.mkdir()
    (other / "results.md").write_text((benches[0] / "results.md").read_text().replace("Intel(R) Xeon(R) Processor",
                                                                                      "AMD EPYC 9B14"))
    with pytest.raises(DpsynthError, match="frontier points come from different machines.*epyc: AMD EPYC 9B14"):
        frontier.table([benches[0], other])
    amx = [results / "cpu-frontier" / "dpdm-12-epochs", results / "cpu-frontier-amx" / "dpdm-6-epochs"]
    with pytest.raises(DpsynthError, match="different machines.*AVX512, bf16 native.*AVX512, AMX, bf16 native"):
        frontier.table(amx)  # same CPU name and capability, with and without AMX tiles


def test_measured_plans_tabulate_runs_and_refusals_with_their_cpu(tmp_path):
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "cpu-auto"
    table = plans.table(results)
    assert ("| photo-patches-16k | 10m | 16,000 | 64 x 767 | 5,000 | 10.0 | 11.4 | 1.14 | 98.8 ± 0.2 % | 287.0 |"
            in table)
    methods = plans.table(results.parent / "cpu-auto-methods")  # several DP-SGD sections named; none said so
    assert "| teacher 112 x 613, student 16 x 200 |" in methods and "| pe: no DP-SGD |" in methods
    refused = tmp_path / "photos-128-10m"
    refused.mkdir()
    (refused / "machine.txt").write_text("AMD EPYC, 2 cores, AVX2\n")
    (refused / "wall.txt").write_text("80\n")
    (refused / "run.out").write_text("dpsynth: error: plan.time_budget 10 min is too short on this machine: 200 "
                                     "DP-SGD steps ...; give --time-budget 21m or more (or a smaller resolution)\n")
    assert plans.table(tmp_path).splitlines()[-1] == (
        "| photos-128-10m | 10m | – | refused: give --time-budget 21m | – | – | 1.3 | – | – | – | "
        "AMD EPYC, 2 cores, AVX2 |")
    (refused / "run.out").write_text("Traceback ...\n")
    with pytest.raises(DpsynthError, match="photos-128-10m: not a finished measurement"):
        plans.table(tmp_path)


def test_a_measured_plan_evaluated_with_one_classifier_seed_says_so(tmp_path):
    one_seed = tmp_path / "photo-patches-16k"
    shutil.copytree(Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "cpu-auto" / one_seed.name,
                    one_seed, ignore=shutil.ignore_patterns("*.png", "*.html", "*.npz", "*.pt"))
    (metrics_file,) = one_seed.glob("*/metrics.json")
    metrics = json.loads(metrics_file.read_text())
    metrics["accuracy"]["cnn"].update(test_accuracy=0.71, test_accuracy_std=0.0,
                                      seeds=metrics["accuracy"]["cnn"]["seeds"][:1])
    metrics_file.write_text(json.dumps(metrics))
    assert "| 71.0 % (1 seed) | 287.0 |" in plans.table(tmp_path)  # not a spread of 0.0 over one classifier
    assert plans.quote(one_seed, "cnn") == "71.0 % (1 seed)"


def test_a_record_in_git_keeps_the_public_pretraining_minutes_though_its_runs_logs_stay_out():
    """Each cell's row is rebuilt from the files git keeps: the public model's pretraining.json gives its minutes."""
    record = Path(__file__).parents[1] / "benchmarks" / "results" / "cpu-zen4"
    for epsilon in (10, 1):
        cell = Cell("pdp-diffusion", "fashion-mnist", epsilon)
        assert cell_row(record / "runs" / cell.name, cell)["public_pretraining_min"] == 7.4
    assert cell_row(record / "runs" / "dpdm-fashion-mnist-eps10", Cell("dpdm", "fashion-mnist", 10))[
        "public_pretraining_min"] is None


def test_a_failing_cell_is_recorded_and_reported(tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    assert bench(tmp_path, ["pe"], "--set", "pe:api.name=diffusion", "--set", f"pe:api.model={missing}") == 2
    assert "1 cell(s) failed: pe-digits-eps8" in capsys.readouterr().err
    (row,) = results(tmp_path / "bench")
    assert row["status"] == "failed (synthesis, exit status 2)" and not row["fid"]
    assert str(missing) in (tmp_path / "bench" / "runs" / "pe-digits-eps8" / "bench.out").read_text()


def test_a_stopped_bench_records_its_interrupted_child_and_its_results(tmp_path):
    out = tmp_path / "bench"
    tiny = [arg for pair in [*TINY_DIFFUSION, "dpsgd.epochs=200"] for arg in ("--set", pair)]  # the last one wins
    command = [sys.executable, "-m", "dpsynth", "bench", "--methods", "dpdm", "--out", str(out), *COMMON, *tiny]
    ignore_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731  as in a background job
    bench_process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                     preexec_fn=ignore_sigint)
    try:
        output = out / "runs" / "dpdm-digits-eps8" / "bench.out"
        deadline = time.monotonic() + 300
        while "dp-sgd:" not in (output.read_text() if output.exists() else ""):
            assert time.monotonic() < deadline, "the bench's child never reached DP-SGD"
            time.sleep(0.5)
        bench_process.send_signal(signal.SIGTERM)  # to the bench alone: it must pass the stop on to its child
        assert bench_process.wait(timeout=120) == 130
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bench_process.pid, signal.SIGKILL)  # nothing left running, whatever happened
    assert "the bench continues from where it stopped when rerun with the same options" in bench_process.stderr.read()
    child_said = output.read_text()  # the interrupted run names its own directory, not a placeholder
    assert f"continues from its last checkpoint with `dpsynth run --resume {output.parent}" in child_said
    (attempt,) = [json.loads(line) for line in (output.parent / "bench.jsonl").read_text().splitlines()]
    assert attempt["interrupted"] and attempt["returncode"] == 130 and attempt["cpu_s"] > 0
    (row,) = results(out)
    assert row["status"] == "interrupted (synthesis)" and float(row["synthesis_wall_min"]) > 0


def test_a_stop_that_comes_as_the_child_finishes_keeps_the_finished_attempt(tmp_path):
    """The child asks the bench to stop (as a scheduler would, just then) and exits 0: its attempt is recorded as
    finished, not as interrupted, and the bench stops after recording it."""
    run = RunDirectory(tmp_path / "cell")
    run.path.mkdir()
    stop_the_bench_then_finish = "import os, signal; os.kill(os.getppid(), signal.SIGTERM)"
    previous = signal.signal(signal.SIGTERM, lambda *_: pytest.fail("the stop reached the test, not the bench"))
    try:
        with pytest.raises(KeyboardInterrupt):
            _child(run, "evaluation", [sys.executable, "-c", stop_the_bench_then_finish])
    finally:
        signal.signal(signal.SIGTERM, previous)
    (attempt,) = [json.loads(line) for line in (run.path / "bench.jsonl").read_text().splitlines()]
    assert attempt["phase"] == "evaluation" and attempt["returncode"] == 0 and "interrupted" not in attempt


@pytest.mark.parametrize("extra, message", [
    (["--set", "dp-sad:student.clip=1"], "'dp-sad' is not one of the bench's methods (dpdm, pe)"),
    (["--set", "dpdm:sampling.num_samples=20"], "sampling.num_samples differs between cells"),
    (["--set", "pe:model.attention=false"], "pe-digits-eps8: --set: unknown config key 'model.attention'"),
])
def test_bad_bench_input_stops_before_any_run(tmp_path, capsys, extra, message):
    assert bench(tmp_path, ["dpdm", "pe"], *extra) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "bench" / "runs").exists()


def test_soft_label_epochs_are_compared_only_between_soft_label_releases(tmp_path, capsys):
    """DP-ImgSyn's preset trains its students longer than DPDM's; the check passes that key and stops at the next."""
    assert bench(tmp_path, ["dpdm", "dp-imgsyn"], "--set", "dpdm:evaluation.classifier_seeds=1") == 2
    assert "evaluation.classifier_seeds differs between cells" in capsys.readouterr().err


def test_unknown_method_is_named(tmp_path, capsys):
    assert bench(tmp_path, ["dpdm", "gan"]) == 2
    assert "--methods: unknown gan; known:" in capsys.readouterr().err


def test_a_cell_made_before_a_method_section_key_existed_matches_that_keys_default():
    from dpsynth.api import resolve_config
    from dpsynth.bench import _differences

    wanted = resolve_config("dpdm", dataset="digits", epsilon=8, overrides=["diffusion.noise_levels=uniform"])
    stored = {**wanted, "diffusion": {k: v for k, v in wanted["diffusion"].items() if k != "noise_levels"}}
    assert _differences(stored, wanted) == []
    changed = {**wanted, "diffusion": {**wanted["diffusion"], "noise_levels": "log-normal"}}
    assert _differences(stored, changed) == ["diffusion.noise_levels: '<absent>' there, 'log-normal' now"]
