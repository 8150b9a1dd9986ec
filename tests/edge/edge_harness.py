"""The edge under test: deploy/edge rendered into a temporary directory, real nginx with
ModSecurity and the OWASP CRS in front of a real ``tradecore serve --demo`` process.

* ``render_edge`` copies deploy/edge and replaces only what a deployment replaces: the
  upstream, the listen address, the absolute paths of the ModSecurity rules and audit log, the
  IP sets, and the limits (the repository's limits.conf with smaller numbers, so the rate
  tests are quick).
* ``EdgeStack`` runs both processes (nginx as this user, with its pid, logs and temp files in
  the temporary directory, and jemalloc preloaded as the image does, when it is installed)
  and sends requests from chosen loopback addresses (Linux routes all of 127.0.0.0/8 to lo,
  so 127.0.0.2, 127.0.0.3, ... act as different clients).

Every wait is bounded and names what it waited for.
"""

from __future__ import annotations

import ctypes.util
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
EDGE_DIR = REPO / "deploy" / "edge"
MANIFEST = EDGE_DIR / "rules.json"
AWS_TEMPLATE = REPO / "deploy" / "aws" / "waf-web-acl.json"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
MODSECURITY_MODULE = Path("/usr/lib/nginx/modules/ngx_http_modsecurity_module.so")
CRS_RULES = Path("/usr/share/modsecurity-crs/rules")
TRADECORE = Path(sys.executable).with_name("tradecore")

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
HTTP_TIMEOUT_S = 20.0
POLL_S = 0.05

# The test edge's address sets, and its limits where the shipped ones would be slow to reach.
ADMIN_IP = "127.0.0.3"
ALERT_SOURCE_IP = "127.0.0.9"
DENIED_IP = "127.0.0.66"
LOGIN_LIMIT = 100  # the shipped limit: the 101st login in the window is refused
BLANKET_LIMIT = 400  # waf_rate_limit is configurable; a small one keeps rule 4 quick
HOST = "edge.tradecore.test"
# The allocator the image preloads into nginx (deploy/edge/Dockerfile's LD_PRELOAD):
# libmodsecurity allocates and frees thousands of small strings per request, which jemalloc
# does in about a fifth fewer instructions than glibc's malloc (docs/performance.md).
ALLOCATOR_PRELOAD = "libjemalloc.so.2"


def allocator_env(allocator: str = "jemalloc") -> dict[str, str]:
    """The environment that gives nginx ``allocator`` ("jemalloc" or "glibc"): jemalloc
    preloaded as the image does, or nothing when it is not installed (the rules behave the
    same with either allocator; only their cost differs)."""
    if allocator == "glibc":
        return {}
    if allocator != "jemalloc":
        raise ValueError(f"unknown allocator {allocator!r}")
    return {"LD_PRELOAD": ALLOCATOR_PRELOAD} if ctypes.util.find_library("jemalloc") else {}


def manifest_rules() -> list[dict[str, Any]]:
    """The rules of deploy/edge/rules.json, in priority order."""
    rules: list[dict[str, Any]] = json.loads(MANIFEST.read_text())["rules"]
    return rules


def manifest_rule(name: str) -> dict[str, Any]:
    """One rule of the manifest by its ``name``; KeyError when there is none."""
    for rule in manifest_rules():
        if rule["name"] == name:
            return rule
    raise KeyError(name)


def missing_prerequisites() -> list[str]:
    """What this machine lacks to run the edge (empty when nothing)."""
    missing = []
    if not Path(NGINX).exists():
        missing.append("nginx")
    if not MODSECURITY_MODULE.exists():
        missing.append("libnginx-mod-http-modsecurity")
    if not CRS_RULES.is_dir():
        missing.append("modsecurity-crs")
    if not TRADECORE.exists():
        missing.append("the tradecore script in the virtualenv")
    return missing


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _replace(text: str, pattern: str, replacement: str) -> str:
    """``text`` with the one match of ``pattern`` replaced; AssertionError when it does not
    match exactly once (the rendered file would silently keep the repository's value)."""
    new, count = re.subn(pattern, replacement, text)
    assert count == 1, f"expected one match of {pattern!r}, found {count}"
    return new


