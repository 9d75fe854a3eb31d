"""Every field of an artifact is hostile: a results document, an A/B report and a JUnit file whose every string and
every key holds markup, made from the records' own type hints (a field added later is covered without a word here),
rendered by ``syncguard report`` and then by GitHub's renderer (cmark-gfm, its extensions, raw HTML let through as
GitHub's tag filter would judge it). Nothing of the payload may become a tag, a link, a mention, emphasis or a new
table cell."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Union

import cmarkgfm
import pytest

from pytest_syncguard.codec import encode
from pytest_syncguard.document import ab
from pytest_syncguard.document import file as results_file
from pytest_syncguard.document.comparison import Change
from pytest_syncguard.document.measured import MeasuredTest
from pytest_syncguard.metrics import DEVICE_TIME, Metrics
from pytest_syncguard.render.junit import properties

#: One payload of every kind: a tag, a mention, an issue reference, a link, an autolink, emphasis, a table pipe, a
#: backtick, a line break that would start a heading.
PAYLOAD = "x|y <img src=x onerror=alert(1)> @attacker #12 [l](http://e.vil) www.e.vil **b** `t`\n## h"


def hostile(hint: Any, depth: int = 0) -> Any:
    """A value of type ``hint`` with :data:`PAYLOAD` in every string and key, a record's every field filled."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return PAYLOAD
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return hostile(options[0], depth)
    if isinstance(hint, type) and is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        return hint(**{f.name: hostile(hints[f.name], depth + 1) for f in fields(hint) if f.init})
    if origin in (tuple, list):
        items = [args[0]] if origin is list or (len(args) == 2 and args[1] is Ellipsis) else list(args)
        values = [hostile(a, depth + 1) for a in items]
        return tuple(values) if origin is tuple else values
    if origin in (dict, Mapping):
        return {PAYLOAD: hostile(args[1], depth + 1)}
    if hint is str:
        return PAYLOAD
    if hint is bool:
        return False
    if hint is int:
        return 1
    if hint is float:
        return 0.5  # a fraction, a probability, a time: valid wherever a number is
    raise TypeError(f"no hostile value for {hint!r}")


def _with_verdicts(test: MeasuredTest, status: str | None = None, held: bool | None = None, nodeid: str | None = None
                   ) -> MeasuredTest:  # fmt: skip
    """``test`` with the metrics every measured test has (its syncs); with ``status``, ``held`` and ``nodeid``, its
    comparison's status, its checks' outcome and its node id set."""
    metrics = Metrics({**test.metrics.values, "syncs": 3.0, "syncs_per_token": 1.0, DEVICE_TIME: 2000.0,
                       "busy_fraction": 0.5, "tokens_per_second": 100.0}, dict(test.metrics.runs))  # fmt: skip
    test = replace(test, metrics=metrics, nodeid=nodeid or test.nodeid)
    if status is None or test.comparison is None:
        return test
    changes = tuple(replace(c, status=status) for c in test.comparison.changes)
    changes += (Change(DEVICE_TIME, 1900.0, 2000.0, status), Change("busy_fraction", 0.6, 0.5, "not judged"))
    comparison = replace(test.comparison, status=status, changes=changes)
    return replace(test, comparison=comparison, checks=tuple(replace(c, held=held) for c in test.checks), error=None,
                   outcome=None)  # fmt: skip


def rendered(markdown: str) -> str:
    return cmarkgfm.github_flavored_markdown_to_html(markdown, options=cmarkgfm.cmark.Options.CMARK_OPT_UNSAFE)


def _outside_code(html: str) -> str:
    return re.sub(r"<code>.*?</code>", "", html, flags=re.S)


