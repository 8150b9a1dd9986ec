"""compose.yaml: valid against the Compose specification's schema (deploy/schema), and in step
with what the fault tests start without containers (tests/faults/harness.py and conftest.py):
the same subcommands with options the command line accepts, the variables the harness gives
every process, a configuration ``Settings`` accepts, and the edge's upstreams."""

from __future__ import annotations

import ast
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from tradecore_entrypoints.cli import main
from tradecore_entrypoints.settings import VARIABLES, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
SCHEMA = ROOT / "deploy" / "schema" / "compose-spec.json"
FAULTS = ROOT / "tests" / "faults"
UPSTREAM = ROOT / "deploy" / "compose" / "upstream.conf"
CHECK_JSONSCHEMA = shutil.which(
    "check-jsonschema", path=str(Path(sys.executable).parent)
) or shutil.which("check-jsonschema")
SECRET_NAMES = {v.name for v in VARIABLES if v.secret}
KNOWN_NAMES = {v.name for v in VARIABLES}

# What an operator's shell or .env gives the ${...} placeholders, and what the secret files
# hold, for checking the configuration the containers would read.
OPERATOR = {
    "PUBLIC_BASE_URL": "https://trade.example.com",
    "ALLOWED_ORIGINS": "https://app.example.com",
    "MAIL_FROM": "alerts@example.com",
    "TURNSTILE_SITE_KEY": "1x00000000000000000000AA",
}
SECRET_FILES = {
    "database_url": "postgresql://tradecore:pw@postgres:5432/tradecore\n",
    "jwt_secret": secrets.token_urlsafe(48) + "\n",
    "encryption_key": secrets.token_urlsafe(32) + "\n",
    "turnstile_secret": "0x4AAAAAAA-site-secret\n",
    "smtp_url": "smtp://alerts:pw@smtp.example.com:587?starttls=1\n",
    "postgres_password": "pw\n",
}
_PLACEHOLDER = re.compile(r"\$\{(?P<name>[A-Z_][A-Z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose's ``${NAME}``, ``${NAME:-default}`` and ``${NAME:?error}`` with ``env``."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        if env.get(name):
            return env[name]
        if op in (":-", "-"):
            return str(arg)
        raise AssertionError(f"compose would stop: {name} is unset ({arg})")

    return _PLACEHOLDER.sub(one, value)


def tradecore_services() -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in compose()["services"].items()
        if str(service.get("image", "")).startswith("tradecore:")
    }


