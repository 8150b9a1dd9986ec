"""docs/spec-map.md points only at tests that exist: every `file::test` it names is defined."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC_MAP = ROOT / "docs" / "spec-map.md"
REFERENCE = re.compile(
    r"`((?:unit|contract|http|integration|faults|browser|edge|packaging)/[\w/]+\.py)?(?:::(\w+))?`"
)


def references() -> list[tuple[str, str | None]]:
    """(test file, test name or None) for every reference, shorthand `::name` resolved to
    the file named last on the same line."""
    found: list[tuple[str, str | None]] = []
    for line in SPEC_MAP.read_text().splitlines():
        current: str | None = None
        for match in REFERENCE.finditer(line):
            path, name = match.groups()
            if path is None and name is None:
                continue
            current = path or current
            assert current is not None, f"shorthand ::{name} without a file in: {line}"
            found.append((current, name))
    return found


def test_every_referenced_test_exists() -> None:
    refs = references()
    missing = []
    for path, name in refs:
        file = ROOT / "tests" / path
        if not file.exists():
            missing.append(path)
        elif name is not None and not re.search(
            rf"^\s*(async\s+)?def {name}\(", file.read_text(), re.MULTILINE
        ):
            missing.append(f"{path}::{name}")

    assert len(refs) > 100
    assert missing == []
