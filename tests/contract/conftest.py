"""Contract suites: the same tests against the memory adapter and the real one of each port.

The real services are required in CI (``CI=true``): there an unreachable Postgres or Redis is
a failure, not a skip. Elsewhere their tests are skipped with the reason.
"""

from __future__ import annotations

from postgres_fixtures import *  # noqa: F403
from redis_fixtures import *  # noqa: F403
