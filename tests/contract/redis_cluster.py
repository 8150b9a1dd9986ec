"""A private three-master Redis Cluster on loopback, started from Debian's ``redis-server``.

``ThreeMasterCluster.start`` runs three ``redis-server --cluster-enabled yes`` processes (no
persistence) on free loopback ports in a work directory, joins them with
``redis-cli --cluster create ... --cluster-replicas 0`` and returns once every node reports
``cluster_state:ok``; ``stop`` ends them. The methods block (async code calls them through
``asyncio.to_thread``). ``Unavailable`` says that redis-server or redis-cli is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis

NODES = 3
START_TIMEOUT_S = 20.0
POLL_S = 0.05
BUS_OFFSET = 10_000
"""A node's cluster bus listens on its port plus this."""


class Unavailable(Exception):
    """A program the cluster needs is not installed."""


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """``count`` free loopback ports whose bus ports (port + 10000) are free as well."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port + BUS_OFFSET < 65536 and port not in ports and _port_free(port + BUS_OFFSET):
            ports.append(port)
    return ports


class ThreeMasterCluster:
    """Three masters, no replicas (see the module docstring)."""

    def __init__(self, workdir: Path) -> None:
        server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if server is None or cli is None:
            raise Unavailable("redis-server and redis-cli are not both installed")
        self.server, self.cli = server, cli
        self.workdir = workdir
        self.ports: list[int] = []
        self._processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """The cluster URL naming every node (``redis+cluster://h:p,h:p,h:p``)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def client(self, port: int) -> redis.Redis:
        """A short-lived synchronous client of one node (close it)."""
        return redis.Redis(
            host="127.0.0.1",
            port=port,
            socket_timeout=2.0,
            socket_connect_timeout=2.0,
            decode_responses=True,
        )

    def start(self) -> None:
        """Start the nodes, join them and return once the cluster is ``ok``."""
        self.ports = _free_ports(NODES)
        for port in self.ports:
            home = self.workdir / str(port)
            home.mkdir(parents=True, exist_ok=True)
            with (home / "redis.log").open("ab") as log:
                self._processes.append(
                    subprocess.Popen(
                        [
                            self.server,
                            "--port",
                            str(port),
                            "--bind",
                            "127.0.0.1",
                            "--cluster-enabled",
                            "yes",
                            "--cluster-config-file",
                            str(home / "nodes.conf"),
                            "--cluster-node-timeout",
                            "2000",
                            "--save",
                            "",
                            "--appendonly",
                            "no",
                            "--dir",
                            str(home),
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                    )
                )
        for port in self.ports:
            self._until(lambda port=port: self._answers(port), f"node {port} answers")
        subprocess.run(
            [
                self.cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in self.ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=START_TIMEOUT_S,
            check=True,
        )
        for port in self.ports:
            self._until(lambda port=port: self._ok(port), f"node {port} reports cluster_state:ok")

    @staticmethod
    def _options(port: int, home: Path) -> list[str]:
        """A cluster node on ``port`` without persistence, its files in ``home``."""
        options = {
            "port": str(port),
            "bind": "127.0.0.1",
            "cluster-enabled": "yes",
            "cluster-config-file": str(home / "nodes.conf"),
            "cluster-node-timeout": "2000",
            "save": "",
            "appendonly": "no",
            "dir": str(home),
        }
        return [part for name, value in options.items() for part in (f"--{name}", value)]

    def flushall(self) -> None:
        """FLUSHALL on every master."""
        for port in self.ports:
            client = self.client(port)
            try:
                client.flushall()
            finally:
                client.close()

    def stop(self) -> None:
        """End every node (SIGTERM, then SIGKILL after 5 s)."""
        processes, self._processes = self._processes, []
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)

    def logs(self) -> str:
        return "\n".join(
            f"--- node {p}\n" + (self.workdir / str(p) / "redis.log").read_text()[-2000:]
            for p in self.ports
            if (self.workdir / str(p) / "redis.log").exists()
        )

    def _answers(self, port: int) -> bool:
        client = self.client(port)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def _ok(self, port: int) -> bool:
        client = self.client(port)
        try:
            return client.cluster("info").get("cluster_state") == "ok"  # type: ignore[no-any-return]
        except redis.RedisError:
            return False
        finally:
            client.close()

    def _until(self, condition: object, what: str) -> None:
        assert callable(condition)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not condition():
            if any(p.poll() is not None for p in self._processes) or time.monotonic() > deadline:
                raise AssertionError(f"Redis Cluster: never happened: {what}\n{self.logs()}")
            time.sleep(POLL_S)


@contextlib.contextmanager
def cluster_for_tests(workdir: Path) -> Iterator[ThreeMasterCluster]:
    """A started cluster in ``workdir`` for a test fixture, stopped at exit. Without
    ``redis-server``/``redis-cli`` the test is skipped, or fails under ``CI=true``."""
    import pytest  # here, not above: the benchmark imports this module without pytest

    try:
        cluster = ThreeMasterCluster(workdir)
    except Unavailable as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{e} (CI=true requires the Redis Cluster tests to run)")
        pytest.skip(str(e))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
