"""The last line of defence before a log line is written: no secret leaves in it.

The code never logs a secret on purpose (the access log redacts the webhook token, exceptions
name ids, not values). ``redact_secrets`` is a structlog processor that also catches what slips
through, in any field of any line and in the text of a traceback:

* by key name: a field whose name says it holds a secret (``password``, ``token``,
  ``secret``, ``credentials``, ``authorization``, ``cookie``, an API key, a private key,
  ``csrf``...) has its value replaced, however deep in a nested mapping or list;
* by pattern, in every text value (the message and the traceback included): the token part of
  a webhook URL, ``Bearer``/``Basic`` credentials, ``Authorization``/``Cookie`` header lines,
  JSON Web Tokens, our API keys, the user and password of a URL (``redis://:pw@host``), and
  ``name=value`` or ``"name": "value"`` pairs whose name is one of the secret names.

What it cannot know, it cannot catch: a bare random string with no telling name or shape.
That is why the rule stays "never log a secret" and this is only the net under it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import attrs
from structlog.typing import EventDict, WrappedLogger

from tradecore.sessions import API_KEY_PREFIX

REDACTED = "[redacted]"

# Field names holding a secret, matched as a part of the lowercased name: ``webhook_token``,
# ``client_secret``, ``set_cookie`` and ``X-Api-Key`` all match.
_SECRET_NAME_PARTS = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "credential",
    "authorization",
    "cookie",
    "api_key",
    "apikey",
    "api-key",
    "private_key",
    "private-key",
    "csrf",
    "signature",
)
_SECRET_NAME = "|".join(re.escape(part) for part in _SECRET_NAME_PARTS)


@attrs.frozen
class _Rule:
    """``pattern`` replaced by ``replacement``. The pattern can only match a text holding one
    of ``needles`` (lowercase) and, when given, one of ``separators``: checking those first
    (plain substring tests) spares most texts the regular expressions, which cost tens of
    microseconds a line."""

    needles: tuple[str, ...]
    pattern: re.Pattern[str]
    replacement: str
    separators: tuple[str, ...] = ()
    _gate: re.Pattern[str] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        gate = re.compile("|".join(re.escape(needle) for needle in self.needles))
        object.__setattr__(self, "_gate", gate)  # derived once; the rule stays frozen

    def apply(self, text: str, lowered: str) -> str:
        if self._gate.search(lowered) is None:
            return text
        if self.separators and not any(sep in text for sep in self.separators):
            return text
        return self.pattern.sub(self.replacement, text)


_RULES: tuple[_Rule, ...] = (
    # Header lines as a client or a proxy would print them: the whole value goes.
    _Rule(
        ("authorization", "cookie"),
        re.compile(r"(?im)\b((?:proxy-)?authorization|(?:set-)?cookie)(\s*:\s*)[^\r\n]+"),
        rf"\1\2{REDACTED}",
        separators=(":",),
    ),
    # A webhook URL's token segment (its own alphabet, so any text up to the next separator).
    _Rule(("/webhook/",), re.compile(r"(?i)(/webhook/)[^/?#\s\"'<>]+"), r"\1<token>"),
    # HTTP authentication schemes carrying a credential.
    _Rule(
        ("bearer", "basic"),
        re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"),
        rf"\1 {REDACTED}",
    ),
    # JSON Web Tokens: three base64url parts, the first a JSON object ("eyJ").
    _Rule(("eyj",), re.compile(r"\beyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*"), REDACTED),
    # Our API keys.
    _Rule(
        (API_KEY_PREFIX,),
        re.compile(re.escape(API_KEY_PREFIX) + r"[A-Za-z0-9_-]+"),
        f"{API_KEY_PREFIX}{REDACTED}",
    ),
    # The user information of a URL: scheme://user:password@host.
    _Rule(
        ("://",),
        re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@\"']+@"),
        rf"\1{REDACTED}@",
        separators=("@",),
    ),
    # name=value (query strings, DSNs, reprs) and "name": "value" (JSON) with a secret's name.
    _Rule(
        _SECRET_NAME_PARTS,
        re.compile(
            rf"(?i)((?:{_SECRET_NAME})[\w-]*[\"']?\s*[=:]\s*)"
            rf"(?!{re.escape(REDACTED)})(\"[^\"]*\"|'[^']*'|[^\s,;&\"'}}\]]+)"
        ),
        rf"\1{REDACTED}",
        separators=("=", ":"),
    ),
)

# Any rule's needle: most texts (ids, paths, plain messages) hold none, and one search of the
# lowercased text (under a microsecond) lets them through unchanged.
_ANY_NEEDLE = re.compile("|".join(re.escape(n) for rule in _RULES for n in rule.needles))

# Fields every line has that the logging itself writes: never a secret, never scanned.
_WRITTEN_BY_LOGGING = frozenset({"timestamp", "level", "logger"})


@functools.lru_cache(maxsize=1024)
def secret_name(name: str) -> bool:
    """Whether a field called ``name`` holds a secret by its name (lines use few names: the
    answers are kept)."""
    lowered = name.lower()
    return any(part in lowered for part in _SECRET_NAME_PARTS)


def redact_text(text: str) -> str:
    """``text`` with every secret of a known shape replaced."""
    lowered = text.lower()
    if _ANY_NEEDLE.search(lowered) is None:
        return text
    for rule in _RULES:
        text = rule.apply(text, lowered)
    return text


def redact_value(value: Any) -> Any:
    """``value`` with its secrets replaced: text by pattern, mappings by key name and then
    by pattern, lists and tuples item by item. Numbers, booleans and None stay; any other
    object becomes its text, redacted (its ``str`` could hold a URL with a password)."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {
            key: REDACTED if isinstance(key, str) and secret_name(key) else redact_value(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact_value(item) for item in value]
    return redact_text(str(value))


def redact_secrets(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """structlog processor: run after the exception is formatted into text and before the
    renderer, so the rendered line holds no secret (module doc)."""
    return {
        key: value
        if key in _WRITTEN_BY_LOGGING
        else REDACTED
        if secret_name(key)
        else redact_value(value)
        for key, value in event_dict.items()
    }
