"""The first-run setup: ``GET /setup/status`` and ``POST /setup/admin``.

While the service has no user at all, setup is open: anyone who reaches it (the edge lets
only the admin IP set through) may create the first administrator, once. The first user
stored, by setup or otherwise, closes it for good: the users store decides that in one
atomic step (``UserRepository.add_first``), so of two concurrent setup requests exactly one
creates an administrator and the other is told setup is closed. Once closed, every
``/setup/*`` request needs an administrator (the HTTP layer authenticates only then, since
nobody can log in before the first user exists).

Each creation attempt leaves one audit entry, ``setup_admin_created``, successful or not; no
entry holds a password. An unreachable store is 503.
"""

from __future__ import annotations

import attrs

from tradecore.audit import AuditAction, RequestContext
from tradecore.identity import Plan, User
from tradecore.ports.identity import PasswordHasher
from tradecore.ports.repositories import UserRepository
from tradecore.ports.runtime import Clock, RandomSource
from tradecore.services.identity.audit import IdentityAudit
from tradecore.services.vocabulary import (
    ADMIN_REQUIRED,
    Principal,
    Rejected,
    bad_request,
    refuses_outages,
)
from tradecore.sessions import normalize_email, validate_password

SETUP_CLOSED = Rejected(
    409,
    "setup_closed",
    "Setup is closed: the service already has users. An administrator adds users with "
    "`tradecore admin create-user`",
)
"""The first administrator exists (or another user does): setup never opens again."""

ADMIN_PLAN = Plan.PRO
"""The first administrator's own plan: the operator of the service is not limited to
simulation."""


@attrs.frozen
class SetupStatus:
    """Whether the first-run setup is open, and the terms version its request must accept."""

    open: bool
    terms_version: str


class FirstRunSetup:
    """The first administrator (see the module docstring). ``terms_version`` is the version
    in force (TERMS_VERSION): the setup request accepts it on the administrator's behalf."""

    def __init__(
        self,
        users: UserRepository,
        hasher: PasswordHasher,
        audit: IdentityAudit,
        clock: Clock,
        random: RandomSource,
        *,
        terms_version: str,
    ) -> None:
        self._users = users
        self._hasher = hasher
        self._audit = audit
        self._clock = clock
        self._random = random
        self._terms_version = terms_version

    @refuses_outages
    async def status(self) -> SetupStatus:
        """Open while no user exists."""
        return SetupStatus(
            open=not await self._users.any_exist(), terms_version=self._terms_version
        )

    @refuses_outages
    async def create_admin(
        self,
        email: object,
        password: object,
        terms_version: object,
        context: RequestContext,
        *,
        caller: Principal | None = None,
    ) -> User | Rejected:
        """``POST /setup/admin``: the first administrator, on plan pro, with the current terms
        accepted. ``caller`` is the authenticated principal when the HTTP layer found setup
        closed (403 unless an administrator). 400 bad input (the password rules of
        registration; ``terms_version`` must be the current one), 409 when any user exists,
        including when a concurrent request created one first."""
        action = AuditAction.SETUP_ADMIN_CREATED
        caller_id = None if caller is None else caller.user_id
        if caller is not None and not caller.user.is_admin:
            await self._audit.record(action, context, caller_id, "administrator required")
            return ADMIN_REQUIRED
        if await self._users.any_exist():
            await self._audit.record(action, context, caller_id, "setup closed")
            return SETUP_CLOSED
        normalized = normalize_email(email)
        problem = "email is not a valid e-mail address" if normalized is None else None
        problem = problem or validate_password(password)
        if problem is None and terms_version != self._terms_version:
            problem = f"terms_version must be the current terms version {self._terms_version!r}"
        if problem is not None or normalized is None or not isinstance(password, str):
            await self._audit.record(action, context, caller_id, "invalid request")
            return bad_request(problem or "invalid request")
        admin = User(
            id=self._random.new_id(),
            email=normalized,
            password_hash=await self._hasher.hash(password),
            plan=ADMIN_PLAN,
            created_at=self._clock.now(),
            accepted_terms_version=self._terms_version,
            is_admin=True,
        )
        if not await self._users.add_first(admin):
            await self._audit.record(action, context, caller_id, "setup closed")
            return SETUP_CLOSED
        await self._audit.record(action, context, admin.id, resource=("user", admin.id))
        return admin
