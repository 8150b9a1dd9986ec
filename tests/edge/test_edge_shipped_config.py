"""The configuration as shipped in deploy/edge (its own IP sets, limits, upstream and listen
addresses) passes ``nginx -t``; only the absolute paths of modsecurity-rules.conf point into
the copy, as they would point into /etc/tradecore-edge. The image runs nginx on the allocator
the tests run it on."""

from __future__ import annotations

import ctypes.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from edge_harness import ALLOCATOR_PRELOAD, EDGE_DIR, NGINX, EdgeStack


def test_the_shipped_configuration_passes_nginx_t(tmp_path: Path, edge_packages: None) -> None:
    conf = tmp_path / "tradecore-edge"
    shutil.copytree(EDGE_DIR, conf)
    for sub in ("logs", "temp"):
        (tmp_path / sub).mkdir()
    rules = conf / "modsecurity-rules.conf"
    shipped = rules.read_text()
    assert "/etc/tradecore-edge/modsecurity/main.conf" in shipped
    rules.write_text(
        shipped.replace("/etc/tradecore-edge", str(conf)).replace(
            "/var/log/tradecore-edge", str(tmp_path / "logs")
        )
    )
    error_log = tmp_path / "logs" / "error.log"
    result = subprocess.run(
        [NGINX, "-t", "-p", str(tmp_path), "-e", str(error_log), "-c", str(conf / "nginx.conf")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr


def test_the_image_preloads_the_allocator_the_harness_preloads() -> None:
    dockerfile = (EDGE_DIR / "Dockerfile").read_text()
    assert re.search(rf"^ENV LD_PRELOAD={re.escape(ALLOCATOR_PRELOAD)}$", dockerfile, re.M)
    install = re.search(r"apt-get install[^\n]*\n\s*(.*?)\\", dockerfile)
    assert install is not None
    assert "libjemalloc2" in install.group(1).split()


def test_the_edge_worker_runs_on_jemalloc(edge: EdgeStack) -> None:
    if not ctypes.util.find_library("jemalloc"):
        pytest.skip("libjemalloc2 is not installed: the harness runs nginx on glibc's malloc")
    (worker,) = edge._worker_pids()
    maps = (Path("/proc") / str(worker) / "maps").read_text()
    assert "libjemalloc.so" in maps
