"""WORKER_MARK_TTL_S: the worker lease's time to live, read from the environment."""

from __future__ import annotations

import pytest

from tradecore.services.execution.worker_host import HostSettings
from tradecore_entrypoints.settings import ConfigError, Settings


def test_the_lease_lives_30_s_by_default() -> None:
    settings = Settings.from_env({})

    assert settings.worker_mark_ttl_s == HostSettings().mark_ttl_s == 30.0
    assert settings.host_settings().mark_ttl_s == 30.0


@pytest.mark.parametrize(("raw", "ttl_s"), [("12", 12.0), (" 3 ", 3.0), ("7.5", 7.5), ("", 30.0)])
def test_the_lease_time_to_live_is_read_in_seconds(raw: str, ttl_s: float) -> None:
    settings = Settings.from_env({"WORKER_MARK_TTL_S": raw})

    assert settings.host_settings().mark_ttl_s == ttl_s


@pytest.mark.parametrize("raw", ["2.9", "0", "-30", "nan", "inf", "thirty"])
def test_a_lease_time_to_live_below_3_s_or_not_a_number_is_refused(raw: str) -> None:
    with pytest.raises(ConfigError) as error:
        Settings.from_env({"WORKER_MARK_TTL_S": raw})

    message = str(error.value)
    assert "WORKER_MARK_TTL_S" in message and "\n" not in message
