"""deploy/edge/rules.json is the one list of the edge rules: the nginx configuration and the
AWS WAFv2 web ACL (deploy/aws/waf-web-acl.json) are both checked against it here, rule by rule
(order, action, scope, limits, count-mode overrides). These tests read files only; the
behaviour of each rule is proved through real nginx in test_edge_rules.py."""

from __future__ import annotations

import importlib
import json
import os
import re
from typing import Any

import pytest
from edge_harness import AWS_TEMPLATE, EDGE_DIR, manifest_rules

MODSECURITY = EDGE_DIR / "modsecurity"
IP_SET_RESOURCES = {"admin": "AdminIpSet", "alert-source": "AlertSourceIpSet"}


def _template() -> dict[str, Any]:
    template: dict[str, Any] = json.loads(AWS_TEMPLATE.read_text())
    return template


def _aws_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = _template()["Resources"]["WebAcl"]["Properties"]["Rules"]
    return sorted(rules, key=lambda rule: rule["Priority"])


def _walk(node: Any, key: str) -> list[Any]:
    """Every value stored under ``key`` anywhere in ``node``."""
    found = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                found.append(v)
            found.extend(_walk(v, key))
    elif isinstance(node, list):
        for item in node:
            found.extend(_walk(item, key))
    return found


def _paths(statement: Any, constraint: str) -> set[str]:
    return {
        match["SearchString"]
        for match in _walk(statement, "ByteMatchStatement")
        if match["PositionalConstraint"] == constraint and "UriPath" in match["FieldToMatch"]
    }


def test_the_manifest_lists_the_seven_rules_in_priority_order() -> None:
    rules = manifest_rules()
    assert [rule["priority"] for rule in rules] == list(range(1, 8))
    assert len({rule["log_name"] for rule in rules}) == 7


def test_aws_template_is_valid_cloudformation() -> None:
    """cfn-lint checks the template against CloudFormation's WAFv2 schemas (property names,
    enums, patterns), which a comparison with the manifest alone would not catch."""
    try:
        cfnlint_api = importlib.import_module("cfnlint.api")
    except ImportError:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip("cfn-lint is not installed (the test extra has it)")
    problems = [str(match) for match in cfnlint_api.lint_file(AWS_TEMPLATE)]
    assert problems == []


def test_aws_web_acl_has_the_manifest_rules_in_order() -> None:
    aws = _aws_rules()
    rules = manifest_rules()
    assert [(r["Priority"], r["Name"]) for r in aws] == [
        (r["priority"], r["aws_name"]) for r in rules
    ]
    assert _template()["Resources"]["WebAcl"]["Properties"]["DefaultAction"] == {"Allow": {}}


@pytest.mark.parametrize("rule", manifest_rules(), ids=lambda rule: rule["log_name"])
def test_aws_rule_matches_the_manifest(rule: dict[str, Any]) -> None:
    aws = next(r for r in _aws_rules() if r["Priority"] == rule["priority"])
    statement = aws["Statement"]
    if "managed_group" in rule:
        assert aws["OverrideAction"] == {"None": {}}
        group = statement["ManagedRuleGroupStatement"]
        assert (group["VendorName"], group["Name"]) == ("AWS", rule["managed_group"])
        overrides = group.get("RuleActionOverrides", [])
        assert [o["Name"] for o in overrides] == rule.get("count_overrides", [])
        assert all(o["ActionToUse"] == {"Count": {}} for o in overrides)
        return
    if rule["action"] == "allow":
        assert aws["Action"] == {"Allow": {}}
    else:
        block = aws["Action"]["Block"]
        status = block.get("CustomResponse", {}).get("ResponseCode", 403)
        assert status == rule["status"]
    if "ip_set" in rule:
        reference = {"Fn::GetAtt": [IP_SET_RESOURCES[rule["ip_set"]], "Arn"]}
        negated = [s["Statement"] for s in _walk(statement, "NotStatement")]
        in_set = [s for s in _walk(statement, "IPSetReferenceStatement")]
        assert [s["Arn"] for s in in_set] == [reference]
        expected = [{"IPSetReferenceStatement": {"Arn": reference}}]
        assert negated == (expected if rule["ip_set_match"] == "not-in-set" else [])
        assert _paths(statement, "STARTS_WITH") == set(rule["paths"])
    if "rate_limit" in rule:
        limit = rule["rate_limit"]
        rate = statement["RateBasedStatement"]
        assert rate["AggregateKeyType"] == "IP"
        assert rate["EvaluationWindowSec"] == limit["window_s"]
        if "variable" in limit:
            parameter = rate["Limit"]["Ref"]
            assert _template()["Parameters"][parameter]["Default"] == limit["limit"]
            assert limit["variable"] in _template()["Parameters"][parameter]["Description"]
        else:
            assert rate["Limit"] == limit["limit"]
        assert _paths(statement, "EXACTLY") == set(rule.get("paths", []))