def render_edge(
    root: Path,
    *,
    listen_port: int,
    upstream_port: int,
    login_window_s: int = 300,
    edge_dir: Path = EDGE_DIR,
) -> Path:
    """``edge_dir`` (deploy/edge, or a copy of it from another commit, for a comparison) as a
    test deployment under ``root``; answers nginx.conf's path."""
    conf = root / "conf"
    shutil.copytree(edge_dir, conf)
    for sub in ("logs", "temp"):
        (root / sub).mkdir()
    (conf / "upstream.conf").write_text(
        f"upstream tradecore_api {{\n    server 127.0.0.1:{upstream_port};\n    keepalive 8;\n}}\n"
    )
    (conf / "listen.conf").write_text(f"listen 127.0.0.1:{listen_port};\n")
    (conf / "modsecurity-rules.conf").write_text(
        f"modsecurity_rules_file {conf / 'modsecurity' / 'main.conf'};\n"
        f"modsecurity_rules 'SecAuditLog {root / 'logs' / 'modsec_audit.json'}';\n"
    )
    (conf / "ip-sets" / "admin.conf").write_text(f"{ADMIN_IP} 1;\n")
    alert = conf / "ip-sets" / "alert-source.conf"
    alert.write_text(alert.read_text() + f"{ALERT_SOURCE_IP} 1;\n")
    (conf / "ip-sets" / "reputation-deny.txt").write_text(f"# test list\n{DENIED_IP}\n")
    limits = conf / "modsecurity" / "limits.conf"
    text = limits.read_text()
    text = _replace(text, r"tx\.edge_login_limit=100\b", f"tx.edge_login_limit={LOGIN_LIMIT}")
    text = _replace(text, r"tx\.waf_rate_limit=2000\b", f"tx.waf_rate_limit={BLANKET_LIMIT}")
    text = _replace(
        text, r"tx\.edge_login_window_s=300\b", f"tx.edge_login_window_s={login_window_s}"
    )
    limits.write_text(text)
    return conf / "nginx.conf"


