"""MkDocs hook: pages hold ``<!-- config: shared -->`` or ``<!-- config: METHOD -->``, replaced at build time by
tables generated from the code's defaults (dpsynth.config.BASE_CONFIG, each method's sections and presets), so
the configuration reference cannot drift from the code."""
from __future__ import annotations

import re
from typing import Any

from dpsynth.config_reference import config_table

MARKER = re.compile(r"<!-- config: ([a-z0-9-]+) -->")


def on_page_markdown(markdown: str, **_: Any) -> str:
    return MARKER.sub(lambda match: config_table(match.group(1)), markdown)