def assert_inert(html: str) -> None:
    """No part of the payload is markup in ``html``: each of its pieces is text inside a code span, or escaped."""
    outside = _outside_code(html)
    assert "<img" not in html
    assert "e.vil" not in outside, "a link or autolink of the payload outside a code span"
    assert "@attacker" not in outside and "#12" not in outside
    assert "<strong>b</strong>" not in html and "<h2>h</h2>" not in html
    for table in re.findall(r"<table>.*?</table>", html, flags=re.S):
        head, body = table.split("</thead>")
        columns = len(re.findall(r"<th[ >]", head))
        for row in re.findall(r"<tr>(.*?)</tr>", body, flags=re.S):
            assert len(re.findall(r"<td[ >]", row)) == columns, row


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results document, an A/B report and a JUnit file, every field hostile."""
    folder = tmp_path_factory.mktemp("artifact")
    test = _with_verdicts(hostile(MeasuredTest))
    # Beside it, the same test with statuses the renderers branch on, so that every section shows (a failed budget,
    # a regression's chain): the rest of it still hostile.
    shown = _with_verdicts(test, status="regression", held=False, nodeid=f"{PAYLOAD} shown")
    tests = [encode(t) for t in (test, shown)]
    tests[0][PAYLOAD] = PAYLOAD  # a field of a newer version, which the report names
    document = {"schema": results_file.SCHEMA, "schema_version": results_file.SCHEMA_VERSION, "tests": tests}
    (folder / "results.json").write_text(json.dumps(document))
    report = hostile(ab.ABReport)
    (folder / "ab.json").write_text(json.dumps(ab.document(report)))
    from junitparser import JUnitXml, Properties, Property, TestCase, TestSuite

    case = TestCase(PAYLOAD, classname=PAYLOAD)
    props = Properties()
    # A JUnit file's device slug names a baseline file: one that is no slug refuses the file (tested below).
    for name, value in properties(replace(shown, device_slug="cpu")):
        props.add_property(Property(name, str(value)))
    case.append(props)
    suite = TestSuite("hostile")
    suite.add_testcase(case)
    xml = JUnitXml()
    xml.add_testsuite(suite)
    xml.write(str(folder / "junit.xml"))
    return folder


def report(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_syncguard.gate.cli", "report", *args],
        cwd=folder, capture_output=True, text=True, check=False,
    )  # fmt: skip


def test_the_generator_fills_every_string_field_and_key_of_the_records(artifact: Path) -> None:
    """The documents read back as written (the readers refuse none of the payload), so every field reaches the
    renderer."""
    test, _ = results_file.read(artifact / "results.json")
    assert test.nodeid == PAYLOAD and PAYLOAD in test.by_kind and test.sites[0].kind == PAYLOAD
    assert test.timeline is not None and PAYLOAD in test.timeline.idle_us_by_cause
    report = ab.read_report(artifact / "ab.json")
    assert report.stopped == PAYLOAD and PAYLOAD in report.only_in and report.tests[0].counts[0].status == PAYLOAD
    assert report.tests[0].timings[PAYLOAD].reason == PAYLOAD


@pytest.mark.parametrize("source", ["results.json", "junit.xml"])
def test_every_hostile_field_stays_text_in_the_comment(artifact: Path, source: str) -> None:
    done = report(artifact, source, "--ab", "ab.json", "--markdown", f"{source}.md", "--repository", "o/r", "--commit",
                  "a" * 40)  # fmt: skip
    assert done.returncode == 0, done.stderr
    markdown = (artifact / f"{source}.md").read_text()
    assert PAYLOAD.split("\n")[0][:20] in markdown.replace("\\|", "|")  # the payload is there, to be judged
    assert_inert(rendered(markdown))
    if source == "results.json":
        assert "was written by another version of syncguard: this one does not know field" in markdown
    assert "\\_" not in markdown  # shown verbatim in code spans, never backslash-escaped


def test_a_junit_file_whose_device_is_no_slug_is_refused_naming_it(artifact: Path, tmp_path: Path) -> None:
    text = (artifact / "junit.xml").read_text()
    (tmp_path / "slug.xml").write_text(text.replace('value="cpu"', 'value="../../etc/x"', 1))
    done = report(tmp_path, "slug.xml")
    assert done.returncode == 2 and "slug.xml: " in done.stderr and "is not one" in done.stderr and not done.stdout


def test_the_ab_reports_stop_is_inert_in_a_collapsed_summary() -> None:
    """A <summary> is raw HTML, where a code span is none: the A/B's ``stopped`` text never goes there as it is."""
    from pytest_syncguard.render.markdown import ab_lines

    report = replace(hostile(ab.ABReport), tests=(), failed_in={}, only_in={}, unreached=(), judged_by_baseline={})
    markdown = "\n".join(ab_lines(report))
    assert "<summary>A/B on one runner: stopped, see below</summary>" in markdown and "Stopped: `" in markdown
    assert_inert(rendered(markdown))