def _geo_entries(name: str) -> list[str]:
    text = (EDGE_DIR / "ip-sets" / name).read_text()
    return re.findall(r"^([0-9A-Fa-f:.]+(?:/\d+)?) 1;$", text, re.MULTILINE)


def test_aws_alert_source_default_is_the_edge_alert_source_set() -> None:
    default = _template()["Parameters"]["AlertSourceAddresses"]["Default"].split(",")
    assert default == [f"{address}/32" for address in _geo_entries("alert-source.conf")]
    assert len(default) == 4


def test_nginx_decides_and_logs_each_rule_under_its_manifest_name() -> None:
    server = (EDGE_DIR / "edge-server.conf").read_text()
    for rule in manifest_rules():
        priority = rule["priority"]
        assert f"error_page {460 + priority} = @edge_rule_{priority};" in server
        location = re.search(rf"location @edge_rule_{priority} \{{(.*?)\n\}}", server, re.DOTALL)
        assert location is not None, priority
        body = location.group(1)
        assert f'set $edge_rule "{rule["log_name"]}";' in body
        assert "modsecurity off;" in body
        if rule["action"] == "block":
            assert f"return {rule['status']} " in body
        else:
            assert "include proxy.conf;" in body


def _modsecurity_text() -> str:
    return "\n".join(path.read_text() for path in sorted(MODSECURITY.glob("*.conf")))


@pytest.mark.parametrize(
    "rule", [r for r in manifest_rules() if r["priority"] >= 3], ids=lambda r: r["log_name"]
)
def test_modsecurity_refuses_with_the_rules_internal_status(rule: dict[str, Any]) -> None:
    denials = re.findall(
        r"deny,status:(\d+),[^\n]*\n\s*msg:'edge rule (\d) ([a-z-]+): block'", _modsecurity_text()
    )
    status = str(460 + rule["priority"])
    assert (status, str(rule["priority"]), rule["name"]) in denials


def test_limits_conf_holds_the_manifest_limits() -> None:
    limits = (MODSECURITY / "limits.conf").read_text()
    values = dict(re.findall(r"setvar:tx\.(\w+)=(\d+)", limits))
    login = next(r for r in manifest_rules() if r["name"] == "login-rate-limit")["rate_limit"]
    blanket = next(r for r in manifest_rules() if r["name"] == "blanket-rate-limit")["rate_limit"]
    assert int(values["edge_login_limit"]) == login["limit"]
    assert int(values["edge_login_window_s"]) == login["window_s"]
    assert int(values[blanket["variable"]]) == blanket["limit"]
    assert int(values["waf_rate_window_s"]) == blanket["window_s"]


def _nginx_map_pattern(variable: str) -> re.Pattern[str]:
    maps = (EDGE_DIR / "edge-maps.conf").read_text()
    block = re.search(rf"\${variable} \{{(.*?)\n\}}", maps, re.DOTALL)
    assert block is not None
    pattern = re.search(r'"~(\*?)(.*?)" 1;', block.group(1))
    assert pattern is not None
    return re.compile(pattern.group(2), re.IGNORECASE if pattern.group(1) else 0)


@pytest.mark.parametrize(
    ("variable", "rule_name", "in_set_flag"),
    [
        ("edge_rule1_refused", "admin-ip", "0"),
        ("edge_rule2_alert_webhook", "alert-source-allow", "1"),
    ],
)
def test_nginx_path_scopes_are_the_manifest_paths(
    variable: str, rule_name: str, in_set_flag: str
) -> None:
    pattern = _nginx_map_pattern(variable)
    rule = next(r for r in manifest_rules() if r["name"] == rule_name)
    for path in rule["paths"]:
        assert pattern.search(f"{in_set_flag}:{path}x"), path
        flipped = "1" if in_set_flag == "0" else "0"
        assert not pattern.search(f"{flipped}:{path}x"), path
    assert not pattern.search(f"{in_set_flag}:/health")


def test_login_rate_rule_scope_is_the_manifest_paths() -> None:
    rates = (MODSECURITY / "rate-rules.conf").read_text()
    scope = re.search(r'SecRule REQUEST_FILENAME "!@rx ([^"]+)"', rates)
    assert scope is not None
    pattern = re.compile(scope.group(1))
    rule = next(r for r in manifest_rules() if r["name"] == "login-rate-limit")
    assert all(pattern.search(path) for path in rule["paths"])
    for other in ("/auth/token", "/auth/login-x", "/auth/reset-password", "/x/auth/login"):
        assert not pattern.search(other), other


def test_the_count_mode_overrides_are_logged_by_name() -> None:
    common = (MODSECURITY / "common-rule-set.conf").read_text()
    rule = next(r for r in manifest_rules() if r["name"] == "common-rule-set")
    for name in rule["count_overrides"]:
        assert f"msg:'edge rule 5 {name}: count'" in common, name
    # A count rule never refuses.
    for rule_text in re.findall(r"SecRule [^\n]*\n(?:\s+[^\n]*\n)*", common):
        if ": count'" in rule_text:
            assert ",pass," in rule_text and "deny" not in rule_text
