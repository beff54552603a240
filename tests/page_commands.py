"""The code blocks a docs page shows, and the commands of its shell blocks (tests/test_docs.py runs the short ones,
tests/test_quickstart.py the first run's)."""
from __future__ import annotations

import re
import shlex

# A fenced block, with the ``<!-- long: why -->`` line that marks it too long to run in the tests.
BLOCK = re.compile(r"(<!-- long: (?P<why>[^>]*) -->\n)?```(?P<language>\w*)\n(?P<code>.*?)```", re.DOTALL)


def commands(code: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and blank lines dropped."""
    joined = code.replace("\\\n", " ")
    return [line for line in (" ".join(shlex.split(raw, comments=True)) if raw.strip() else "" for raw in
                              joined.splitlines()) if line]
