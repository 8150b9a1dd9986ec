"""docs/configuration.md and the settings table agree: the same variables, the same defaults.

The page's variable tables are the ones headed ``| variable | default | meaning |``. A row's
default cell is the table's default in backticks, ``unset`` for a variable without one, or
``empty`` for the empty string.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tradecore_entrypoints.settings import VARIABLES, Variable

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
HEADER = "| variable | default | meaning |"
_ROW = re.compile(r"\|\s*`(?P<name>[A-Z][A-Z0-9_]*)`\s*\|\s*(?P<default>[^|]*?)\s*\|")


def documented_rows(text: str) -> list[tuple[str, str]]:
    """``(name, default cell)`` of every row of the page's variable tables, in page order."""
    rows: list[tuple[str, str]] = []
    in_table = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == HEADER:
            in_table = True
            continue
        if not stripped.startswith("|"):
            in_table = False
            continue
        match = _ROW.match(stripped) if in_table else None
        if match is not None:
            rows.append((match["name"], match["default"]))
    return rows


def default_cell(variable: Variable[Any]) -> str:
    if variable.default is None:
        return "unset"
    if variable.default == "":
        return "empty"
    return f"`{variable.default}`"


def test_the_page_lists_every_variable_once_in_table_order() -> None:
    """In the table's order, which is also the order bad values are reported in."""
    names = [name for name, _ in documented_rows(PAGE.read_text(encoding="utf-8"))]

    assert names == [v.name for v in VARIABLES]


def test_the_page_gives_each_variable_its_default() -> None:
    documented = dict(documented_rows(PAGE.read_text(encoding="utf-8")))

    wrong = {
        v.name: (documented.get(v.name), default_cell(v))
        for v in VARIABLES
        if documented.get(v.name) != default_cell(v)
    }
    assert wrong == {}, "documented vs settings.py: " + repr(wrong)


def test_the_reader_finds_disagreement() -> None:
    """The check itself: a missing row, an extra row and a changed default are all seen."""
    table = f"{HEADER}\n|---|---|---|\n| `A_B` | `30` | x |\n| `C` | unset | y |\n\n| `D` | 1 | z |"

    assert documented_rows(table) == [("A_B", "`30`"), ("C", "unset")]
