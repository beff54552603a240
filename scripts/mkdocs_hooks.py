"""Generated text in the docs and the README, kept in sync with the code and the bench record.

A marker pair holds what the code or the record says, committed in the Markdown so it reads the same on the forge
and on the site: ``<!-- KIND: ARGS -->`` ... ``<!-- /KIND -->``. Kinds:

- ``config: shared|METHOD|reference``: a table of the code's defaults (dpsynth.config_reference);
- ``bench: DIR``: the tables of the bench record ``benchmarks/results/DIR`` with when and where it ran;
- ``bench: DIR METHOD EPSILON KEY``: one number of that record (a results.csv column), as the bench writes it;
- ``frontier: DIR [DIR ...]``: accuracy / FID-inf against synthesis hours of those records' finished cells;
- ``plans: DIR``: the derived plans measured in ``benchmarks/results/DIR``, expected against measured time;
- ``plan-outcomes: FOLDER [FOLDER ...]``: what those measurements gave, side by side, without their times;
- ``plan: FOLDER KEY``: one value of one plan measurement (dpsynth.bench.plans.quote);
- ``steps: METHOD PRESET SECTION N``: the DP-SGD steps that preset plans for section SECTION on N training images;
- ``paper: METHOD``: the method's paper (dpsynth.methods.base.Paper), as its docs page and datasheets cite it;
- ``loads: DIR``: the folder-loading records (``benchmarks/folder_load.py``) in ``benchmarks/results/DIR``;
- ``cli: all``: every command's ``--help``, as the parser prints it;
- ``odds: EPSILON [EPSILON ...]``: what each ε bounds: the odds factor e^ε and how sure an attacker can become;
- ``recipes: all``: the measured recipes at holders' sides that ``dpsynth privacy`` recommends from;
- ``schema: config``: the version of config.yaml's layout this dpsynth writes (dpsynth.config.SCHEMA);
- ``floor: EPSILON [EPSILON ...]``: the least noise per example σ/B that 600 DP-SGD steps reach at N = 300, 1,000,
  3,000 (and each ε), at the largest sample rate a plan uses.

``python scripts/mkdocs_hooks.py --write`` regenerates every pair in place; ``--check`` lists the files out of
sync. As an MkDocs hook it fails the build on a page out of sync, a marker without its end, or a method of
``dpsynth.methods`` without its page ``docs/methods/NAME.md`` in the nav.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import docs_rules  # scripts/, beside this file: MkDocs puts it on the path, as the tests do
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

from dpsynth.api import resolve_config
from dpsynth.autoplan.recipes import recorded_recipes
from dpsynth.autoplan.regime import least_noise_per_example
from dpsynth.autoplan.rules import MAX_SAMPLE_RATE, STEP_TARGET, dpsgd_steps
from dpsynth.bench import frontier, plans, recipes, record
from dpsynth.cli import build_parser
from dpsynth.config import SCHEMA
from dpsynth.config_reference import config_table
from dpsynth.datasheet import certainty_after, percent
from dpsynth.errors import DpsynthError
from dpsynth.methods import METHODS, get_method

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GLOSSARY = "docs/reference/glossary.md"
CHANGELOG = "changelog.md"  # the site's page of CHANGELOG.md: history, which the other pages leave to it
KINDS = "config|schema|bench|frontier|plans|plan-outcomes|plan|steps|paper|loads|odds|recipes|floor|cli"
PAIR = re.compile(rf"(?<!`)<!-- (?P<kind>{KINDS}): (?P<args>[a-z0-9._/ -]+?) -->(?P<body>.*?)<!-- /(?P=kind) -->",
                  re.DOTALL)
OPENING = re.compile(rf"(?<!`)<!-- (?:{KINDS}): ")
# Kinds whose marker with these many arguments sits in a sentence.
INLINE = {"bench": 4, "plan": 2, "steps": 4, "schema": 1}
# History in a user's page: an issue number, a working session, a time of day, a relative day.
NOTEBOOK = re.compile(r"\bissues? ?#?\d+|\bsessions?\b|\bsittings?\b|\b(?:[01]?\d|2[0-3]):[0-5]\d\b|"
                      r"\b(?:today|yesterday|tonight|(?:this|that) (?:morning|afternoon|evening))\b", re.IGNORECASE)
PAPER = re.compile(r"^\*\*Paper:\*\* (?:.+\n)+", re.MULTILINE)
PAPER_PARTS = {"a year": re.compile(r"\b(?:19|20)\d\d\b"), "a link": re.compile(r"\]\(https?://")}


class OutOfSync(PluginError):
    """A page whose generated text differs from what the code and the record say, or a marker without its end."""


def generated(kind: str, args: list[str]) -> str:
    """What the marker ``kind: args`` stands for."""
    if kind == "config":
        return config_table(args[0])
    if kind == "schema":
        return f"`schema: {SCHEMA}`"
    if kind == "bench":
        if len(args) == 1:
            return record.table(RESULTS / args[0])
        directory, method, epsilon, key = args
        return record.value(RESULTS / directory, method, float(epsilon), key)
    if kind == "frontier":
        return frontier.table([RESULTS / directory for directory in args])
    if kind == "plans":
        return plans.table(RESULTS / args[0])
    if kind == "plan":
        return plans.quote(RESULTS / args[0], args[1])
    if kind == "paper":
        return get_method(args[0]).declaration.paper.markdown()
    if kind == "loads":
        return folder_loads(RESULTS / args[0])
    if kind == "odds":
        return odds([float(epsilon) for epsilon in args])
    if kind == "cli":
        return command_help(build_parser())
    if kind == "recipes":
        return recipes.table(recorded_recipes())
    if kind == "floor":
        return noise_floor([float(epsilon) for epsilon in args])
    if kind == "steps":
        method, preset, section, num_train = args
        settings = get_method(method).settings(resolve_config(method, preset=preset), section)
        return f"{dpsgd_steps(settings, int(num_train)):,}"
    return plans.outcomes([RESULTS / folder for folder in args])


def folder_loads(directory: Path) -> str:
    """A row per load of each record of ``benchmarks/folder_load.py``: machine and date, the folder, the wall time
    and its ratio to the run's first load, and the peak RSS as a multiple of the decoded uint8 array."""
    rows = ["| machine, date | folder | load | wall time | peak RSS |", "| --- | --- | --- | --- | --- |"]
    for line in (directory / "records.jsonl").read_text().splitlines():
        run = json.loads(line)
        first = next(iter(run["results"].values()))["seconds"]
        for name, result in run["results"].items():
            peak = max(result["rss"], result["worker_rss"])
            rows.append(f"| {run['machine']}, {run['date']} | {run['images']:,} RGB JPEGs read at {run['side']} px "
                        f"({result['array'] / 2**30:.2f} GiB) | {name} | {result['seconds']:.1f} s "
                        f"({result['seconds'] / first:.2f}x) | {peak / 2**30:.2f} GiB, "
                        f"{peak / result['array']:.2f}x the array |")
    return "\n".join(rows)


