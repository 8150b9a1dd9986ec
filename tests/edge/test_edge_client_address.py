"""The client's address survives the edge: the API trusts X-Forwarded-For only from the edge
(TRUSTED_PROXIES=127.0.0.1, the address nginx connects from), so its access log, its
allowed-IP check, its per-address throttles and its audit see the client, and an
X-Forwarded-For the client forged is not believed."""

from __future__ import annotations

from edge_harness import EdgeStack

FORGED = "203.0.113.50"


def test_the_api_sees_the_client_and_not_a_forged_forwarded_for(edge: EdgeStack) -> None:
    client = "127.0.0.30"
    for request_id, forwarded in (("plain-1", None), ("forged-1", FORGED)):
        headers = {"X-Request-ID": request_id}
        if forwarded is not None:
            headers["X-Forwarded-For"] = forwarded
        assert edge.request(client, "GET", "/health", headers=headers).status == 200
        logged = edge.wait_until(
            lambda rid=request_id: [r for r in edge.app_requests() if r["request_id"] == rid],
            f"the API's log line of request {request_id}",
        )
        assert [r["client_ip"] for r in logged] == [client]


def test_allowed_ip_check_and_audit_see_the_client(edge: EdgeStack) -> None:
    owner, stranger = "127.0.0.31", "127.0.0.32"
    credentials = {"email": edge.demo["email"], "password": edge.demo["password"]}
    login = edge.post_json(owner, "/auth/login", {**credentials, "turnstile_token": ""})
    assert login.status == 200, login
    session = {
        "Cookie": "; ".join(f"{k}={v}" for k, v in login.cookies.items()),
        "X-CSRF-Token": login.json()["csrf_token"],
    }
    added = edge.post_json(owner, "/settings/allowed-ips", {"ip_address": owner}, session)
    assert added.status == 201, added
    try:
        # The stranger claims to be the owner: the API believes the edge, not the header.
        refused = edge.post_json(
            stranger, edge.webhook_path, edge.order_body(), {"X-Forwarded-For": owner}
        )
        assert refused.status == 403, refused
        accepted = edge.post_json(owner, edge.webhook_path, edge.order_body())
        assert accepted.status == 200, accepted

        report = edge.request(owner, "GET", "/settings/security-attacks", headers=session)
        assert report.status == 200, report
        blocked = [i for i in report.json()["items"] if i["action"] == "webhook_ip_blocked"]
        assert [item["ip_address"] for item in blocked] == [stranger]
    finally:  # the other tests' orders come from other addresses
        entry = added.json()["id"]
        removed = edge.request(owner, "DELETE", f"/settings/allowed-ips/{entry}", headers=session)
        assert removed.status == 204, removed


def test_the_api_throttles_the_client_address_not_the_edge(edge: EdgeStack) -> None:
    """The API's forgotten-password throttle (10 per address) counts the clients apart."""
    client, other = "127.0.0.33", "127.0.0.34"
    body = {"email": "nobody@example.com"}
    statuses = [edge.post_json(client, "/auth/forgot-password", body).status for _ in range(11)]
    assert statuses[-1] == 429
    assert 429 not in statuses[:10]
    # The 429 is the API's (the edge passed every one), and another address is not affected.
    assert {e["edge_rule"] for e in edge.decisions(client)} == {"-"}
    assert edge.post_json(other, "/auth/forgot-password", body).status != 429


def test_a_dashboard_session_passes_untouched(edge: EdgeStack) -> None:
    """A browser signs in and walks the dashboard through the edge: no rule decides, and the
    API sees the browser's address."""
    browser = "127.0.0.35"
    page = edge.request(browser, "GET", "/ui/login")
    assert page.status == 200, page
    credentials = {"email": edge.demo["email"], "password": edge.demo["password"]}
    login = edge.post_json(browser, "/auth/login", {**credentials, "turnstile_token": ""})
    assert login.status == 200, login
    cookie = "; ".join(f"{k}={v}" for k, v in login.cookies.items())
    for path in ("/ui/accounts", "/ui/orders", "/ui/alerts", "/ui/settings/security"):
        reply = edge.request(browser, "GET", path, headers={"Cookie": cookie})
        assert reply.status == 200, (path, reply.status)
    assert {entry["edge_rule"] for entry in edge.decisions(browser)} == {"-"}
    edge.app_saw(browser, "GET", "/ui/settings/security", 200)
