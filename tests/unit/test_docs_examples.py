"""Docs that show code are run: every ```python block of the listed pages executes cleanly."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ["embedded.md", "testing.md"]
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def blocks() -> list[tuple[str, int, str]]:
    found = []
    for page in PAGES:
        for index, code in enumerate(BLOCK.findall((DOCS / page).read_text())):
            found.append((page, index, code))
    return found


@pytest.mark.parametrize(("page", "index", "code"), blocks(), ids=lambda v: str(v)[:20])
def test_documented_example_runs(page: str, index: int, code: str, tmp_path: Path) -> None:
    script = tmp_path / f"{Path(page).stem}_{index}.py"
    script.write_text(code)
    runpy.run_path(str(script), run_name="__main__")
