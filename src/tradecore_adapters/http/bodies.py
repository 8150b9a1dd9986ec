"""Reading request bodies: bounded per route, strict JSON, form-encoded fields.

Over the route's limit is 413 (decided from ``Content-Length`` before anything is read, and
enforced while reading for chunked bodies). The whole body must arrive within
``BODY_READ_TIMEOUT_S`` once the read starts: a client still trickling it then is 408, and
aiohttp closes the connection once its lingering read of the rest ends. JSON is parsed
strictly, as the webhook parser does: ``NaN``/``Infinity``, duplicate keys, deep nesting,
integers past 64 digits and a top level other than an object are 400. Numbers with a fraction
are read as ``Decimal``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from decimal import Decimal
from typing import Any, NoReturn
from urllib.parse import parse_qsl

from aiohttp import web

from tradecore_adapters.http.config import BODY_READ_TIMEOUT_S, JSON_BODY_LIMIT
from tradecore_adapters.http.problems import fail

MAX_DEPTH = 32
MAX_INTEGER_DIGITS = 64
_CHUNK = 4096


async def read_body(request: web.Request, limit: int, *, truncate: bool = False) -> bytes:
    """The raw body, at most ``limit`` bytes. A longer body is 413, or with ``truncate`` its
    first ``limit + 1`` bytes are returned (the caller refuses it with its own answer). A
    body not received within ``BODY_READ_TIMEOUT_S`` is 408."""
    declared = request.content_length
    if declared is not None and declared > limit and not truncate:
        raise fail(413, "body_too_large", f"Request body larger than {limit} bytes")
    try:
        # All of it may have arrived (a small body comes with its headers): then no read can
        # wait, so no timer (arming one is a measurable share of a webhook's CPU).
        arrived = request.content.is_eof()
        async with contextlib.nullcontext() if arrived else asyncio.timeout(BODY_READ_TIMEOUT_S):
            body = await _read_upto(request, limit)
    except TimeoutError:
        request.protocol.close()  # no further request on this connection
        raise fail(
            408, "request_timeout", f"Request body not received within {BODY_READ_TIMEOUT_S:g} s"
        ) from None
    if len(body) > limit and not truncate:
        raise fail(413, "body_too_large", f"Request body larger than {limit} bytes")
    return body


async def _read_upto(request: web.Request, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the body."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await request.content.read(min(_CHUNK, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


class _Invalid(Exception):
    pass


def _constant(name: str) -> NoReturn:
    raise _Invalid(f"{name} is not a valid JSON number")


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise _Invalid(f"integer with more than {MAX_INTEGER_DIGITS} digits")
    return int(text)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _Invalid("duplicate key in a JSON object")
        obj[key] = value
    return obj


def _holds_nul(document: object) -> bool:
    """Whether any string of the document (a key or a value) holds a NUL character (JSON's
    ``\\u0000``): Postgres refuses one in text, and no field of ours may hold one."""
    stack: list[object] = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return True
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


def _depth(document: object) -> int:
    deepest = 0
    stack: list[tuple[object, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        children: list[object]
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; raises a 400 Problem naming the fault (never a value)."""
    try:
        document = json.loads(
            body.decode("utf-8"),
            parse_float=Decimal,
            parse_int=_integer,
            parse_constant=_constant,
            object_pairs_hook=_unique,
        )
    except UnicodeDecodeError:
        raise fail(400, "invalid_json", "Request body is not UTF-8") from None
    except _Invalid as e:
        raise fail(400, "invalid_json", f"Request body is not valid JSON: {e}") from None
    except json.JSONDecodeError as e:
        raise fail(400, "invalid_json", f"Request body is not valid JSON: {e.msg}") from None
    except RecursionError:
        raise fail(400, "invalid_json", "Request body is nested too deeply") from None
    if not isinstance(document, dict):
        raise fail(400, "invalid_json", "Request body must be a JSON object")
    if _depth(document) > MAX_DEPTH:
        raise fail(400, "invalid_json", "Request body is nested too deeply")
    if _holds_nul(document):
        raise fail(400, "invalid_json", "Request body holds a NUL character in a string")
    return document


def _is_json(request: web.Request) -> bool:
    return request.content_type == "application/json" or request.content_type.endswith("+json")


async def json_object(request: web.Request, *, limit: int = JSON_BODY_LIMIT) -> dict[str, Any]:
    """The JSON object body of ``request``: 415 for a non-JSON content type, 413 over
    ``limit``, 400 when malformed. An empty body (with or without a content type) is an
    empty object."""
    typed = "Content-Type" in request.headers
    if typed and not _is_json(request):
        raise fail(415, "unsupported_media_type", "Send the body as application/json")
    body = await read_body(request, limit)
    if not body.strip():
        return {}
    if not typed:
        raise fail(415, "unsupported_media_type", "Send the body as application/json")
    return parse_json_object(body)


async def form_fields(request: web.Request, *, limit: int = JSON_BODY_LIMIT) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (OAuth2 token requests): 415 for another
    content type, 400 for a repeated or undecodable field."""
    if request.content_type != "application/x-www-form-urlencoded":
        raise fail(415, "unsupported_media_type", "Send application/x-www-form-urlencoded")
    body = await read_body(request, limit)
    try:
        pairs = parse_qsl(
            body.decode("ascii"), keep_blank_values=True, strict_parsing=False, errors="strict"
        )
    except (UnicodeDecodeError, ValueError):
        raise fail(400, "invalid_request", "Form body is not valid") from None
    fields: dict[str, str] = {}
    for key, value in pairs:
        if key in fields:
            raise fail(400, "invalid_request", "A form field is repeated")
        fields[key] = value
    return fields
