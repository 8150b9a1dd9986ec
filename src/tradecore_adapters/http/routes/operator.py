"""``/setup/*`` and ``/deployment/*``: the operator's endpoints.

Both are meant to be reached only from the admin IP set (the edge's first rule); the app
checks the caller as well. ``/setup/*`` is open to anyone while the service has no user (the
first-run setup creates the first administrator); after that, as ``/deployment/*`` always
is, it is for administrators only: 401 without credentials, 403 for other users. Responses
are never cached.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tradecore.audit import AuditAction
from tradecore.identity import User
from tradecore.services.execution.deployment_status import DeploymentReport
from tradecore.services.identity.first_run_setup import SetupStatus
from tradecore.services.vocabulary import ADMIN_REQUIRED, Principal, Rejected
from tradecore_adapters.http import views
from tradecore_adapters.http.bodies import json_object
from tradecore_adapters.http.principal import CSRF_FAILED, audit_refusal, authenticate
from tradecore_adapters.http.problems import Problem
from tradecore_adapters.http.state import CONFIG, SERVICES, request_context

NO_STORE = {"Cache-Control": "no-store"}

routes = web.RouteTableDef()


def _answer(body: dict[str, Any], *, status: int = 200) -> web.Response:
    return views.json_response(body, status=status, headers=NO_STORE)


async def _setup_status(request: web.Request) -> SetupStatus:
    outcome = await request.app[SERVICES].setup.status()
    if isinstance(outcome, Rejected):
        raise Problem(outcome)
    return outcome


async def _setup_caller(request: web.Request) -> Principal:
    """The authenticated caller of a setup creation once setup is closed; a refusal of the
    authentication is audited as a setup attempt (a CSRF failure already has its entry)."""
    try:
        return await authenticate(request)
    except Problem as e:
        if e.rejected == CSRF_FAILED:
            raise
        raise await audit_refusal(request, AuditAction.SETUP_ADMIN_CREATED, e.rejected) from None


@routes.get("/setup/status")
async def setup_status(request: web.Request) -> web.Response:
    """``{"open", "terms_version"}``: anyone may ask while setup is open, administrators
    only once it is closed."""
    status = await _setup_status(request)
    if not status.open and not (await authenticate(request)).user.is_admin:
        raise Problem(ADMIN_REQUIRED)
    return _answer({"open": status.open, "terms_version": status.terms_version})


@routes.post("/setup/admin")
async def setup_admin(request: web.Request) -> web.Response:
    """Create the first administrator from ``{email, password, terms_version}``: 201 with
    the user; 409 once any user exists."""
    services = request.app[SERVICES]
    caller = None if (await _setup_status(request)).open else await _setup_caller(request)
    try:
        body = await json_object(request)
    except Problem as e:
        user_id = None if caller is None else caller.user_id
        raise await audit_refusal(
            request, AuditAction.SETUP_ADMIN_CREATED, e.rejected, user_id=user_id
        ) from None
    outcome = await services.setup.create_admin(
        body.get("email"),
        body.get("password"),
        body.get("terms_version"),
        request_context(request),
        caller=caller,
    )
    if isinstance(outcome, Rejected):
        raise Problem(outcome)
    return _answer({"user": _admin_body(request, outcome)}, status=201)


def _admin_body(request: web.Request, user: User) -> dict[str, Any]:
    services, config = request.app[SERVICES], request.app[CONFIG]
    plan = user.effective_plan(services.clock.now())
    return views.user(user, plan=plan, terms_version=config.terms_version)


@routes.get("/deployment/status")
async def deployment_status(request: web.Request) -> web.Response:
    """The operator's status document (``DeploymentReport``)."""
    principal = await authenticate(request)
    outcome = await request.app[SERVICES].deployment.report(principal)
    if isinstance(outcome, Rejected):
        raise Problem(outcome)
    return _answer(deployment_body(outcome))


def deployment_body(report: DeploymentReport) -> dict[str, Any]:
    """The JSON shape of ``GET /deployment/status`` (docs/api.md)."""
    schema = report.schema
    return {
        "version": report.version,
        "checked_at": views.timestamp(report.checked_at),
        "schema": {
            "store": schema.store,
            "applied": [
                {"name": m.name, "applied_at": views.timestamp(m.applied_at)}
                for m in schema.applied
            ],
            "pending": list(schema.pending),
        },
        "worker_hosts": [{"holder": h.holder, "users": list(h.users)} for h in report.worker_hosts],
        "queues": {
            "order_requests": [
                {"user_id": d.user_id, "waiting": d.waiting, "in_flight": d.in_flight}
                for d in report.order_queues
            ],
            "fill_tasks_pending": report.fill_tasks_pending,
            "dead_letter_count": report.dead_letter_count,
        },
        "dead_letters": [
            {
                "order_id": d.order_id,
                "user_id": d.user_id,
                "trading_account_id": d.trading_account_id,
                "reason": d.reason,
            }
            for d in report.dead_letters
        ],
        "truncated": report.truncated,
    }
