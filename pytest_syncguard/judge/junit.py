"""A JUnit file's ``syncguard.*`` properties read back into the run's cases (read with junitparser): the names of
the properties, one list for writer (:mod:`.render.junit`) and reader, and the reading, which checks every value as a
results file's are checked. No torch here."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..analysis.explain import Details
from ..codec import decode, loads
from ..document import upgrades
from ..environment import is_slug, unnamed_slug
from ..metrics import Metrics, metric, value_problem
from .cases import RunCase, outcome_of

PREFIX = "syncguard."


class Prop:
    """The names of the ``syncguard.*`` properties (without the prefix): one list for writer and reader."""

    NODEID = "nodeid"
    VERDICT = "verdict"
    DEVICE = "device"
    TOKENS = "tokens"
    BUDGETS = "budgets"
    BASELINE = "baseline"
    """The comparison's status (new, unchanged, regression, ...)."""
    DEVICE_SLUG = "device_slug"
    TOLERANCE = "tolerance"
    FINGERPRINT = "fingerprint"
    """Read from older files only (JSON), as :attr:`FINGERPRINT_CHANGES` and :attr:`DETAILS`."""
    FINGERPRINT_CHANGES = "fingerprint_changes"
    ERROR = "error"
    HOST_TIMINGS = "host_timings"
    """"true" when the run judged host timings against the baseline (the runner is the baseline's host)."""
    DETAILS = "details"
    """Read from older files only: the test's sync sites and counters' largest contributors (JSON)."""
    RUNS = "runs."
    """``runs.<metric>``: how many runs a noisy metric is the median of (written when more than 1)."""
    BASELINE_VALUE = "baseline."
    """``baseline.<metric>``: the baseline entry's value the run compared with."""


class JUnitError(ValueError):
    """A JUnit file that cannot be read; the message names it."""


def _numbers(properties: Mapping[str, str], prefix: str) -> dict[str, float]:
    """``<prefix><metric>`` properties of metrics this version knows; a value that no measurement can have (not a
    number, not finite, negative, past any measurement) is a ValueError naming the property, as a results file's
    is: never dropped, which would read as "unchanged"."""
    values = {}
    for key, raw in properties.items():
        name = key[len(prefix) :] if key.startswith(prefix) else None
        if name and metric(name) is not None:
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"property {PREFIX}{key} = {raw!r}: not a number") from None
            problem = value_problem(name, value)
            if problem is not None:
                raise ValueError(f"property {PREFIX}{key}: {problem}")
            values[name] = value
    return values


def _json_object(raw: str | None) -> dict[str, Any]:
    try:
        data = loads(raw or "{}")
    except (ValueError, RecursionError):  # bad JSON, a number too long, nesting too deep
        return {}
    return data if isinstance(data, dict) else {}


def _details(raw: str | None) -> Details | None:
    if raw is None:
        return None
    try:
        return decode(Details, upgrades.details(loads(raw)), Prop.DETAILS)
    except (ValueError, RecursionError) as exc:  # CodecError is a ValueError
        raise ValueError(f"property {PREFIX}{Prop.DETAILS} is not valid ({str(exc)[:200]})") from exc


def _case(nodeid: str, outcome: str, found: Mapping[str, str]) -> RunCase:
    metrics = _numbers(found, "")
    runs = {}
    for name in metrics:
        raw = found.get(f"{Prop.RUNS}{name}", "1")
        runs[name] = int(raw) if raw.isascii() and raw.isdigit() else 1
    raw_tolerance = found.get(Prop.TOLERANCE)
    tolerance: float | None = None
    if raw_tolerance is not None:
        try:
            tolerance = float(raw_tolerance)
        except ValueError:
            tolerance = math.nan
        if not 0 <= tolerance <= 1e6:  # NaN too
            raise ValueError(f"property {PREFIX}{Prop.TOLERANCE} = {raw_tolerance!r}: not a finite fraction >= 0")
    fingerprint = {str(k): None if v is None else str(v) for k, v in _json_object(found.get(Prop.FINGERPRINT)).items()}
    drift = {
        str(k): (None if v[0] is None else str(v[0]), None if v[1] is None else str(v[1]))
        for k, v in _json_object(found.get(Prop.FINGERPRINT_CHANGES)).items()
        if isinstance(v, list) and len(v) == 2
    }
    return RunCase(
        nodeid=nodeid,
        outcome=outcome,
        verdict=found[Prop.VERDICT],
        device_slug=found.get(Prop.DEVICE_SLUG) or unnamed_slug(found.get(Prop.DEVICE, "")),
        budgets=found.get(Prop.BUDGETS),
        metrics=Metrics(metrics, runs),
        baseline_status=found.get(Prop.BASELINE),
        baseline_values=_numbers(found, Prop.BASELINE_VALUE),
        tolerance=tolerance,
        fingerprint=fingerprint,
        drift=drift,
        host_timings=found.get(Prop.HOST_TIMINGS) == "true",
        details=_details(found.get(Prop.DETAILS)),
    )


#: Every property name of :class:`Prop`, and those that are prefixes of a metric's name.
_NAMED = frozenset(v for k, v in vars(Prop).items() if k.isupper() and isinstance(v, str))
_PREFIXES = tuple(p for p in _NAMED if p.endswith("."))


def _unknown_metrics(found: Mapping[str, str]) -> set[str]:
    """The properties of a case that name no property nor metric this version knows (a newer version's metric)."""
    return {key for key in found if key not in _NAMED and not key.startswith(_PREFIXES) and metric(key) is None}


def read_cases(path: Path, unknown: dict[str, list[str]] | None = None) -> list[RunCase]:
    """The test cases of a JUnit XML file that carry syncguard properties (read with junitparser); the metrics this
    version does not know go into ``unknown`` under the file's path (read without them, said)."""
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
            found = {
                p.name[len(PREFIX) :]: p.value
                for p in (props if props is not None else [])
                if isinstance(p.name, str) and p.name.startswith(PREFIX) and isinstance(p.value, str)
            }
            if Prop.VERDICT not in found:
                continue
            results = case.result
            outcome = "passed"
            if any(isinstance(r, Error) for r in results):
                outcome = "error"
            elif any(isinstance(r, Failure) for r in results):
                outcome = "failed"
            elif any(isinstance(r, Skipped) for r in results):
                outcome = "skipped"
            if outcome == "passed":  # a verdict this version does not know is no pass
                outcome = outcome_of(found[Prop.VERDICT])
            if unknown is not None and (names := _unknown_metrics(found)):
                kept = unknown.setdefault(str(path), [])
                kept.extend(f"metric {name}" for name in sorted(names) if f"metric {name}" not in kept)
            nodeid = found.get(Prop.NODEID) or f"{case.classname}::{case.name}"
            try:
                parsed = _case(nodeid, outcome, found)
            except ValueError as exc:
                raise JUnitError(f"{path}: {nodeid}: {exc}") from exc
            if not is_slug(parsed.device_slug):
                raise JUnitError(
                    f"{path}: {nodeid}: device slug {parsed.device_slug!r} is not one (lowercase letters, digits "
                    "and '-'); the file was not written by pytest --syncguard"
                )
            cases.append(parsed)
    return cases