def _commands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """``parser`` and every sub-command's parser under it, depth first."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                found += _commands(child)
    return found


def command_help(parser: argparse.ArgumentParser) -> str:
    """A section per command with its ``--help`` text, formatted 100 columns wide whatever the terminal."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        sections = [f"### `{command.prog}`\n\n```text\n{command.format_help().rstrip()}\n```"
                    for command in _commands(parser) if command.prog != parser.prog]
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return "\n\n".join(sections)


FLOOR_SIZES = (300, 1000, 3000)


def noise_floor(epsilons: list[float]) -> str:
    """The least noise per example of :data:`STEP_TARGET` steps at the largest sample rate a plan uses, for each
    N of :data:`FLOOR_SIZES` and each ε."""
    rows = [f"| N | {' | '.join(f'σ/B at ε = {epsilon:g}' for epsilon in epsilons)} |",
            "| --- " * (len(epsilons) + 1) + "|"]
    for units in FLOOR_SIZES:
        cells = [f"{least_noise_per_example(units, epsilon, STEP_TARGET, MAX_SAMPLE_RATE):.3f}"
                 for epsilon in epsilons]
        rows.append(f"| {units:,} | {' | '.join(cells)} |")
    return "\n".join(rows)


def odds(epsilons: list[float]) -> str:
    """For each ε: e^ε, and the most an attacker 50 % or 1 % sure that a person is in the data can be after the
    release (prior odds times e^ε; δ aside)."""
    rows = ["| ε | any outcome at most this many times as likely | 50 % sure becomes at most | "
            "1 % sure becomes at most |", "| --- | --- | --- | --- |"]
    for epsilon in epsilons:
        factor = math.exp(epsilon)
        after = [certainty_after(epsilon, prior) for prior in (0.5, 0.01)]
        shown = f"{factor:,.1f}" if factor < 100 else f"{factor:,.0f}"
        rows.append(f"| {epsilon:g} | {shown} | {percent(after[0])} | {percent(after[1])} |")
    return "\n".join(rows)


