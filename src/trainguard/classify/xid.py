"""NVIDIA XID codes: the one parser of XID lines (the rules' ``xid_pattern``) and what a code means.

The classifier's scanner, the fleet database (XID codes in a diagnosis's evidence lines) and the lemon
score (hardware or application XID) all go through these, so a log format the rules learn is learned
everywhere at once.
"""

from __future__ import annotations

import logging

from trainguard.classify.rules import RuleSet

log = logging.getLogger(__name__)


def _rules(rules: RuleSet | None) -> RuleSet:
    if rules is not None:
        return rules
    from trainguard.classify import default_rules  # cached; imported late: classify/__init__ imports this module

    return default_rules()


def xid_code(line: str, rules: RuleSet | None = None) -> int | None:
    """The XID code an XID line reports (``NVRM: Xid (PCI:0000:3b:00): 79, ...`` -> 79), else None.
    ``rules``: whose ``xid_pattern`` to use (default: the built-in rules)."""
    m = _rules(rules).xid_pattern.search(line)
    return int(m.group("code")) if m else None


def is_hardware_xid(code: int, rules: RuleSet | None = None) -> bool:
    """Whether the rules blame XID ``code`` on the hardware; a code no rule explains counts as hardware
    (an unknown XID is reported by the driver, not by the application)."""
    rule = _rules(rules).xid_rule(code)
    return rule is None or rule.tier == "hardware"
