"""The configuration as shipped in deploy/edge (its own IP sets, limits, upstream and listen
addresses) passes ``nginx -t``; only the absolute paths of modsecurity-rules.conf point into
the copy, as they would point into /etc/tradecore-edge."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from edge_harness import EDGE_DIR, NGINX


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