@dataclass(frozen=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes
    cookies: Mapping[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


class Process:
    """A child process with its output in a file; ``stop`` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, args: Sequence[str], log: Path, env: Mapping[str, str]) -> None:
        self.log = log
        self._out = log.open("wb")
        self.popen = subprocess.Popen(
            list(args), stdout=self._out, stderr=subprocess.STDOUT, env=dict(env)
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(STOP_TIMEOUT_S)
        self._out.close()


def _wait_for(check: Any, what: str, diagnose: Any, timeout_s: float = START_TIMEOUT_S) -> Any:
    """Poll ``check`` until it answers a true value, which is returned; AssertionError naming
    ``what`` (and ``diagnose()``) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{diagnose()}")
        time.sleep(POLL_S)


class EdgeStack:
    """``tradecore serve --demo`` behind nginx; both stopped by ``close``. ``edge_dir`` and
    ``allocator`` (see ``allocator_env``) are for the benchmark's comparisons."""

    def __init__(
        self,
        root: Path,
        *,
        login_window_s: int = 300,
        edge_dir: Path = EDGE_DIR,
        allocator: str = "jemalloc",
    ) -> None:
        self.root = root
        self.app_port = free_port()
        self.edge_port = free_port()
        self.nginx_conf = render_edge(
            root,
            listen_port=self.edge_port,
            upstream_port=self.app_port,
            login_window_s=login_window_s,
            edge_dir=edge_dir,
        )
        self.nginx_env = allocator_env(allocator)
        self.logs = root / "logs"
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(root),
            "LANG": "C.UTF-8",
            # The edge connects from 127.0.0.1; only its X-Forwarded-For is believed.
            "TRUSTED_PROXIES": "127.0.0.1",
            "CAPTCHA_ENABLED": "false",
        }
        self.app = Process(
            [
                str(TRADECORE),
                "--log-level",
                "INFO",
                "serve",
                "--demo",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.app_port),
            ],
            root / "app.log",
            env,
        )
        self.nginx: Process | None = None
        self._sent: Counter[str] = Counter()
        try:
            self.demo: dict[str, str] = _wait_for(
                self._demo_line, "the demo line of tradecore serve", self.diagnose
            )
            self.nginx = Process(
                self._nginx_args("-g", "daemon off;"), root / "nginx.out", {**env, **self.nginx_env}
            )
            _wait_for(self._edge_ready, "nginx to answer", self.diagnose)
        except BaseException:
            self.close()
            raise

    def _nginx_args(self, *extra: str) -> list[str]:
        # -e: the error log before the configuration is read (the compiled-in default,
        # /var/log/nginx, is not writable for a non-root user).
        error_log = str(self.logs / "error.log")
        return [NGINX, "-p", str(self.root), "-e", error_log, "-c", str(self.nginx_conf), *extra]

    def _demo_line(self) -> dict[str, str] | None:
        for line in self.app.output().splitlines():
            if line.startswith("{") and '"webhook_url"' in line:
                demo: dict[str, str] = json.loads(line)
                return demo
        return None

    def _edge_ready(self) -> bool:
        try:
            return self.request("127.0.0.1", "GET", "/health").status == 200
        except OSError:
            return False

    @property
    def webhook_path(self) -> str:
        """The demo account's webhook path (``/webhook/{token}/order``)."""
        return "/webhook/" + self.demo["webhook_url"].split("/webhook/", 1)[1]

    def order_body(self) -> dict[str, Any]:
        """A valid webhook order of the demo account, new each call (its timestamp)."""
        return {
            "action": "buy",
            "symbol": "BTCUSDT",
            "quantity": 0.01,
            "timestamp": datetime.now(UTC).isoformat(),
            "secret": self.demo["webhook_secret"],
        }

    def request(
        self,
        client_ip: str,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """One request to the edge from ``client_ip`` (a loopback address)."""
        self._sent[client_ip] += 1
        connection = http.client.HTTPConnection(
            "127.0.0.1", self.edge_port, timeout=HTTP_TIMEOUT_S, source_address=(client_ip, 0)
        )
        try:
            sent = {"Host": HOST, "User-Agent": "tradecore-edge-tests", **(headers or {})}
            connection.request(method, path, body=body, headers=sent)
            response = connection.getresponse()
            cookies = {}
            for name, value in response.getheaders():
                if name.lower() == "set-cookie":
                    cookie_name, _, rest = value.partition("=")
                    cookies[cookie_name] = rest.split(";", 1)[0]
            return Reply(response.status, dict(response.getheaders()), response.read(), cookies)
        finally:
            connection.close()

    def post_json(
        self,
        client_ip: str,
        path: str,
        document: Any,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        return self.request(
            client_ip,
            "POST",
            path,
            body=json.dumps(document).encode(),
            headers={"Content-Type": "application/json", **(headers or {})},
        )

    def _logged(self, client_ip: str) -> list[dict[str, Any]]:
        path = self.logs / "access.log"
        lines = path.read_text().splitlines() if path.exists() else []
        entries = (json.loads(line) for line in lines if line.endswith("}"))
        return [e for e in entries if e["client"] == client_ip]

    def decisions(self, client_ip: str) -> list[dict[str, Any]]:
        """``client_ip``'s lines of the edge's decision log (access log), oldest first, once
        every request sent from it is logged (nginx logs after it answers)."""
        sent = self._sent[client_ip]
        found: tuple[list[dict[str, Any]]] = _wait_for(
            lambda: (logged := self._logged(client_ip), len(logged) >= sent)[1] and (logged,),
            f"{sent} access log lines of {client_ip}",
            self.diagnose,
            timeout_s=HTTP_TIMEOUT_S,
        )
        return found[0]

    def wait_until(self, check: Any, what: str) -> Any:
        """Poll ``check`` (bounded) until true, for what is logged after the answer."""
        return _wait_for(check, what, self.diagnose, timeout_s=HTTP_TIMEOUT_S)

    def audit_messages(self) -> list[str]:
        """The messages of ModSecurity's audit log (matches that did not refuse)."""
        path = self.logs / "modsec_audit.json"
        if not path.exists():
            return []
        messages = []
        for line in path.read_text().splitlines():
            if line.strip():
                for message in json.loads(line)["transaction"].get("messages", []):
                    messages.append(message["message"])
        return messages

    def app_requests(self) -> list[dict[str, Any]]:
        """The API's access log: one dict per request with the ``client_ip`` it saw, the
        ``method``, the (redacted) ``path`` and the ``status``."""
        requests = []
        for line in self.app.output().splitlines():
            if line.startswith("{") and '"logger": "aiohttp.access"' in line:
                requests.append(json.loads(line))
        return requests

    def app_saw(
        self, client_ip: str, method: str, path_prefix: str, status: int | None = None
    ) -> None:
        """Wait (bounded) until the API's access log has such a request (with ``status``
        when given)."""
        self.wait_until(
            lambda: any(
                r["client_ip"] == client_ip
                and r["method"] == method
                and r["path"].startswith(path_prefix)
                and status in (None, r["status"])
                for r in self.app_requests()
            ),
            f"the API's log of {method} {path_prefix} from {client_ip} (status {status})",
        )

    def reload(self, command: Sequence[str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``command`` (``nginx -s reload`` by default), which must reload the edge;
        returns its result once only workers of the new configuration run."""
        assert self.nginx is not None
        before = self._worker_pids()
        result = subprocess.run(
            list(command or self._nginx_args("-s", "reload")),
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
            env={
                **os.environ,
                **self.nginx_env,
                "EDGE_CONF_DIR": str(self.nginx_conf.parent),
                "EDGE_PREFIX": str(self.root),
                "NGINX": NGINX,
            },
        )
        assert result.returncode == 0, result
        _wait_for(
            lambda: (now := self._worker_pids()) and not now & before,
            "the old nginx workers to give way to new ones after reload",
            self.diagnose,
        )
        return result

    def worker_cpu_ns(self) -> int:
        """The CPU time nginx's worker has used so far, in ns (/proc/PID/schedstat)."""
        (worker,) = self._worker_pids()
        return int((Path("/proc") / str(worker) / "schedstat").read_text().split()[0])

    def _worker_pids(self) -> set[int]:
        """The processes whose parent is nginx's master (its workers), read from /proc."""
        assert self.nginx is not None
        master = self.nginx.popen.pid
        workers = set()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # the process ended while we looked
                continue
            if int(fields[1]) == master:
                workers.add(int(stat.parent.name))
        return workers

    def diagnose(self) -> str:
        parts = [f"--- app ---\n{self.app.output()[-3000:]}"]
        if self.nginx is not None:
            parts.append(f"--- nginx ---\n{self.nginx.output()[-2000:]}")
        error_log = self.logs / "error.log"
        if error_log.exists():
            parts.append(f"--- error.log ---\n{error_log.read_text()[-3000:]}")
        return "\n".join(parts)

    def close(self) -> None:
        if self.nginx is not None:
            self.nginx.stop()
        self.app.stop()
