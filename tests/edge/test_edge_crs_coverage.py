"""Where the edge names CRS rules by id, or does a CRS file's work itself, it still covers the
installed CRS: a CRS update that adds an XSS or RFI rule, or changes the initialization,
fails here instead of silently changing what the edge inspects.

* The count-mode overrides take ARGS away from the CRS's XSS and RFI rules by rule id (by tag
  it costs every rule on every request; docs/performance.md), so the lists must name every
  rule the CRS tags ``attack-xss`` or ``attack-rfi``.
* The CRS's REQUEST-901-INITIALIZATION.conf is replaced by rules 21005 and 21006
  (modsecurity/crs-setup.conf), so every rule of that file must be accounted for and every
  default it gives must be given.
"""

from __future__ import annotations

import re
from pathlib import Path

from edge_harness import CRS_RULES, EDGE_DIR

MODSECURITY = EDGE_DIR / "modsecurity"
INITIALIZATION = "REQUEST-901-INITIALIZATION.conf"
# The overrides: the targets each tagged rule gets instead of ARGS (common-rule-set.conf).
OVERRIDES = {
    "attack-xss": "!ARGS|!ARGS_NAMES|ARGS_GET|ARGS_GET_NAMES",
    "attack-rfi": "!ARGS|ARGS_GET",
}
# The rules of REQUEST-901 and what replaces each (crs-setup.conf says why).
INITIALIZATION_RULES = {
    "901001": "not needed: crs_setup_version is set",
    "901100": "21005",
    "901110": "21005",
    "901120": "21005",
    "901125": "21005",
    "901130": "21005",
    "901140": "21005",
    "901141": "21005",
    "901142": "21005",
    "901143": "21005",
    "901150": "21005",
    "901152": "21005",
    "901160": "21005",
    "901162": "21005",
    "901163": "21005",
    "901164": "21005",
    "901165": "21005",
    "901166": "21005",
    "901167": "21005",
    "901168": "21005",
    "901200": "21005",
    "901318": "not needed: the CRS's reputation and DoS rules are not loaded",
    "901321": "not needed: the CRS's reputation and DoS rules are not loaded",
    "901340": "21006",
    "901350": "not needed: enforce_bodyproc_urlencoded is 0",
    "901400": "not needed: sampling_percentage is 100",
    "901410": "not needed: sampling_percentage is 100",
    "901420": "not needed: sampling_percentage is 100",
    "901430": "not needed: sampling_percentage is 100",
    "901440": "not needed: sampling_percentage is 100",
    "901450": "not needed: sampling_percentage is 100",
    "901500": "not needed: executing_paranoia_level is paranoia_level",
}
# Variables 901 sets that only its left-out rules read.
INITIALIZATION_ONLY = {"tx.ua_hash", "tx.real_ip", "tx.sampling_rnd100"}


def _rules(text: str) -> list[str]:
    """The rules of a ModSecurity file, one string each (continuation lines joined; a chained
    rule is a rule of its own, as it has no id or tags)."""
    joined = re.sub(r"\\\n\s*", "", text)
    return [line for line in joined.splitlines() if re.match(r"\s*Sec(?:Rule|Action)\b", line)]


def _rule_id(rule: str) -> str | None:
    found = re.search(r"\bid:'?(\d+)", rule)
    return found.group(1) if found else None


def _included_crs_files() -> list[Path]:
    included = re.findall(
        r"^Include /usr/share/modsecurity-crs/rules/(\S+)$",
        "\n".join(path.read_text() for path in sorted(MODSECURITY.glob("*.conf"))),
        re.MULTILINE,
    )
    return [CRS_RULES / name for name in included]


def test_the_body_overrides_name_every_xss_and_rfi_rule_of_the_crs(edge_packages: None) -> None:
    common = (MODSECURITY / "common-rule-set.conf").read_text()
    assert not re.search(r"^SecRuleUpdateTargetByTag", common, re.MULTILINE)
    named = re.findall(r'^SecRuleUpdateTargetById (\d+) "([^"]+)"$', common, re.MULTILINE)
    for tag, targets in OVERRIDES.items():
        tagged = {
            _rule_id(rule)
            for path in _included_crs_files()
            for rule in _rules(path.read_text())
            if f"tag:'{tag}'" in rule
        }
        assert tagged, f"no rule of the included CRS files is tagged {tag}"
        assert None not in tagged
        assert {rule_id for rule_id, got in named if got == targets} == tagged, tag
    # Every directive is one of the two overrides (no rule named twice, none unaccounted for).
    assert len(named) == len({rule_id for rule_id, _ in named})
    assert {targets for _, targets in named} <= set(OVERRIDES.values())


def test_the_crs_initialization_is_replaced_rule_by_rule(edge_packages: None) -> None:
    configuration = "\n".join(path.read_text() for path in sorted(MODSECURITY.glob("*.conf")))
    assert not re.search(rf"^Include .*{INITIALIZATION}", configuration, re.MULTILINE)
    crs_rules = [r for r in _rules((CRS_RULES / INITIALIZATION).read_text()) if _rule_id(r)]
    assert {_rule_id(rule) for rule in crs_rules} == set(INITIALIZATION_RULES)

    setup = _rules((MODSECURITY / "crs-setup.conf").read_text())
    defaults = next(rule for rule in setup if _rule_id(rule) == "21005")
    given = dict(re.findall(r"setvar:'?(tx\.\w+)=([^',\"]*)", defaults))
    set_anywhere = {name.lower() for name in re.findall(r"setvar:'?(tx\.\w+)=", "\n".join(setup))}
    for rule in crs_rules:
        if INITIALIZATION_RULES[_rule_id(rule) or ""] != "21005":
            continue
        for name, value in re.findall(r"setvar:'(tx\.\w+)=([^']*)'", rule):
            assert name.lower() in set_anywhere, name
            if name in given:
                # 21005 gives 901's own defaults; deliberate settings are crs-setup's 900xxx.
                expected = "%{tx.paranoia_level}" if "PARANOIA_LEVEL" in value else value
                assert given[name] == expected, name
    left_out = {
        name.lower()
        for rule in crs_rules
        if INITIALIZATION_RULES[_rule_id(rule) or ""] != "21005"
        for name in re.findall(r"setvar:'(tx\.\w+)=", rule, re.IGNORECASE)
    }
    assert left_out <= INITIALIZATION_ONLY

    (force_body,) = [rule for rule in crs_rules if _rule_id(rule) == "901340"]
    ours = next(rule for rule in setup if _rule_id(rule) == "21006")
    condition = re.match(r'\s*SecRule (\S+ "[^"]+")', force_body)
    assert condition is not None
    assert ours.startswith(f"SecRule {condition.group(1)} ")
    assert "ctl:forceRequestBodyVariable=On" in force_body
    assert "ctl:forceRequestBodyVariable=On" in ours
