"""The package's layers only look down (import-linter's contract in pyproject.toml), and a back-import fails it;
its annotations hold (mypy)."""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint_imports(source_root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter's check of the ``dpsynth`` package found under ``source_root``, with the project's contracts."""
    environment = {**os.environ, "PYTHONPATH": str(source_root)}
    return subprocess.run([str(LINT), "--config", str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo"],
                          capture_output=True, text=True, cwd=source_root, env=environment)


def test_the_layers_only_look_down():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 kept, 0 broken" in done.stdout


def test_a_mechanism_that_imports_a_method_breaks_the_contract(tmp_path: Path):
    shutil.copytree(ROOT / "dpsynth", tmp_path / "dpsynth", ignore=shutil.ignore_patterns("__pycache__"))
    mechanisms = tmp_path / "dpsynth" / "privacy" / "mechanisms.py"
    mechanisms.write_text(mechanisms.read_text() + "\nfrom ..methods import METHODS  # noqa: E402\n")
    done = lint_imports(tmp_path)
    assert done.returncode == 1
    assert "dpsynth.privacy.mechanisms -> dpsynth.methods" in done.stdout


def test_no_test_module_imports_another_what_they_share_is_in_conftest():
    modules = {path.stem for path in (ROOT / "tests").glob("test_*.py")}
    imports = [(path.name, node) for path in sorted((ROOT / "tests").glob("*.py"))
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))]
    named = [(name, node.module if isinstance(node, ast.ImportFrom) else alias.name)
             for name, node in imports for alias in node.names]
    assert [(name, module) for name, module in named if module in modules] == []
    assert ("test_distributed.py", "conftest") in named  # the walk finds a test's imports


# Above the boundary a config is a dict (read from YAML, built from --set, handed to the façade dpsynth.api); below
# it, functions take the typed RunConfig, but for the converters that make one.
ABOVE_THE_BOUNDARY = {"cli.py", "pipeline.py", "doctor.py", "rehearsal.py", "estimator.py", "api.py", "config.py",
                      "config_reference.py", "bench"}
CONVERTERS = {"dpsynth/methods/__init__.py:run_config_of", "dpsynth/methods/__init__.py:create_method",
              "dpsynth/methods/base.py:run_config", "dpsynth/methods/base.py:settings",
              "dpsynth/evaluation/evaluate.py:of"}


RAW_DICTS = ("Mapping[str, Any]", "dict[str, Any]", "dict")  # what a raw config is annotated as, but Config


def test_below_the_cli_and_pipeline_only_the_converters_take_the_raw_config_dict():
    takers = {f"{path.relative_to(ROOT)}:{node.name}" for path in sorted((ROOT / "dpsynth").rglob("*.py"))
              if not {path.name, path.parent.name} & ABOVE_THE_BOUNDARY
              for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)
              for arg in node.args.args + node.args.kwonlyargs
              if ast.unparse(arg.annotation or ast.Constant(None)) == "Config" or (
                  arg.arg == "config" and ast.unparse(arg.annotation or ast.Constant(None)) in RAW_DICTS)}
    assert takers == CONVERTERS, "a function below the CLI / pipeline takes the config dict; take the RunConfig:\n" \
        + "\n".join(sorted(takers - CONVERTERS))


RAW_READS = re.compile(r"(?<![.\w])config(\[|\.get\()")  # a config dict's section or key (not a model's .config)


def test_no_module_but_the_configuration_reads_the_raw_config_dict():
    files = [path for path in (ROOT / "dpsynth").rglob("*.py") if path != ROOT / "dpsynth" / "config.py"]
    reads = [f"{path.relative_to(ROOT)}:{number}" for path in files
             for number, line in enumerate(path.read_text().splitlines(), 1) if RAW_READS.search(line)]
    assert reads == [], "raw reads of the config dict; read the section's settings class:\n" + "\n".join(reads)
    assert RAW_READS.search('dataset = config["dataset"]') and RAW_READS.search('config.get("model", {})')
    assert not RAW_READS.search("model.config[key]")


def test_the_package_type_checks(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path), "dpsynth"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
