"""Fixtures of the edge tests (edge_harness.py describes the stack).

``edge`` (one per session): ``tradecore serve --demo`` behind real nginx with ModSecurity v3
and the OWASP CRS, configured from deploy/edge. Without nginx, the ModSecurity module or the
CRS the tests are skipped with the reason, except in CI (``CI=true``), where they fail
(``.ci/run`` installs the packages).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from edge_harness import EdgeStack, missing_prerequisites


@pytest.fixture(scope="session")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EdgeStack]:
    missing = missing_prerequisites()
    if missing:
        reason = "the edge tests need " + ", ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} in CI (CI=true)", pytrace=False)
        pytest.skip(reason)
    stack = EdgeStack(tmp_path_factory.mktemp("edge"))
    try:
        yield stack
    finally:
        stack.close()
