"""The ``tradecore`` script without the server extra: one line naming what is missing and how
to install it, exit status 2, no traceback. And ``tradecore[testing]`` (Hypothesis and the
core, nothing else) is enough for ``tradecore.testing``."""

from __future__ import annotations

import importlib.metadata
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tradecore.testing
from tradecore_entrypoints.launcher import (
    INSTALL_HINT,
    SERVER_MODULES,
    missing_extra_message,
    missing_modules,
)

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL_AT_RUN_TIME = {"uvloop", "tzdata"}
"""Server-extra distributions the command line runs without (the event loop falls back to
asyncio's; tzdata only backs zoneinfo where the system has no time zone database)."""


def server_distributions() -> set[str]:
    names = set()
    for requirement in importlib.metadata.requires("tradecore") or []:
        if re.search(r"""extra\s*==\s*["']server["']""", requirement):
            name = re.match(r"[A-Za-z0-9._-]+", requirement)
            assert name is not None
            names.add(re.sub(r"[-_.]+", "-", name[0]).lower())
    return names


def test_the_launcher_checks_the_modules_of_every_server_distribution() -> None:
    provides: dict[str, set[str]] = {}
    for module, distributions in importlib.metadata.packages_distributions().items():
        for distribution in distributions:
            key = re.sub(r"[-_.]+", "-", distribution).lower()
            provides.setdefault(key, set()).add(module)
    required = server_distributions() - OPTIONAL_AT_RUN_TIME

    uncovered = {d for d in required if not provides.get(d, set()) & set(SERVER_MODULES)}
    foreign = {m for m in SERVER_MODULES if not any(m in provides.get(d, ()) for d in required)}
    assert uncovered == set()
    assert foreign == set()


def test_missing_modules_are_named_in_the_order_checked() -> None:
    present = {"aiohttp", "redis"}

    missing = missing_modules(("aiohttp", "click", "redis", "jwt"), lambda m: m in present or None)

    assert missing == ["click", "jwt"]
    assert missing_extra_message(missing) == (
        "tradecore: the server extra is not installed (missing: click, jwt); "
        f"install it with {INSTALL_HINT}"
    )


def run_launcher_without(modules: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """The launcher in a new interpreter where ``modules`` cannot be imported."""
    script = (
        "import sys\n"
        f"for name in {modules!r}:\n"
        "    sys.modules[name] = None  # import fails, find_spec answers None\n"
        f"sys.argv = ['tradecore', *{list(args)!r}]\n"
        "from tradecore_entrypoints.launcher import main\n"
        "main()\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )


def test_without_the_server_extra_the_script_says_so_in_one_line() -> None:
    result = run_launcher_without(["aiohttp", "click"], "--version")

    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        "tradecore: the server extra is not installed (missing: aiohttp, click); "
        "install it with pip install 'tradecore[server]'\n"
    )


def test_a_missing_module_found_only_on_import_is_one_line_too() -> None:
    """A dependency of a dependency (not in the checked list) missing: still no traceback."""
    result = run_launcher_without(["multidict"], "--version")

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("tradecore: the server extra is not installed (missing: ")


def test_with_the_server_extra_the_script_runs_the_command_line() -> None:
    result = run_launcher_without([], "--version")

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"tradecore, version {importlib.metadata.version('tradecore')}\n"


def helper_modules() -> list[str]:
    return sorted(
        f"tradecore.testing.{info.name}"
        for info in pkgutil.iter_modules(tradecore.testing.__path__)
    )


@pytest.fixture(scope="module")
def testing_only_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with ``tradecore[testing]`` alone, installed by this
    environment's pip (from its index or cache, the way `make` installs)."""
    venv = tmp_path_factory.mktemp("testing-only") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--constraint",
            str(ROOT / "constraints.txt"),
            f"{ROOT}[testing]",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    return venv


def test_testing_extra_alone_imports_every_test_helper(testing_only_venv: Path) -> None:
    imports = "; ".join(f"import {module}" for module in helper_modules())
    listed = subprocess.run(
        [str(testing_only_venv / "bin" / "python"), "-c", imports],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert helper_modules(), "tradecore.testing has no modules"
    assert listed.returncode == 0, listed.stderr


def test_testing_extra_alone_installs_no_server_package(testing_only_venv: Path) -> None:
    site = next((testing_only_venv / "lib").glob("python3*/site-packages"))
    installed = {
        re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        for dist in importlib.metadata.distributions(path=[str(site)])
    }

    assert installed & server_distributions() == set()
    assert {"tradecore", "hypothesis", "attrs", "cattrs"} <= installed


def test_the_script_without_the_server_extra_in_a_real_install(testing_only_venv: Path) -> None:
    result = subprocess.run(
        [str(testing_only_venv / "bin" / "tradecore"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("tradecore: the server extra is not installed (missing: ")
    assert result.stderr.rstrip().endswith(INSTALL_HINT)


def test_each_package_is_marked_typed() -> None:
    """PEP 561: type checkers of projects that build on tradecore read its annotations."""
    packages = ["tradecore", "tradecore_adapters", "tradecore_entrypoints"]

    assert [p for p in packages if not (ROOT / "src" / p / "py.typed").is_file()] == []
