"""A test's verdict and the numbers a person reads as JUnit ``<property>`` pairs (``syncguard.<metric>``); reading
them back is :mod:`..junit`'s. The results document (:mod:`...document.file`) is the record of a test's results: a
JUnit file carries no second data format (files written before, with the details and fingerprint as JSON, still
read).

``--junitxml`` writes them inside the test's ``<testcase>`` with or without pytest-xdist (the teardown report
carries the item's properties from the worker), under every ``junit_family``: pytest warns about properties
with xunit2 only for its own ``record_property`` fixture, and the xunit2 schema does not list testcase
properties, so a strict XSD validator may reject the file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..environment import unnamed_slug
from ..judge.junit import PREFIX, Prop

if TYPE_CHECKING:
    from ..document.measured import MeasuredTest


def properties(result: MeasuredTest) -> list[tuple[str, object]]:
    """Verdict, device, every measured metric, the budgets and the baseline comparison of one test."""
    comparison = result.comparison
    # Every case names the baseline file of its device, compared with one or not (a report groups cases by it).
    slug = result.device_slug or (comparison.device if comparison is not None else unnamed_slug(result.device))
    props: list[tuple[str, object]] = [
        (Prop.NODEID, result.nodeid),
        (Prop.VERDICT, result.verdict),
        (Prop.DEVICE, result.device),
        (Prop.DEVICE_SLUG, slug),
    ]
    if result.tokens is not None:
        props.append((Prop.TOKENS, result.tokens))
    metrics = result.metrics
    props.extend((name, _number(value)) for name, value in sorted(metrics.values.items()))
    props.extend((f"{Prop.RUNS}{name}", n) for name, n in sorted(metrics.runs.items()) if n > 1)
    if result.checks:
        props.append((Prop.BUDGETS, "; ".join(c.budget.describe() for c in result.checks)))
    if comparison is not None:
        props.append((Prop.BASELINE, comparison.status))
        if comparison.tolerance is not None:
            props.append((Prop.TOLERANCE, comparison.tolerance))
        if comparison.host_timings:
            props.append((Prop.HOST_TIMINGS, "true"))
        props.extend(
            (f"{Prop.BASELINE_VALUE}{name}", _number(old)) for name, old in comparison.baseline_values().items()
        )
    if result.error is not None:
        props.append((Prop.ERROR, result.error))
    # Plain strings: a status is a str subclass (:class:`...status.Status`), which xdist's channel does not carry.
    return [(PREFIX + name, str(value) if isinstance(value, str) else value) for name, value in props]


def _number(value: float) -> object:
    return int(value) if float(value).is_integer() else value
