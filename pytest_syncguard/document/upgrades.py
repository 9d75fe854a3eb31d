"""How the records written by earlier versions read as today's: each function takes the plain data of an old
layout and returns the layout :mod:`.codec` reads. Files written before stay readable: the results files of
schema version 1 (the base side of an A/B of an older commit writes them), the A/B reports of version 1, and
the details in baseline files and JUnit properties. No torch here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def details(data: object) -> object:
    """A test's details (sync sites, largest contributors): the sites' source line was optional."""
    if not isinstance(data, Mapping) or not isinstance(data.get("sites"), list):
        return data
    return {**data, "sites": [_with_code(site) for site in data["sites"]]}


def _with_code(site: object) -> object:
    return {"code": "", **site} if isinstance(site, Mapping) else site


def explanation(data: object) -> object:
    """Version 1 wrote a changed site flat, the site's fields beside ``old`` and ``new``."""
    if not isinstance(data, Mapping) or not isinstance(data.get("sites"), list):
        return data
    sites = [
        {
            "site": _with_code({k: v for k, v in s.items() if k not in ("old", "new")}),
            "old": s.get("old"),
            "new": s.get("new"),
        }
        if isinstance(s, Mapping) and "site" not in s
        else s
        for s in data["sites"]
    ]
    return {**data, "sites": sites}


def comparison(data: object) -> object:
    """Version 1 called the environment's differences ``fingerprint_changes``."""
    if not isinstance(data, Mapping) or "drift" in data:
        return data
    upgraded = {k: v for k, v in data.items() if k != "fingerprint_changes"}
    upgraded["drift"] = data.get("fingerprint_changes", {})
    upgraded["explanation"] = explanation(data.get("explanation", {}))
    return upgraded


def results_v1(test: Mapping[str, Any]) -> dict[str, Any]:
    """One test of a results file of schema version 1: metric values and their runs apart (``metrics``,
    ``samples``), budget checks flat (``budgets``, ``passed``), the comparison as ``baseline``, no device slug."""
    from ..environment import unnamed_slug

    upgraded = {k: v for k, v in test.items() if k not in ("samples", "budgets", "baseline")}
    upgraded["metrics"] = {"values": test.get("metrics"), "runs": test.get("samples")}
    upgraded["checks"] = [
        {
            "budget": {"marker": c.get("marker"), "limit": c.get("limit"), "stat": c.get("stat", "max")},
            "value": c.get("value"),
            "held": c.get("passed"),
            "text": c.get("text"),
        }
        if isinstance(c, Mapping)
        else c
        for c in test.get("budgets", ())
    ]
    baseline = test.get("baseline")
    upgraded["comparison"] = comparison(baseline)
    slug = baseline.get("device") if isinstance(baseline, Mapping) else None
    upgraded["device_slug"] = slug or unnamed_slug(str(test.get("device", "")))
    return upgraded


def ab_v1(report: Mapping[str, Any]) -> dict[str, Any]:
    """An A/B report of version 1: its explanations' sites flat."""
    tests = report.get("tests")
    if not isinstance(tests, list):
        return dict(report)
    upgraded = [
        {**t, "explanation": explanation(t.get("explanation", {}))} if isinstance(t, Mapping) else t for t in tests
    ]
    return {**report, "tests": upgraded}
