"""``<NAME>_FILE``: every secret variable can be read from a file, as container secrets are
mounted (compose.yaml gives all of them this way)."""

from __future__ import annotations

import secrets
from pathlib import Path

import attrs
import pytest

from tradecore_entrypoints.settings import VARIABLES, ConfigError, Settings

SECRET_NAMES = [v.name for v in VARIABLES if v.secret]


def _write(path: Path, content: str) -> str:
    path.write_bytes(content.encode())
    return str(path)


def test_the_hidden_settings_are_exactly_the_ones_a_file_may_give() -> None:
    """A field kept out of repr holds a secret; its variable must accept ``_FILE``, and only
    those do (a new secret row without ``secret=True`` fails here)."""
    hidden = {f.name for f in attrs.fields(Settings) if not f.repr}

    assert {v.field for v in VARIABLES if v.secret} == hidden
    assert {"JWT_SECRET", "ENCRYPTION_KEY", "DATABASE_URL", "TURNSTILE_SECRET"} <= set(SECRET_NAMES)


def test_a_secret_file_gives_the_value_without_its_trailing_newline(tmp_path: Path) -> None:
    jwt = secrets.token_urlsafe(48)
    key = secrets.token_urlsafe(32)
    env = {
        "JWT_SECRET_FILE": _write(tmp_path / "jwt", jwt + "\n"),
        "ENCRYPTION_KEY_FILE": _write(tmp_path / "key", key + "\r\n"),
        "DATABASE_URL_FILE": _write(tmp_path / "db", "postgresql://u:p@db:5432/t"),
        "REDIS_URL": "redis://redis:6379/0",
        "CAPTCHA_ENABLED": "on",
        "TURNSTILE_SECRET_FILE": _write(tmp_path / "ts", "0x4AAA  \n"),
    }

    settings = Settings.from_env(env)

    assert settings.jwt_secret == jwt
    assert settings.encryption_key == key
    assert settings.database_url == "postgresql://u:p@db:5432/t"
    assert settings.turnstile_secret == "0x4AAA  "  # only the one line break is dropped


def test_only_one_trailing_newline_is_dropped(tmp_path: Path) -> None:
    env = {"TURNSTILE_SECRET_FILE": _write(tmp_path / "ts", "a secret\n\n")}

    assert Settings.from_env(env).turnstile_secret == "a secret\n"


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_both_the_variable_and_its_file_is_refused(name: str, tmp_path: Path) -> None:
    env = {name: "x" * 40, f"{name}_FILE": _write(tmp_path / "s", "y" * 40)}

    with pytest.raises(ConfigError, match=f"^set {name} or {name}_FILE, not both$"):
        Settings.from_env(env)


def test_an_empty_variable_beside_its_file_counts_as_not_given(tmp_path: Path) -> None:
    """compose and systemd often pass an empty variable; the file then decides."""
    jwt = secrets.token_urlsafe(48)
    env = {"JWT_SECRET": "", "JWT_SECRET_FILE": _write(tmp_path / "jwt", jwt)}

    assert Settings.from_env(env).jwt_secret == jwt


def test_a_missing_file_is_one_line_naming_the_variable_and_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"

    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"JWT_SECRET_FILE": str(missing)})

    assert (
        str(refused.value) == f"JWT_SECRET_FILE: cannot read {missing} (No such file or directory)"
    )


def test_a_file_that_is_not_text_is_refused_without_its_content(tmp_path: Path) -> None:
    path = _write(tmp_path / "bin", "")
    Path(path).write_bytes(b"\xff\xfe secret-bytes")

    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"ENCRYPTION_KEY_FILE": path})

    assert str(refused.value) == f"ENCRYPTION_KEY_FILE: {path} is not UTF-8 text"


def test_a_value_from_a_file_is_checked_like_the_variable(tmp_path: Path) -> None:
    """The parsers and rules see the same text: a short key is refused as JWT_SECRET."""
    env = {"JWT_SECRET_FILE": _write(tmp_path / "jwt", "short\n")}

    with pytest.raises(ConfigError, match="JWT_SECRET"):
        Settings.from_env(env)


def test_a_variable_that_is_no_secret_has_no_file_form(tmp_path: Path) -> None:
    env = {"PUBLIC_BASE_URL_FILE": _write(tmp_path / "url", "https://x.example")}

    assert Settings.from_env(env).public_base_url is None
