"""The rate windows are fixed windows per client address that end: after the window, the
next request opens a new one with the full limit. Shown on rule 3 with a 5-second window
(its own edge, so the other tests keep their 5-minute windows). A window opens at its
address's first request, counted in whole TIME_EPOCH seconds, so it lasts at least 4 s from
that request; a burst of the limit (about 0.3 s here, a few times that on a loaded machine)
ends well inside it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from edge_harness import LOGIN_LIMIT, EdgeStack

WINDOW_S = 5
REFUSED = "3-login-rate-limit"


@pytest.fixture(scope="module")
def short_window_edge(
    tmp_path_factory: pytest.TempPathFactory, edge_packages: None
) -> Iterator[EdgeStack]:
    stack = EdgeStack(tmp_path_factory.mktemp("edge-window"), login_window_s=WINDOW_S)
    try:
        yield stack
    finally:
        stack.close()


def _burst(edge: EdgeStack, client: str, count: int) -> list[str]:
    """``count`` requests to /auth/forgot-password; the edge_rule of each."""
    before = len(edge.decisions(client))
    for _ in range(count):
        edge.post_json(client, "/auth/forgot-password", {})
    return [entry["edge_rule"] for entry in edge.decisions(client)[before:]]


def test_a_new_window_opens_after_the_window_and_admits_the_limit_again(
    short_window_edge: EdgeStack,
) -> None:
    edge = short_window_edge
    client = "127.0.0.40"
    assert _burst(edge, client, LOGIN_LIMIT + 2) == ["-"] * LOGIN_LIMIT + [REFUSED] * 2

    # Wait out the window (whole seconds of TIME_EPOCH; one more second of margin), then the
    # same address has the whole limit again, and not more.
    time.sleep(WINDOW_S + 1)
    assert _burst(edge, client, LOGIN_LIMIT + 2) == ["-"] * LOGIN_LIMIT + [REFUSED] * 2
