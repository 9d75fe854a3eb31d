"""A test's results as JUnit ``<property>`` pairs (``syncguard.<metric>``), and reading them back.

``--junitxml`` writes them inside the test's ``<testcase>`` with or without pytest-xdist (the teardown report
carries the item's properties from the worker), under every ``junit_family``: pytest warns about properties
with xunit2 only for its own ``record_property`` fixture, and the xunit2 schema does not list testcase
properties, so a strict XSD validator may reject the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..metrics import METRICS

if TYPE_CHECKING:
    from .results import TestResult

PREFIX = "syncguard."


class JUnitError(ValueError):
    """A JUnit file that cannot be read; the message names it."""


@dataclass(frozen=True)
class JUnitCase:
    """One measured test case of a JUnit file: its node id, outcome and syncguard properties."""

    nodeid: str
    outcome: str
    """passed, failed, error or skipped, as the JUnit file says."""
    properties: dict[str, str]
    source: str

    @property
    def device_slug(self) -> str:
        return self.properties.get("device_slug") or self.properties.get("device", "?")

    @property
    def metrics(self) -> dict[str, float]:
        """The measured metrics (``syncguard.<metric>``)."""
        return self._numbers("")

    @property
    def baseline(self) -> dict[str, float]:
        """The baseline values the run compared with (``syncguard.baseline.<metric>``)."""
        return self._numbers("baseline.")

    def _numbers(self, prefix: str) -> dict[str, float]:
        values = {}
        for name in METRICS:
            raw = self.properties.get(prefix + name)
            if raw is not None:
                try:
                    values[name] = float(raw)
                except ValueError:
                    continue
        return values


def read_cases(path: Path) -> list[JUnitCase]:
    """The test cases of a JUnit XML file that carry syncguard properties (read with junitparser)."""
    from xml.etree.ElementTree import ParseError

    from junitparser import Error, Failure, JUnitXml, Properties, Skipped, TestSuite

    try:
        xml = JUnitXml.fromfile(str(path))
    except (OSError, ParseError) as exc:
        raise JUnitError(f"{path}: not a readable JUnit XML file ({exc})") from exc
    except Exception as exc:  # junitparser raises its own errors on other roots
        raise JUnitError(f"{path}: not a JUnit XML file ({exc})") from exc
    suites: Iterable[TestSuite] = [xml] if isinstance(xml, TestSuite) else xml
    cases = []
    for suite in suites:
        for case in suite:
            props = case.child(Properties)  # type: ignore[no-untyped-call]
            found = {p.name[len(PREFIX) :]: p.value for p in props} if props is not None else {}
            found = {k: v for k, v in found.items() if k and v is not None}
            if "verdict" not in found:
                continue
            results = case.result
            outcome = "passed"
            if any(isinstance(r, Error) for r in results):
                outcome = "error"
            elif any(isinstance(r, Failure) for r in results):
                outcome = "failed"
            elif any(isinstance(r, Skipped) for r in results):
                outcome = "skipped"
            nodeid = found.get("nodeid") or f"{case.classname}::{case.name}"
            cases.append(JUnitCase(nodeid, outcome, found, str(path)))
    return cases


def properties(result: TestResult) -> list[tuple[str, object]]:
    """Verdict, device, every measured metric, the budgets and the baseline comparison of one test."""
    props: list[tuple[str, object]] = [
        (f"{PREFIX}nodeid", result.nodeid),
        (f"{PREFIX}verdict", result.verdict),
        (f"{PREFIX}device", result.device),
    ]
    if result.tokens is not None:
        props.append((f"{PREFIX}tokens", result.tokens))
    props.extend((f"{PREFIX}{name}", _number(value)) for name, value in sorted(result.metrics.items()))
    props.extend((f"{PREFIX}runs.{name}", n) for name, n in sorted(result.samples.items()) if n > 1)
    if result.budgets:
        props.append((f"{PREFIX}budgets", "; ".join(b.describe for b in result.budgets)))
    baseline = result.baseline
    if baseline is not None:
        props.append((f"{PREFIX}baseline", baseline["status"]))
        props.append((f"{PREFIX}device_slug", baseline["device"]))
        props.append((f"{PREFIX}tolerance", baseline["tolerance"]))
        props.extend(
            (f"{PREFIX}baseline.{c['metric']}", _number(c["old"])) for c in baseline["changes"] if c["old"] is not None
        )
        if result.fingerprint:
            props.append((f"{PREFIX}fingerprint", json.dumps(result.fingerprint, sort_keys=True)))
        if baseline["fingerprint_changes"]:
            props.append((f"{PREFIX}fingerprint_changes", json.dumps(baseline["fingerprint_changes"], sort_keys=True)))
    if result.error is not None:
        props.append((f"{PREFIX}error", result.error))
    return props


def _number(value: float) -> object:
    return int(value) if float(value).is_integer() else value
