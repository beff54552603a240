"""The rules a user's page keeps, beyond its generated text (scripts/mkdocs_hooks.py applies them to every page).

- A measured number (a time, a size, a percentage, a ratio, or a number after FID, KID, precision, recall or
  accuracy) is generated from a record (a marker pair) or stands in a paragraph, list item or table that names
  the CPU or GPU and the date it was measured on (or whose introducing paragraph, or its section's first
  paragraph, does), or cites the paper that reports it ("the paper reports", "Table 3"). A setting is
  written as code (``--time-budget 30m``), not as prose.
- A term the glossary defines is a link to its glossary entry the first time a page uses it.
- A method page has the agreed sections, in the agreed order.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from markdown.extensions.toc import slugify

NUMBER = r"\d[\d,]*(?:\.\d+)?"
UNIT = r"(?:%|min\b|minutes?\b|s\b|seconds?\b|ms\b|h\b|hours?\b|[KMGT]i?B\b|x(?!\s*\d)\b|×(?!\s*\d))"
METRIC = r"(?:FID∞?|KID|precision|recall|accuracy)"
MEASURED = re.compile(rf"(?<![\w.]){NUMBER}\s?{UNIT}|\b{METRIC}(?: of)?\s+{NUMBER}")
DEVICE = re.compile(r"\b(?:Xeon|EPYC|Ryzen|Core i\d|Apple M\d|Graviton|Neoverse|[AHLTV]\d{2,3}|RTX \d+|"
                    r"GeForce|Tesla|Quadro|Radeon)s?\b")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
CITED = re.compile(r"\b(?:the|its|their) papers?\b[^.]*?\breports?\b|\bTable \d+", re.IGNORECASE)
CODE = re.compile(r"^(```|~~~).*?^\1|`[^`]+`", re.DOTALL | re.MULTILINE)
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
BLOCK_SPLIT = re.compile(r"\n[ \t]*\n")
HEADING = re.compile(r"^#.*$", re.MULTILINE)
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
LINK_TARGET = re.compile(r"\]\([^)\s]+\)")
METHOD_SECTIONS = ("When to use it", "How it works", "Where dpsynth departs from the paper", "Settings",
                   "What to expect")


def _blanked(pattern: re.Pattern[str], text: str) -> str:
    """``text`` with every match of ``pattern`` replaced by spaces (offsets and line breaks kept)."""
    return pattern.sub(lambda match: re.sub(r"[^\n]", " ", match.group(0)), text)


def prose(markdown: str, generated: re.Pattern[str]) -> str:
    """The page as prose: generated text, code, comments and images blanked out, offsets kept."""
    for pattern in (generated, CODE, COMMENT, IMAGE):
        markdown = _blanked(pattern, markdown)
    return markdown


def _units(block: str) -> list[str]:
    """A block split into list items (each with its own context), or the block itself."""
    items = re.split(r"\n(?=[ \t]*(?:[-*+]|\d+\.)[ \t])", block)
    return items if len(items) > 1 else [block]


def _sourced(text: str) -> bool:
    """Whether ``text`` names where its numbers were measured (a device and a date) or cites a paper's report."""
    return bool(DEVICE.search(text) and DATE.search(text) or CITED.search(text))


def _blocks(text: str) -> list[tuple[int, int]]:
    """The spans of ``text``'s paragraphs, lists and tables (split at blank lines)."""
    starts = [0] + [match.end() for match in BLOCK_SPLIT.finditer(text)]
    ends = [match.start() for match in BLOCK_SPLIT.finditer(text)] + [len(text)]
    return list(zip(starts, ends, strict=True))


def unsourced_numbers(markdown: str, name: str, generated: re.Pattern[str]) -> list[str]:
    """A message for each paragraph, list item or table whose measured numbers (outside generated text) have
    neither a record marker nor a CPU and date (generated ones count), there, in the paragraph that introduces
    it, or in the first paragraph of its section."""
    numbers_text = prose(markdown, generated)
    source_text = _blanked(CODE, markdown)
    found, introduction, section = [], "", ""
    for start, end in _blocks(numbers_text):
        stripped, source = numbers_text[start:end].strip(), source_text[start:end]
        if not stripped:
            continue
        if stripped.startswith("#"):
            introduction = section = ""
            continue
        listed = bool(re.match(r"(?:\||[-*+][ \t]|\d+\.[ \t])", stripped))
        context = (introduction if listed else "") + "\n" + section
        units = _units(stripped)
        for unit in units:
            numbers = [" ".join(match.group(0).split()) for match in MEASURED.finditer(unit)]
            own = source if len(units) == 1 else unit
            if numbers and not any(_sourced(text) for text in (own, context)):
                found.append(f"{name}: measured {', '.join(map(repr, numbers[:3]))} with neither a record marker "
                             f"nor a CPU and date: {' '.join(unit.split())[:80]!r}")
        if not listed:
            introduction = source
            section = section or source
    return found


@dataclass(frozen=True)
class Term:
    """A glossary entry: its anchor on the glossary page and the pattern of its name and other spellings."""

    anchor: str
    pattern: re.Pattern[str]


def _spelling(name: str) -> str:
    """A pattern for ``name`` as a whole word, plural allowed, case kept for acronyms."""
    body = re.escape(name.strip()).replace(r"\ ", r"[\s-]+")
    word = rf"(?<![\w-]){body}(?:s|es)?(?![\w∞-])"
    return word if sum(char.isupper() for char in name) >= 2 else f"(?i:{word})"


def glossary_terms(glossary: str) -> list[Term]:
    """The terms of the glossary page: each ``### Name`` heading (``### Name {#anchor}`` where its name has no
    ASCII slug), with the spellings an ``*Also:* a, b.`` line under it lists."""
    terms = []
    for match in re.finditer(r"^### (?P<name>.+?)(?: \{#(?P<anchor>[\w-]+)\})?\n+(?:\*Also:\* (?P<also>[^\n]+?)\.?\n)?",
                             glossary, re.MULTILINE):
        names = [match["name"], *(match["also"].split(", ") if match["also"] else [])]
        pattern = re.compile("|".join(_spelling(name) for name in names))
        terms.append(Term(match["anchor"] or slugify(match["name"], "-"), pattern))
    return terms


def unlinked_terms(markdown: str, name: str, terms: list[Term], generated: re.Pattern[str],
                   glossary_link: str) -> list[str]:
    """A message for each glossary term whose first use on the page is not a link to its entry. Headings are
    not uses (they cannot hold links); a link's target is not either."""
    text = _blanked(HEADING, prose(markdown, generated))
    links = [(match.start(1), match.end(1), match.group(2)) for match in LINK.finditer(text)]
    text = _blanked(LINK_TARGET, text)
    found = []
    for term in terms:
        first = term.pattern.search(text)
        if first is None:
            continue
        target = f"{glossary_link}#{term.anchor}"
        if not any(start <= first.start() and first.end() <= end and link == target for start, end, link in links):
            line = text.count("\n", 0, first.start()) + 1
            found.append(f"{name}:{line}: {first.group(0)!r} is first used without a link to its glossary entry "
                         f"({target})")
    return found


def method_sections(markdown: str, name: str) -> list[str]:
    """A message when a method page's ``##`` sections are not the agreed ones, in the agreed order."""
    sections = tuple(re.findall(r"^## (.+?)\s*$", _blanked(CODE, markdown), re.MULTILINE))
    if sections == METHOD_SECTIONS:
        return []
    return [f"{name}: a method page has the sections {', '.join(METHOD_SECTIONS)} (in that order); "
            f"this one has {', '.join(sections) or 'none'}"]
