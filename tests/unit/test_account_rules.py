"""The account field rules (``tradecore.account_rules``): pure functions, tested without any
service or store."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tradecore.account_rules import (
    DEFAULT_BROKER,
    MAX_CREDENTIALS_BYTES,
    MAX_ID_CHARS,
    MAX_NAME_CHARS,
    AccountRules,
    InvalidField,
    account_name,
    allowed_symbols,
    broker_name,
    credential_fields,
    encode_credentials,
    request_age,
    requested_id,
    symbol_aliases,
    symbol_list,
    unsealed_credential_fields,
    use_testnet,
)

RULES = AccountRules()
LISTED = frozenset({"BTCUSDT", "ES"})


def test_a_name_is_trimmed_and_bounded() -> None:
    assert account_name("  Main ") == "Main"
    assert account_name("x" * MAX_NAME_CHARS) == "x" * MAX_NAME_CHARS
    for bad in ("", "   ", "x" * (MAX_NAME_CHARS + 1), "tab\there", 7, None):
        with pytest.raises(InvalidField, match="name must be 1 to 100 printable characters"):
            account_name(bad)


def test_the_broker_defaults_to_paper_and_must_be_a_short_string() -> None:
    assert broker_name(None) == DEFAULT_BROKER == "paper"
    assert broker_name("ibkr") == "ibkr"
    for bad in ("", "x" * 33, 5, ["paper"]):
        with pytest.raises(InvalidField, match="broker is not supported"):
            broker_name(bad)


def test_the_request_age_is_an_integer_within_inclusive_bounds() -> None:
    assert request_age(5, RULES) == 5 and request_age(3600, RULES) == 3600
    for bad in (4, 3601, True, "60", 60.0, None):
        with pytest.raises(InvalidField, match="from 5 to 3600 seconds"):
            request_age(bad, RULES)
    narrow = AccountRules(min_request_age=10, max_request_age=20)
    with pytest.raises(InvalidField, match="from 10 to 20 seconds"):
        request_age(5, narrow)


def test_the_symbol_list_is_a_bounded_list() -> None:
    assert symbol_list(["a", 7], RULES) == ["a", 7]  # the items are read by allowed_symbols
    for bad in ("BTCUSDT", None, {"BTCUSDT"}, ["X"] * 501):
        with pytest.raises(InvalidField, match="a list of at most 500 symbols"):
            symbol_list(bad, RULES)


def test_allowed_symbols_are_canonical_listed_symbols() -> None:
    assert allowed_symbols(["btcusdt", " ES ", "BTCUSDT"], LISTED, {}) == frozenset(LISTED)
    assert allowed_symbols([], LISTED, {}) == frozenset()
    for bad in (["BTC USDT"], ["é"], [7], [""]):
        with pytest.raises(InvalidField, match="not a symbol"):
            allowed_symbols(bad, LISTED, {})
    with pytest.raises(InvalidField, match="the broker does not list"):
        allowed_symbols(["ETHUSDT"], LISTED, {})


def test_allowed_symbols_are_stored_as_the_venue_names_them() -> None:
    aliases = {"ES1!": "ES"}
    sent = ["BINANCE:BTCUSDT", "BTCUSDT.P", "BTC/USDT:USDT", "CME_MINI:ES1!"]
    assert allowed_symbols(sent, LISTED, aliases) == frozenset(LISTED)


def test_symbol_aliases_map_to_listed_symbols() -> None:
    assert symbol_aliases({"es1!": "es", "MES1!": "ES"}, LISTED, RULES) == {
        "ES1!": "ES",
        "MES1!": "ES",
    }
    with pytest.raises(InvalidField, match="does not list"):
        symbol_aliases({"NQ1!": "NQ"}, LISTED, RULES)
    for bad in ({"bad alias": "ES"}, {"ES1!": 7}, ["ES1!"], {f"A{i}": "ES" for i in range(201)}):
        with pytest.raises(InvalidField, match="symbol_map"):
            symbol_aliases(bad, LISTED, RULES)


def test_the_testnet_switch_is_a_boolean() -> None:
    assert use_testnet(True) is True and use_testnet(False) is False
    for bad in ("true", 1, None):
        with pytest.raises(InvalidField, match="testnet must be true or false"):
            use_testnet(bad)


def test_allowed_symbols_are_checked_item_by_item_in_order() -> None:
    with pytest.raises(InvalidField, match="the broker does not list"):
        allowed_symbols(["NOPE", "BTC USDT"], LISTED, {})
    with pytest.raises(InvalidField, match="not a symbol"):
        allowed_symbols(["BTC USDT", "NOPE"], LISTED, {})


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("a string", "JSON object of strings"),
        (["api_key"], "JSON object of strings"),
        ({f"k{n}": "x" for n in range(21)}, "at most 20 fields"),
        ({"api key": "x"}, "field names"),
        ({"1key": "x"}, "field names"),
        ({"k": 5}, "strings of at most 4096"),
        ({"k": "x" * 4097}, "strings of at most 4096"),
        ({"k": "\ud800"}, "valid Unicode text"),
    ],
)
def test_credentials_refused_name_the_rule_never_the_value(value: object, rule: str) -> None:
    with pytest.raises(InvalidField, match=rule) as refused:
        credential_fields(value)
    assert "x" * 50 not in str(refused.value) and "api key" not in str(refused.value)


@pytest.mark.parametrize(
    ("plaintext", "rule"),
    [
        (b"not json", "UTF-8 JSON object"),
        (b"\xff\xfe", "UTF-8 JSON object"),
        (b"[1, 2]", "JSON object of strings"),
        (b'{"k": 1}', "strings of at most"),
        (b'{"k": "a", "k": "b"}', "repeat a field"),
        (b'{"k": NaN}', "JSON object of strings"),
        (b" " * (MAX_CREDENTIALS_BYTES + 1), "at most 16384 bytes"),
    ],
)
def test_sealed_credentials_are_parsed_strictly(plaintext: bytes, rule: str) -> None:
    with pytest.raises(InvalidField, match=rule):
        unsealed_credential_fields(plaintext)


@given(
    st.dictionaries(
        st.from_regex(r"[A-Za-z][A-Za-z0-9_.\-]{0,20}", fullmatch=True),
        st.text(max_size=60),
        max_size=20,
    )
)
def test_encoded_credentials_read_back_as_they_were(fields: dict[str, str]) -> None:
    encoded = encode_credentials(fields)
    assert unsealed_credential_fields(encoded) == fields
    assert encoded == json.dumps(
        fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")


def test_only_a_short_string_can_be_an_account_id() -> None:
    assert requested_id("acc-1") == "acc-1"
    assert requested_id("x" * MAX_ID_CHARS) == "x" * MAX_ID_CHARS
    for bad in ("", "x" * (MAX_ID_CHARS + 1), 5, None):
        assert requested_id(bad) is None


@pytest.mark.parametrize(
    "field", ["min_request_age", "max_request_age", "max_allowed_symbols", "max_accounts"]
)
def test_every_bound_of_the_rules_is_positive(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        AccountRules(**{field: 0})
