"""The documentation: the site builds with ``mkdocs build --strict``, the README stays one screen, and every
command the pages show that runs in under a minute is run, as shown, in the order shown."""
from __future__ import annotations

import importlib.util
import json
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from page_commands import BLOCK, commands  # tests/, beside this file

from dpsynth.cli import main
from dpsynth.methods import METHODS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # the hooks import docs_rules from beside them, as MkDocs lets them
_SPEC = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "scripts" / "mkdocs_hooks.py")
HOOKS = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(HOOKS)
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

# Commands the pages show that take more than a minute or need what a test machine lacks: why each is not run.
NOT_RUN = {
    "dpsynth run": "trains and releases: minutes to hours (tests/test_dpdm.py and the method tests run tiny runs)",
    "dpsynth bench": "every method in a grid: hours (tests/test_bench.py runs a tiny bench)",
    "dpsynth pretrain": "trains a model on public data: minutes (tests/test_public_start.py)",
    "dpsynth evaluate": "Inception features and classifiers: minutes (tests/test_evaluation.py)",
    "dpsynth rehearse": "runs a plan on public images: minutes (tests/test_dp_ldm.py runs tiny rehearsals)",
    "dpsynth doctor --device cuda": "needs a GPU (tests/test_device.py runs the doctor on the CPU)",
    "dpsynth audit": "10^4-10^5 trials per mechanism: minutes (tests/test_audit.py)",
    "OMP_NUM_THREADS=1 dpsynth audit": "as dpsynth audit",
    "torchrun": "several processes running a method (tests/test_distributed.py)",
    "bash scripts/setup.sh": "installs Debian and PyPI packages (CI runs it)",
    "DPSYNTH_TORCH=": "scripts/setup.sh with another PyTorch build (CI runs the default)",
    "python3 -m venv": "creates a virtual environment (scripts/setup.sh makes CI's)",
    "pip install": "installs PyPI packages (scripts/setup.sh installs the same in CI)",
    "python scripts/mkdocs_hooks.py": "rewrites or checks the docs' generated text (test_generated_text_is_in_sync)",
    "python -m pytest": "the test suite itself",
    "python benchmarks/": "benchmarks: minutes each",
    "mkdocs": "builds or serves this site (test_the_site_builds_strictly builds it)",
}
# A path on the user's machine, or a placeholder to fill in (`[--option]`, `<time>`, RUN_DIR).
NEEDS_USER_DATA = re.compile(r" /data/|\[--|<\w+>|RUN_DIR|FILE\.npz")


def normalised(command: str) -> str:
    return re.sub(r"(^|\s)\.venv/bin/", r"\1", command)


def why_not_run(command: str) -> str | None:
    """Why ``command`` is not run by this test, or None when it is."""
    command = normalised(command)
    for prefix, why in NOT_RUN.items():
        if command.startswith(prefix):
            return why
    return "it names a path of the user's or a placeholder" if NEEDS_USER_DATA.search(command) else None


def runnable_blocks(page: Path) -> list[tuple[str, str]]:
    """(language, code) of each block the test runs: shell commands that are not in NOT_RUN, and Python blocks
    not marked ``<!-- long: why -->``."""
    blocks = []
    for match in BLOCK.finditer(page.read_text()):
        language, code = match["language"], match["code"]
        if language == "bash":
            blocks += [("bash", command) for command in commands(code) if why_not_run(command) is None]
        elif language == "python" and match["why"] is None:
            blocks.append(("python", code))
    return blocks


def test_the_readme_is_one_screen_and_its_links_lead_to_pages():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 120
    links = re.findall(r"\]\(([^)#]+)\)", readme)
    assert len(links) >= 10 and all((ROOT / link).is_file() for link in links), links


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = (tmp_path / "site" / "reference" / "configuration" / "index.html").read_text()
    assert "<td><code>dpsgd.noise_multiplicity</code></td>" in reference  # the generated table, rendered


def test_the_pages_show_commands_to_run():
    shown = {page.name: runnable_blocks(page) for page in PAGES}
    assert sum(map(len, shown.values())) >= 15, shown  # the parsing finds them
    unknown = [command for blocks in shown.values() for language, command in blocks
               if language == "bash" and not normalised(command).startswith("dpsynth ")]
    assert not unknown, f"commands that are neither run here nor in NOT_RUN with a reason: {unknown}"


