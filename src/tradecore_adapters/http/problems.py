"""Error responses as ``application/problem+json`` (RFC 9457): type, title, status, detail.

``type`` is ``urn:tradecore:problem:<code>`` for the service's own refusals (the same stable
code the core's ``Rejected`` carries, also given as the ``code`` member) and ``about:blank``
for plain HTTP errors (unknown path, wrong method, internal error).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from http import HTTPStatus

from aiohttp import web

from tradecore.services.vocabulary import Rejected

PROBLEM_JSON = "application/problem+json"
TYPE_PREFIX = "urn:tradecore:problem:"


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_response(
    status: int,
    detail: str,
    *,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """A problem response; ``code`` None gives ``type: about:blank``."""
    body: dict[str, object] = {
        "type": "about:blank" if code is None else TYPE_PREFIX + code,
        "title": _title(status),
        "status": status,
        "detail": detail,
    }
    if code is not None:
        body["code"] = code
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type=PROBLEM_JSON,
        headers=headers,
    )


def rejected_response(rejected: Rejected) -> web.Response:
    """The problem response of a core refusal (with ``Retry-After`` when it has one, and
    ``WWW-Authenticate`` on 401)."""
    headers: dict[str, str] = {}
    if rejected.retry_after_s is not None and math.isfinite(rejected.retry_after_s):
        headers["Retry-After"] = str(max(1, math.ceil(rejected.retry_after_s)))
    if rejected.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="tradecore"'
    return problem_response(rejected.status, rejected.detail, code=rejected.code, headers=headers)


class Problem(Exception):
    """Raised by handlers and helpers; the error middleware answers with its response."""

    def __init__(self, rejected: Rejected) -> None:
        super().__init__(rejected.code)
        self.rejected = rejected


def fail(status: int, code: str, detail: str) -> Problem:
    """A Problem to raise: ``raise fail(400, "invalid_request", "...")``."""
    return Problem(Rejected(status, code, detail))
