"""What a finished tune decided, without what a run's clock or paths change: the report's
sizes and tests, the candidates training weighed and the one it kept, and every kept
decisions file's replay lines. The same tune run before and after a change of how the tune
is built must have the same fingerprint (tests/data/tune-before/, made by the tune before
its stages were declared)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def fingerprint(out: Path) -> dict:
    report = json.loads((out / "report.json").read_text())
    training = report["training"]
    size = report["size"]
    decisions = out / "decisions"
    inl = {
        str(p.relative_to(decisions)): p.read_text().splitlines()
        for p in sorted(decisions.rglob("*.inl"))
    }
    return {
        "size": {k: size[k] for k in ("baseline", "policy", "change_pct", "files")},
        "linked": size.get("linked", {}).get("change_pct"),
        "tests": report["tests"],
        "chosen": training["chosen"],
        "steps": training["steps"],
        "candidates_change_pct": training["candidates_change_pct"],
        "decisions": inl,
    }


if __name__ == "__main__":
    print(json.dumps(fingerprint(Path(sys.argv[1])), indent=1, sort_keys=True))