@pytest.mark.parametrize("page", [page for page in PAGES if runnable_blocks(page)],
                         ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_short_command_on_the_page_runs(page: Path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # files a page makes (a folder of images, an npz) land here
    namespace: dict = {}
    for language, code in runnable_blocks(page):
        if language == "python":
            exec(compile(code, f"{page.name} python block", "exec"), namespace)  # noqa: S102  our own docs
        else:
            status = main(shlex.split(normalised(code))[1:])
            assert status == 0, f"{page.name}: `{code}` exited with {status}: {capsys.readouterr().err}"


def test_generated_text_is_in_sync_with_the_code_and_the_records():
    assert HOOKS.stale(HOOKS.pages()) == [], "run .venv/bin/python scripts/mkdocs_hooks.py --write"


def test_a_stale_number_and_a_marker_without_its_end_are_caught():
    page = "DPDM reached <!-- bench: cpu-zen4 dpdm 10 accuracy_cnn -->99.9 %<!-- /bench --> on the bench.\n"
    synced = HOOKS.synced(page, "page.md")
    assert synced != page and "99.9 %" not in synced and HOOKS.synced(synced, "page.md") == synced
    with pytest.raises(HOOKS.OutOfSync, match="page.md: 1 generated-text marker"):
        HOOKS.synced("DPDM reached <!-- bench: cpu-zen4 dpdm 10 accuracy_cnn --> on the bench.\n", "page.md")


@pytest.mark.parametrize("history", ["fixed in issue 52", "as issue #30 found", "measured in one session",
                                     "resumed over several sittings", "start 19:55:52", "measured that afternoon"])
def test_a_page_that_recounts_its_history_is_refused(history):
    assert HOOKS.problems(f"# A page\n\nThe number, {history}.\n", "docs/page.md")


def test_no_page_breaks_the_rules_of_a_users_page():
    assert [problem for page in PAGES for problem in HOOKS.problems(page.read_text(),
                                                                    page.relative_to(ROOT).as_posix())] == []


def test_a_method_page_without_its_paper_or_its_sections_is_refused():
    sections = "".join(f"## {section}\n\nText.\n\n" for section in HOOKS.docs_rules.METHOD_SECTIONS)
    paper = "**Paper:** Someone. *A title.* A venue, 2023. [arXiv](https://arxiv.org/abs/1)\n\n"
    assert HOOKS.problems(f"# DPDM\n\n{paper}{sections}", "docs/methods/dpdm.md") == []
    assert HOOKS.problems(f"# DPDM\n\n{sections}", "docs/methods/dpdm.md") == [
        "docs/methods/dpdm.md: the paper reference lacks a **Paper:** line"]
    undated = "**Paper:** Someone. *A title.* A venue.\n\n"
    assert HOOKS.problems(f"# DPDM\n\n{undated}{sections}", "docs/methods/dpdm.md") == [
        f"docs/methods/dpdm.md: the paper reference lacks {part}" for part in ("a year", "a link")]
    history = f"# DPDM\n\n{paper}{sections}## Why the preset looks like this\n\nText.\n"
    assert HOOKS.problems(history, "docs/methods/dpdm.md") == [
        "docs/methods/dpdm.md: a method page has the sections " + ", ".join(HOOKS.docs_rules.METHOD_SECTIONS)
        + " (in that order); this one has " + ", ".join([*HOOKS.docs_rules.METHOD_SECTIONS,
                                                        "Why the preset looks like this"])]


@pytest.mark.parametrize("page, problem", [
    ("A step took 2.5 s.\n", "measured '2.5 s'"),
    ("The CNN gave 76.6 % here.\n", "measured '76.6 %'"),
    ("Twice the steps buy FID∞ 70.1 and run 1.5x longer.\n", "measured 'FID∞ 70.1', '1.5x'"),
    ("Measured on an Intel Xeon:\n\n| run | time |\n| --- | --- |\n| a | 3 min |\n", "measured '3 min'"),
])
def test_a_measured_number_without_its_record_or_its_cpu_and_date_is_refused(page, problem):
    found = [found for found in HOOKS.problems(f"# A page\n\n{page}", "docs/page.md") if "measured" in found]
    assert len(found) == 1 and problem in found[0], found


@pytest.mark.parametrize("page", [
    "A step took 2.5 s on an AMD EPYC, 2026-11-24.\n",
    "On an Intel Xeon, 2026-11-27:\n\n| run | time |\n| --- | --- |\n| a | 3 min |\n",
    "## A section\n\nOn an AMD EPYC, 2026-11-24.\n\nA step took 2.5 s.\n",
    "DPDM gave <!-- bench: cpu-zen4 dpdm 10 accuracy_cnn -->75.8 ± 0.5 %<!-- /bench --> on the bench.\n",
    "The paper reports 85.6 % at ε = 10.\n",
    "A budget of `--time-budget 30m`, a 24-GB card, ε = 10, 20,000 images, 28 x 28 pixels.\n",
])
def test_a_number_with_its_record_its_cpu_and_date_or_its_paper_passes(page):
    assert [found for found in HOOKS.problems(f"# A page\n\n{page}", "docs/page.md") if "measured" in found] == []


def test_a_glossary_term_is_linked_where_a_page_first_uses_it():
    linked = "A [DP-SGD](reference/glossary.md#dp-sgd) step, then DP-SGD again.\n"
    assert HOOKS.problems(f"# DP-SGD\n\n{linked}", "docs/page.md") == []  # a heading is not a use
    assert HOOKS.problems("# A page\n\nA [DP-SGD](reference/glossary.md#dp-sgd) step.\n",
                          "docs/guides/page.md") == [
        "docs/guides/page.md:3: 'DP-SGD' is first used without a link to its glossary entry "
        "(../reference/glossary.md#dp-sgd)"]
    assert HOOKS.problems("# A page\n\nThe FID∞ of the images.\n", "docs/page.md") == [
        "docs/page.md:3: 'FID∞' is first used without a link to its glossary entry "
        "(reference/glossary.md#fid-infinity)"]
    assert HOOKS.problems("# A page\n\n`DP-SGD` in code is not a use.\n", "docs/page.md") == []


def test_every_troubleshooting_entry_quotes_an_error_dpsynth_prints():
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    quoted = re.findall(r"^### `([^`]+)`$", page, re.MULTILINE)
    source = "\n".join(path.read_text() for path in (ROOT / "dpsynth").rglob("*.py"))
    assert len(quoted) >= 10
    assert [text for text in quoted if text not in source] == []


def test_the_privacy_json_example_quotes_the_bench_release_it_names():
    page = (ROOT / "docs" / "reference" / "release-files.md").read_text()
    shown = json.loads(re.search(r"```json\n(.*?)```", page, re.DOTALL)[1])
    source = re.search(r"`(benchmarks/results/[^`]+/privacy\.json)`", page)[1]
    recorded = json.loads((ROOT / source).read_text())
    common = set(shown) & set(recorded) - {"release_files"}
    assert {"epsilon", "delta", "stages", "dataset_size"} <= common
    assert {key: shown[key] for key in common} == {key: recorded[key] for key in common}


def test_the_released_model_measurement_quotes_its_record():
    page = (ROOT / "docs" / "guides" / "own-data.md").read_text()
    record = json.loads((ROOT / "benchmarks/results/released-model/records.jsonl").read_text().splitlines()[-1])
    draws = record["draws"]
    quoted = (f"released {record['images']:,} images of FID∞ {record['release']:.1f}",
              ", ".join(f"{value:.1f}" for value in draws[:-1]) + f" and {draws[-1]:.1f}",
              f"({statistics.mean(draws):.1f} ± {statistics.stdev(draws):.1f})",
              f"commit {record['commit'].split('+')[0]}, {record['date']}")
    prose = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", " ".join(page.split()))  # links read as their text
    assert all(text in prose for text in quoted), quoted


def test_the_docs_build_refuses_a_page_out_of_sync_with_history_or_without_its_paper():
    page = SimpleNamespace(file=SimpleNamespace(src_path="methods/dpdm.md"))
    current = (ROOT / "docs" / "methods" / "dpdm.md").read_text()
    assert HOOKS.on_page_markdown(current, page=page) == current
    stale = re.sub(r"(<!-- steps: [^>]+ -->)[^<]*", r"\g<1>1", current, count=1)
    for broken, problem in [(stale, "out of sync"), (current + "\nMeasured in issue 7.\n", "issue 7"),
                            ("# DPDM\n", "lacks a \\*\\*Paper:\\*\\* line"),
                            (current + "\nA step took 2.5 s.\n", "measured '2.5 s'")]:
        with pytest.raises(HOOKS.OutOfSync, match=problem):
            HOOKS.on_page_markdown(broken, page=page)


def test_every_method_has_its_page_in_the_nav():
    assert HOOKS.unlisted_methods((ROOT / "mkdocs.yml").read_text()) == []
    assert HOOKS.unlisted_methods("nav:\n  - DPDM: methods/dpdm.md\n") == [
        name for name in METHODS if name != "dpdm"]
