"""The console's audit page names every action the log can hold: its filter offers each one and a
row shows a label, not a bare code (service tokens and the restore's account.deleted had none)."""

import re
from pathlib import Path

from contracts.audit import AuditAction

PAGE = Path(__file__).resolve().parents[2] / "services/console/static/page-audit.js"


def test_the_audit_page_labels_exactly_the_contracts_actions() -> None:
    listed = re.search(r"export const ACTIONS = \[(.*?)\n\];", PAGE.read_text(), re.S)
    assert listed is not None
    actions = re.findall(r'^\s*\["([a-z_.]+)", "[^"]+"\],$', listed.group(1), re.M)
    assert sorted(actions) == sorted(a.value for a in AuditAction)
    assert len(actions) == len(set(actions))
