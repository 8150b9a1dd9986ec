"""The settings table: one row per environment variable, every ``Settings`` field set by one
row, the table's defaults equal to the class's, and the rules between variables."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from tradecore_entrypoints.settings import RULES, VARIABLES, ConfigError, Settings, Variable

STRONG = "x" * 32
KEY = "A" * 43  # 32 bytes of URL-safe base64


def test_every_settings_field_is_set_by_exactly_one_variable() -> None:
    fields = [variable.field for variable in VARIABLES]
    names = [variable.name for variable in VARIABLES]

    assert sorted(fields) == sorted(field.name for field in attrs.fields(Settings))
    assert len(set(names)) == len(names)
    assert all(name == name.upper() and " " not in name for name in names)


def test_every_variable_has_a_one_line_meaning() -> None:
    for variable in VARIABLES:
        assert variable.meaning and "\n" not in variable.meaning, variable.name


def test_an_empty_environment_gives_the_class_defaults() -> None:
    assert Settings.from_env({}) == Settings()


@pytest.mark.parametrize("variable", VARIABLES, ids=lambda v: v.name)
def test_an_unset_variable_reads_as_its_default(variable: Variable[Any]) -> None:
    expected = None if variable.default is None else variable.parse(variable.name, variable.default)
    assert variable.read({}) == expected


@pytest.mark.parametrize(
    "name", ["RATE_LIMIT_PER_MINUTE", "WORKER_MARK_TTL_S", "TRADECORE_ENV", "CAPTCHA_ENABLED"]
)
def test_a_blank_stripped_variable_counts_as_unset(name: str) -> None:
    assert Settings.from_env({name: "   "}) == Settings()


def test_an_empty_allowed_origins_allows_no_origin_in_development() -> None:
    assert Settings.from_env({"ALLOWED_ORIGINS": ""}).allowed_origins == frozenset()


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"DATABASE_URL": "   "}, "DATABASE_URL must be a postgresql:// URL"),
        ({"DATABASE_URL": "postgresql://[db"}, "DATABASE_URL must be a postgresql:// URL"),
        ({"TERMS_VERSION": "   "}, "TERMS_VERSION must be 1 to 32 characters"),
        ({"PAPER_BROKER_LATENCY_MS": "-1"}, "PAPER_BROKER_LATENCY_MS must be zero or positive"),
        ({"ACCESS_TOKEN_EXPIRE_MINUTES": "1.5"}, "ACCESS_TOKEN_EXPIRE_MINUTES must be an integer"),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable(env: dict[str, str], reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        Settings.from_env(env)


def test_a_secret_never_appears_in_its_refusal() -> None:
    with pytest.raises(ConfigError) as error:
        Settings.from_env({"JWT_SECRET": "hunter2-short"})

    assert "hunter2" not in str(error.value)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TRADECORE_ENV": "production"}, RULES[0].message),
        ({"DATABASE_URL": "postgresql://db/x", "JWT_SECRET": STRONG}, RULES[1].message),
        (
            {"TRADECORE_ENV": "production", "JWT_SECRET": STRONG, "ENCRYPTION_KEY": KEY,
             "ALLOWED_ORIGINS": ""},
            RULES[2].message,
        ),
        ({"CAPTCHA_ENABLED": "on"}, RULES[3].message),
        ({"SMTP_URL": "smtp://mail.example.com"}, RULES[4].message),
    ],
)  # fmt: skip
def test_each_rule_between_variables_refuses_with_its_message(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        Settings.from_env(env)

    assert str(error.value) == message


def test_a_value_fault_is_reported_before_a_broken_rule() -> None:
    with pytest.raises(ConfigError, match="RATE_LIMIT_PER_MINUTE"):
        Settings.from_env({"TRADECORE_ENV": "production", "RATE_LIMIT_PER_MINUTE": "many"})


def test_captcha_follows_the_runtime_mode_unless_set() -> None:
    production = {
        "TRADECORE_ENV": "production",
        "JWT_SECRET": STRONG,
        "ENCRYPTION_KEY": KEY,
    }

    assert Settings.from_env({**production, "TURNSTILE_SECRET": "t"}).captcha_enabled
    assert not Settings.from_env({**production, "CAPTCHA_ENABLED": "off"}).captcha_enabled
    assert not Settings.from_env({}).captcha_enabled