def check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    assert CHECK_JSONSCHEMA is not None, "check-jsonschema is missing: install the test extra"
    return subprocess.run(
        [CHECK_JSONSCHEMA, "--no-cache", "--schemafile", str(SCHEMA), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --- the schema -------------------------------------------------------------------------------


def test_compose_file_matches_the_compose_specification() -> None:
    result = check_jsonschema(COMPOSE)

    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("breakage", "needle"),
    [
        (lambda text: text.replace("    restart: unless-stopped", "    restart: 7", 1), "restart"),
        (lambda text: text.replace("\nservices:\n", "\nservice:\n", 1), "service"),
        (
            lambda text: text.replace("condition: service_healthy", "condition: healthy", 1),
            "healthy",
        ),
    ],
    ids=["restart-not-a-string", "misspelt-services", "unknown-condition"],
)
def test_a_broken_compose_file_is_refused(breakage: Any, needle: str, tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    text = COMPOSE.read_text()
    broken.write_text(breakage(text))
    assert broken.read_text() != text

    result = check_jsonschema(broken)

    assert result.returncode != 0
    assert needle in result.stdout


# --- in step with the fault harness ------------------------------------------------------------


def harness_commands() -> dict[str, set[str]]:
    """The tradecore subcommands the fault tests run (list literals starting with one), each
    with the options they pass it."""
    found: dict[str, set[str]] = {}
    for source in (FAULTS / "harness.py", FAULTS / "conftest.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if not isinstance(node, ast.List) or not node.elts:
                continue
            first = node.elts[0]
            if isinstance(first, ast.Constant) and first.value in main.commands:
                options = found.setdefault(first.value, set())
                options.update(
                    e.value
                    for e in node.elts[1:]
                    if isinstance(e, ast.Constant) and str(e.value).startswith("--")
                )
    return found


def harness_environment() -> set[str]:
    """The variables every fault-test process gets: the keywords of conftest's
    ``base_environment(...)`` call and the keys ``secrets_environment()`` gives."""
    from faults.harness import secrets_environment

    names = set(secrets_environment())
    for node in ast.walk(ast.parse((FAULTS / "conftest.py").read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "base_environment"
        ):
            names.update(k.arg for k in node.keywords if k.arg is not None)
    return names


def test_compose_runs_the_subcommands_the_fault_tests_run() -> None:
    """Admin commands are one-offs (``docker compose run --rm api-1 admin ...``)."""
    harness = harness_commands()
    ran = {service["command"][0] for service in tradecore_services().values()}

    assert harness.keys() - {"admin"} == {"serve", "worker", "migrate"}
    assert ran == harness.keys() - {"admin"}


def test_each_command_is_one_the_command_line_accepts_with_the_harness_options() -> None:
    harness = harness_commands()
    for name, service in tradecore_services().items():
        subcommand, *args = service["command"]
        command = main.commands[subcommand]
        try:
            command.make_context(subcommand, list(args))
        except click.UsageError as e:
            raise AssertionError(f"{name}: tradecore {' '.join(service['command'])}: {e}") from e
        options = {a for a in args if a.startswith("--")}
        assert options == harness[subcommand], name


def test_every_tradecore_service_gets_the_variables_the_harness_gives() -> None:
    required = harness_environment()
    assert {"DATABASE_URL", "REDIS_URL", "JWT_SECRET", "ENCRYPTION_KEY"} <= required

    for name, service in tradecore_services().items():
        given = {key.removesuffix("_FILE") for key in service["environment"]}
        assert required <= given, f"{name} lacks {sorted(required - given)}"


def test_variables_are_known_and_secrets_come_from_docker_secrets() -> None:
    top_level = set(compose()["secrets"])
    for name, service in tradecore_services().items():
        mounted = set(service.get("secrets", []))
        for key, value in service["environment"].items():
            if key.endswith("_FILE"):
                variable = key.removesuffix("_FILE")
                assert variable in SECRET_NAMES, f"{name}: {key} is no secret's file"
                secret = value.removeprefix("/run/secrets/")
                assert value == f"/run/secrets/{secret}", f"{name}: {key}={value}"
                assert secret in mounted and secret in top_level, f"{name}: {secret}"
            else:
                assert key in KNOWN_NAMES, f"{name}: {key} is not a tradecore variable"
                assert key not in SECRET_NAMES - {"REDIS_URL"}, f"{name}: {key} in the clear"


def test_the_settings_accept_what_each_service_would_read(tmp_path: Path) -> None:
    """The environment a container would see (placeholders filled, secret files written)
    is a valid production configuration."""
    for secret, content in SECRET_FILES.items():
        (tmp_path / secret).write_text(content)
    for name, service in tradecore_services().items():
        env = {
            key: interpolate(str(value), OPERATOR).replace("/run/secrets", str(tmp_path))
            for key, value in service["environment"].items()
        }

        settings = Settings.from_env(env)

        assert settings.production, name
        assert settings.runtime == "redis", name
        assert settings.jwt_secret == SECRET_FILES["jwt_secret"].rstrip("\n"), name


def test_compose_without_the_operators_variables_stops_with_their_names() -> None:
    environment = tradecore_services()["migrate"]["environment"]
    text = "\n".join(str(value) for value in environment.values())

    with pytest.raises(AssertionError, match="PUBLIC_BASE_URL is unset"):
        interpolate(text, {})


def test_migrations_run_once_before_every_long_running_process() -> None:
    services = tradecore_services()
    assert services["migrate"]["restart"] == "no"
    for name, service in services.items():
        if name == "migrate":
            continue
        conditions = {dep: spec["condition"] for dep, spec in service["depends_on"].items()}
        assert conditions == {
            "migrate": "service_completed_successfully",
            "postgres": "service_healthy",
            "redis": "service_healthy",
        }, name
        assert service["restart"] == "unless-stopped", name
        assert "healthcheck" in service, name


def test_stores_persist_and_report_health() -> None:
    services = compose()["services"]
    redis_command = services["redis"]["command"]

    assert redis_command[redis_command.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in services["postgres"]["volumes"])
    assert {"postgres", "redis"} <= set(services) and all(
        "healthcheck" in services[s] for s in ("postgres", "redis")
    )


def test_two_api_processes_and_two_worker_hosts() -> None:
    services = tradecore_services()
    apis = sorted(n for n, s in services.items() if s["command"][0] == "serve")
    workers = [s for s in services.values() if s["command"][0] == "worker"]

    assert apis == ["api-1", "api-2"]
    assert sum(s.get("deploy", {}).get("replicas", 1) for s in workers) == 2


def test_the_edge_proxies_to_exactly_the_api_services() -> None:
    services = tradecore_services()
    served = {
        f"{name}:{service['command'][service['command'].index('--port') + 1]}"
        for name, service in services.items()
        if service["command"][0] == "serve"
    }
    upstreams = set(re.findall(r"^\s*server\s+(\S+?)(?:\s|;)", UPSTREAM.read_text(), re.M))

    assert upstreams == served
    mounts = compose()["services"]["edge"]["volumes"]
    assert f"./{UPSTREAM.relative_to(ROOT)}:/etc/tradecore-edge/upstream.conf:ro" in mounts


def test_the_api_health_check_asks_the_port_it_serves() -> None:
    for name, service in tradecore_services().items():
        if service["command"][0] != "serve":
            continue
        port = service["command"][service["command"].index("--port") + 1]
        check = " ".join(service["healthcheck"]["test"])
        assert f"http://127.0.0.1:{port}/health/ready" in check, name


def test_the_worker_health_check_asks_its_metrics_port() -> None:
    """A worker host answers /health/ready on METRICS_PORT (docs/metrics.md)."""
    for name, service in tradecore_services().items():
        if service["command"][0] != "worker":
            continue
        port = service["environment"]["METRICS_PORT"]
        check = " ".join(service["healthcheck"]["test"])
        assert service["environment"]["METRICS_HOST"] == "0.0.0.0", name
        assert f"http://127.0.0.1:{port}/health/ready" in check, name


def test_the_compose_upstream_replaces_the_edges_own_block() -> None:
    """The mounted file defines the upstream the edge proxies to, under the same name as the
    file it replaces, and the edge image installs its configuration where it is mounted."""
    edge = ROOT / "deploy" / "edge"
    block = re.compile(r"^\s*upstream\s+(\S+)\s*\{", re.M)
    replaced = set(block.findall((edge / "upstream.conf").read_text()))
    proxied = set(
        re.findall(r"proxy_pass\s+https?://([^/;\s]+)", (edge / "proxy.conf").read_text())
    )
    copied = re.search(r"^COPY .*\s(\S+)/?\s*$", (edge / "Dockerfile").read_text(), re.M)

    assert set(block.findall(UPSTREAM.read_text())) == replaced == proxied
    assert copied is not None
    assert copied[1].rstrip("/") == "/etc/tradecore-edge"