def synced(text: str, name: str) -> str:
    """``text`` with every marker pair's body regenerated; OutOfSync naming ``name`` on a marker without its end."""
    def fill(match: re.Match[str]) -> str:
        kind, args = match["kind"], match["args"].split()
        try:
            body = generated(kind, args).strip()
        except DpsynthError as error:
            raise OutOfSync(f"{name}: {error}") from error
        if INLINE.get(kind) != len(args):
            body = f"\n\n{body}\n\n"
        return f"<!-- {kind}: {match['args']} -->{body}<!-- /{kind} -->"

    opened, paired = len(OPENING.findall(text)), len(PAIR.findall(text))
    if opened != paired:
        raise OutOfSync(f"{name}: {opened - paired} generated-text marker(s) without their <!-- /KIND --> end")
    return PAIR.sub(fill, text)


def problems(markdown: str, name: str) -> list[str]:
    """What a user's page ``name`` (a path from the repository's root) must not do: recount its own history
    (outside generated text); quote a measured number with neither a record marker nor its CPU and date; use a
    glossary term before linking it; on a method page, lack its paper (a ``**Paper:**`` paragraph with a year
    and a link) or the agreed sections."""
    found = [f"{name}: mentions {match.group(0)!r}; pages say what a thing is, history goes to CHANGELOG.md"
             for match in NOTEBOOK.finditer(PAIR.sub("", markdown))]
    found += docs_rules.unsourced_numbers(markdown, name, PAIR)
    if name != GLOSSARY:
        link = os.path.relpath(GLOSSARY, os.path.dirname(name) or ".")
        found += docs_rules.unlinked_terms(markdown, name, glossary(), PAIR, link)
    if re.search(r"(^|/)methods/(?!index\.md$)[^/]+\.md$", name):
        paper = PAPER.search(markdown)
        missing = ["a **Paper:** line"] if paper is None else [
            part for part, pattern in PAPER_PARTS.items() if not pattern.search(paper.group(0))]
        found += [f"{name}: the paper reference lacks {part}" for part in missing]
        found += docs_rules.method_sections(markdown, name)
    return found


@functools.cache
def glossary() -> list[docs_rules.Term]:
    """The glossary's terms, read once."""
    return docs_rules.glossary_terms((ROOT / GLOSSARY).read_text())


def unlisted_methods(nav: str) -> list[str]:
    """The methods whose page ``methods/NAME.md`` the nav (mkdocs.yml's text) does not list, or that lacks one."""
    return [name for name in METHODS if f"methods/{name}.md" not in nav
            or not (ROOT / "docs" / "methods" / f"{name}.md").is_file()]


def on_config(config: Any, **_: Any) -> Any:
    missing = unlisted_methods((ROOT / "mkdocs.yml").read_text())
    if missing:
        raise OutOfSync(f"mkdocs.yml: the nav lists no page docs/methods/NAME.md for {', '.join(missing)}")
    return config


def pages() -> list[Path]:
    """The Markdown that may hold markers: the README and the docs."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def stale(paths: list[Path]) -> list[Path]:
    """The files among ``paths`` whose generated text is out of sync."""
    return [path for path in paths if synced(path.read_text(), str(path)) != path.read_text()]


def on_files(files: Files, config: Any, **_: Any) -> Files:
    """The changelog as a page of the site, from CHANGELOG.md at the repository's root."""
    files.append(File.generated(config, CHANGELOG, content=(ROOT / "CHANGELOG.md").read_text()))
    return files


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_path == CHANGELOG:
        return markdown
    found = problems(markdown, f"docs/{page.file.src_path}")
    if found:
        raise OutOfSync("; ".join(found))
    if synced(markdown, page.file.src_path) != markdown:
        raise OutOfSync(f"docs/{page.file.src_path}: its generated text is out of sync with the code or the bench "
                        "record; run .venv/bin/python scripts/mkdocs_hooks.py --write")
    return markdown


def main() -> int:
    parser = argparse.ArgumentParser(description="Regenerate or check the generated text of the docs and README.")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the files out of sync")
    mode.add_argument("--check", action="store_true", help="list the files out of sync; exit 1 if any")
    write = parser.parse_args().write
    try:
        found = stale(pages())
    except OutOfSync as error:
        print(error, file=sys.stderr)
        return 1
    for path in found:
        if write:
            path.write_text(synced(path.read_text(), str(path)))
        print(f"{'rewrote' if write else 'out of sync'}: {path.relative_to(ROOT)}")
    return 1 if found and not write else 0


if __name__ == "__main__":
    sys.exit(main())
