"""The access logger is skipped entirely when its lines would be dropped."""

from __future__ import annotations

import logging

from tradecore_adapters.http.access_log import RedactingAccessLogger


def test_enabled_follows_the_info_level() -> None:
    logger = logging.getLogger("tradecore.test.access")
    access = RedactingAccessLogger(logger, "")
    logger.setLevel(logging.WARNING)
    assert not access.enabled
    logger.setLevel(logging.INFO)
    assert access.enabled
