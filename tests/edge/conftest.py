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


def require_edge_packages() -> None:
    """Skip the calling test without nginx, its ModSecurity module or the CRS, saying which;
    fail instead in CI (``CI=true``), where ``.ci/run`` installs them."""
    missing = missing_prerequisites()
    if missing:
        reason = "the edge tests need " + ", ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} in CI (CI=true)", pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def edge_packages() -> None:
    """``require_edge_packages`` for a test that starts its own nginx."""
    require_edge_packages()


@pytest.fixture(scope="session")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EdgeStack]:
    require_edge_packages()
    stack = EdgeStack(tmp_path_factory.mktemp("edge"))
    try:
        yield stack
    finally:
        stack.close()
