"""Layer 3: the webhook secret, stored as a SHA-256 hash and compared in constant time."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tradecore.webhooks.checks import hash_secret, secret_matches, symbol_allowed

SECRET = "Zq3v9X-kL2m_Np8rT5w0yB7cD4fG6hJ1sA3eU9iO0xk"
STORED = hashlib.sha256(SECRET.encode("utf-8")).hexdigest()


def test_hash_secret_is_sha256_hex_of_utf8() -> None:
    assert hash_secret(SECRET) == STORED
    assert hash_secret("clé") == hashlib.sha256("clé".encode()).hexdigest()


def test_the_right_secret_matches() -> None:
    assert secret_matches(SECRET, STORED) is True


@pytest.mark.parametrize(
    "presented",
    [
        SECRET[:-1],
        SECRET + " ",
        SECRET.upper(),
        " " + SECRET,
        "",
        None,
        0,
        12345,
        1.5,
        True,
        [],
        [SECRET],
        {"secret": SECRET},
        SECRET.encode(),  # bytes are not a JSON string
        "clé-秘密",
        "\ud800",  # a lone surrogate cannot even be encoded
        STORED,  # the hash itself is not the secret
    ],
)
def test_anything_else_is_a_wrong_secret_without_raising(presented: object) -> None:
    assert secret_matches(presented, STORED) is False


def test_non_ascii_secrets_compare_correctly() -> None:
    secret = "pässwörd-秘密-🔑"
    stored = hash_secret(secret)
    assert secret_matches(secret, stored) is True
    assert secret_matches("passwörd-秘密-🔑", stored) is False


@given(st.text(st.characters(codec="utf-8"), min_size=1), st.text(st.characters(codec="utf-8")))
def test_matches_exactly_when_equal(secret: str, presented: str) -> None:
    assert secret_matches(presented, hash_secret(secret)) is (presented == secret)


@given(st.from_type(object))
def test_never_raises_for_any_presented_value(presented: object) -> None:
    assert isinstance(secret_matches(presented, STORED), bool)


@pytest.mark.parametrize("stored", ["", "not-a-hash", STORED.upper(), "\u00e9" * 64])
def test_a_malformed_stored_hash_matches_nothing(stored: str) -> None:
    assert secret_matches(SECRET, stored) is False


# --- symbol allowance --------------------------------------------------------------------------

INSTRUMENTS = frozenset({"BTCUSDT", "ETHUSDT", "ES", "MES", "EURUSD", "AAPL"})


def test_allowed_symbols_decide_when_set() -> None:
    allowed = frozenset({"ES", "MES"})
    assert symbol_allowed("ES", allowed, INSTRUMENTS)
    assert not symbol_allowed("BTCUSDT", allowed, INSTRUMENTS)  # listed, but not allowed


def test_empty_allowed_list_means_the_brokers_instruments() -> None:
    assert symbol_allowed("AAPL", frozenset(), INSTRUMENTS)
    assert not symbol_allowed("TSLA", frozenset(), INSTRUMENTS)


def test_symbols_compare_in_canonical_form() -> None:
    assert symbol_allowed(" es ", frozenset({"ES"}), INSTRUMENTS)
    assert symbol_allowed("ES", frozenset({"es"}), INSTRUMENTS)
    assert symbol_allowed("btcusdt", frozenset(), INSTRUMENTS)


def test_nothing_is_allowed_without_instruments_or_allowed_symbols() -> None:
    assert not symbol_allowed("ES", frozenset(), frozenset())
