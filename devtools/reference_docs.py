"""Write the reference pages of the manual (docs/reference/*.md) from the code: every marker with its signature,
every pytest option and ini key, every ``syncguard`` subcommand with its options, every metric with its unit and
comparison rule, and the fixture's API. ``python devtools/reference_docs.py`` rewrites them; tests/test_docs.py
fails when a page differs from what this makes, so the reference cannot drift from the code."""

from __future__ import annotations

import argparse
import ast
import inspect
import itertools
import os
import re
import statistics
import sys
import textwrap
from pathlib import Path

from _pytest.config.argparsing import Parser

from pytest_syncguard import plugin
from pytest_syncguard.budgets import marker_docs
from pytest_syncguard.codec import layout
from pytest_syncguard.document import file as results_file
from pytest_syncguard.document.launch import Launch
from pytest_syncguard.document.measured import MeasuredTest
from pytest_syncguard.document.shard import Shard
from pytest_syncguard.gate.cli import build_parser
from pytest_syncguard.guard import GenerationRegion, SyncGuard
from pytest_syncguard.measurement import Measurement
from pytest_syncguard.metrics import METRICS
from pytest_syncguard.signals import COUNTERS

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference"
GENERATED = "<!-- Made by devtools/reference_docs.py from the code: edit the code (or that script), not this page. -->"


def _rst(text: str) -> str:
    """Docstring text as Markdown: ``literal`` becomes `literal`, a cross-reference (:meth:`x`) its name."""
    return re.sub(r":(?:meth|attr|class|func|data|mod):`[~.]*([^`]+)`", r"`\1`", text.replace("``", "`"))


def markers() -> str:
    lines = ["# Markers", "", GENERATED, "",
             "Budget markers are assertions: they are enforced with or without `--syncguard`. A bad argument is a "
             "usage error that names the test and the marker. A budget that fails under `@pytest.mark.xfail` "
             "(without `raises=`) is the failure the mark expects: the test is XFAIL, strict or not.", ""]  # fmt: skip
    for name, signature, description in marker_docs():
        lines += [f"## `{name}`", "", "```text", f"@pytest.mark.{name}{signature}", "```", "", _rst(description), ""]
    return "\n".join(lines)


def options() -> str:
    parser = Parser(_ispytest=True)
    plugin.pytest_addoption(parser)
    group = parser.getgroup("syncguard")
    lines = ["# Options and ini keys", "", GENERATED, "", "## Command-line options", ""]
    for option in group.options:
        attrs = option.attrs()
        metavar = f" {attrs['metavar']}" if attrs.get("metavar") else ""
        choices = f" {{{','.join(attrs['choices'])}}}" if attrs.get("choices") else ""
        lines += [f"### `{option.names()[0]}{metavar}{choices}`", "", str(attrs.get("help", "")), ""]
    lines += ["## Ini keys", "", "In `pytest.ini`, `pyproject.toml` (`[tool.pytest.ini_options]`), `tox.ini` or "
              "`setup.cfg`; a command-line option wins over its key.", ""]  # fmt: skip
    for name, (help_text, kind, default) in sorted(parser._inidict.items()):
        lines += [f"### `{name}`", "", f"{help_text} ({kind}, default `{default}`).", ""]
    return "\n".join(lines)


def cli() -> str:
    os.environ["COLUMNS"] = "100"  # argparse wraps usage to the terminal's width: the page must not depend on it
    parser = build_parser()
    lines = ["# The `syncguard` command", "", GENERATED, "",
             "The commands other than running tests never import torch, except `device` where the CUDA driver is.",
             ""]  # fmt: skip
    lines += _commands(parser, "syncguard", "##")
    return "\n".join(lines)


def _commands(parser: argparse.ArgumentParser, prog: str, heading: str) -> list[str]:
    """Each subcommand of ``parser``: its usage and options, and its own subcommands a level down."""
    lines: list[str] = []
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    for name, command in sub.choices.items():
        command.prog = f"{prog} {name}"
        usage = command.format_usage().removeprefix("usage: ").strip()
        lines += [f"{heading} `{prog} {name}`", "", str(helps.get(name, "")), "", "```text", usage, "```", ""]
        nested = any(isinstance(a, argparse._SubParsersAction) for a in command._actions)
        for action in command._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            flags = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
            text = (action.help or "").replace("%%", "%")
            lines.append(f"- {flags}: {text}")
        lines.append("")
        if nested:
            lines += _commands(command, f"{prog} {name}", heading + "#")
    return lines


def metrics() -> str:
    lines = ["# Metrics", "", GENERATED, "",
             "The numbers a test's results, its summary row, the JSON results, the baselines and JUnit properties "
             "carry, by name. Counts are compared exactly against the baseline (any increase is a regression); "
             "device-side metrics within a tolerance; host timings are shown and judged A/B on one runner "
             "(`syncguard ab`).", "",
             "A test's value of a metric aggregates its measured runs by one rule, the same for its budget, the "
             "summary, the JSON results and the baseline: the median of a noisy metric, the worst run of memory, the "
             "largest count (of the allocator's cudaMalloc and cudaFree calls, the fewest: the loop's steady state, "
             "see [the order of tests](../explanation/gate.md#counts-allocator-numbers-and-the-order-of-tests)).", "",
             "| metric | what | unit | better | runs | compared against the baseline |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for spec in METRICS.values():
        if spec.counted:
            rule = "exactly (a count)"
        elif spec.host:
            rule = "not by default: a host timing, judged A/B (`--syncguard-judge-host-timings` to judge it)"
        else:
            rule = f"within {spec.tolerance:.0%} (device side)" if spec.tolerance else "within the run's tolerance"
        better = "higher" if spec.higher_is_better else "lower"
        counter = COUNTERS.get(spec.name.removesuffix("_per_token"))
        runs = "median" if spec.aggregate is statistics.median else ("largest" if spec.counted else "worst")
        runs = counter.of_runs if counter is not None else runs
        lines.append(f"| `{spec.name}` | {spec.description} | {spec.unit or '-'} | {better} | {runs} | {rule} |")
    lines.append("")
    return "\n".join(lines)


def results() -> str:
    lines = ["# The results document", "", GENERATED, "",
             f"What `--syncguard-json` writes, `syncguard report` and `syncguard ab` read, and an xdist worker sends "
             f"its controller: an object with `schema` (`{results_file.SCHEMA}`), `schema_version` "
             f"({results_file.SCHEMA_VERSION}), the versions it was measured with (`syncguard`, `torch`, `python`) "
             "and `tests`, one `MeasuredTest` record per test in node id order. Every record is written by one "
             "codec (`pytest_syncguard/codec.py`): each field under its own name, tuples as lists. Files of an older "
             "schema version still read; a newer one is an error that says to upgrade. Within a schema version, a "
             "record of a newer syncguard reads: a field, metric, budget marker or counter this version does not "
             "know is left out of what is judged, and `syncguard report` names each (\"was written by another "
             "version of syncguard: this one does not know ...\"); a record of an older one reads with the fields "
             "added since at their defaults. Fields marked \"written only\" are there for the file's readers and "
             "ignored when read. The document's types are `pytest_syncguard/document/`, which imports nothing of "
             "the pytest side.", "",
             "A document written by one process of a launch of several (torchrun's ranks) has `launch` too, a "
             "`Launch` record: its `rank` and `world_size`, whether it `finished`, and the test `in_flight` when it "
             "last wrote (each rank writes its document after each test, so one that died leaves what it finished). "
             "`syncguard report` joins the ranks' tests into one each (`world_size`, `ranks`).", "",
             "A document of one shard of a suite split across CI jobs (`--syncguard-shard K/N`, or "
             "`SYNCGUARD_SHARD`) has `shard` too, a `Shard` record: its `index` (from 1) and the `count` of shards. "
             "`syncguard report`, given the documents of a split, fails the run with an entry for each shard none of "
             "them holds (`shard 2 of 3`).", ""]  # fmt: skip
    for name, rows in [*layout(MeasuredTest).items(), *layout(Launch).items(), *layout(Shard).items()]:
        lines += [f"## `{name}`", "", "| field | type |", "|---|---|"]
        lines += [f"| `{field}` | {kind} |" for field, kind in rows]
        lines.append("")
    return "\n".join(lines)


#: The fixture's API, class by class: the members a test uses, in the order the page gives them.
FIXTURE_API: tuple[tuple[type, str, tuple[str, ...]], ...] = (
    (SyncGuard, "the `syncguard` fixture", ("generation", "measure", "allow", "step", "last", "measurements")),
    (GenerationRegion, "a region (what `generation()` yields)",
     ("tokens", "device", "model", "forward_calls", "measurement", "syncs", "allowed_syncs", "syncs_per_token",
      "sites", "by_kind", "count", "step", "marked_steps")),
    (Measurement, "a measurement (what `measure()` returns, `region.measurement`, `syncguard.last`)",
     ("device", "tokens", "syncs", "allowed_syncs", "syncs_per_token", "sites", "by_kind", "count", "count_top",
      "per_token", "uncounted", "regions", "timings", "gpu_timelines", "memory", "races")),
)  # fmt: skip


def _member(cls: type, name: str) -> tuple[str, str]:
    """A member's heading (its signature, or its type for an attribute) and its docstring."""
    found = inspect.getattr_static(cls, name, None)
    if isinstance(found, property):
        hint = inspect.signature(found.fget).return_annotation if found.fget else ""
        return f"`{name}` (property: `{hint}`)", inspect.getdoc(found) or ""
    if callable(found) or isinstance(found, (staticmethod, classmethod)):
        function = getattr(cls, name)
        signature = str(inspect.signature(function)).replace("(self, ", "(").replace("(self)", "()").replace("'", "")
        return f"`{name}{signature}`", inspect.getdoc(function) or ""
    annotations = {k: v for c in reversed(cls.__mro__) for k, v in getattr(c, "__annotations__", {}).items()}
    if name in annotations:
        return f"`{name}`: `{annotations[name]}`", _attribute_doc(cls, name)
    if name in cls.__init__.__code__.co_names or name in _assigned(cls):
        return f"`{name}`", _attribute_doc(cls, name)
    raise AttributeError(f"{cls.__name__}.{name}: not a member")


def _assigned(cls: type) -> set[str]:
    """The attributes ``__init__`` assigns (``self.name = ...``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    return {t.attr for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets
            if isinstance(t, ast.Attribute)}  # fmt: skip


def _attribute_doc(cls: type, name: str) -> str:
    """The string literal right after an attribute's declaration or assignment in the class's source, if any."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for statement, following in itertools.pairwise(body):
            targets = [statement.target] if isinstance(statement, ast.AnnAssign) else getattr(statement, "targets", [])
            named = {t.id if isinstance(t, ast.Name) else getattr(t, "attr", None) for t in targets}
            if name in named and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
                return inspect.cleandoc(str(following.value.value))
    return ""


def fixture() -> str:
    lines = ["# The `syncguard` fixture", "", GENERATED, "",
             "A test measures its loop through the `syncguard` fixture: `generation()` around a loop it runs itself, "
             "`measure()` around one it hands over (run `repeat` times after `warmup` unmeasured runs). Budget "
             "markers judge the test's outermost regions; the objects below hold their numbers for assertions of "
             "your own. Misuse (a bad `tokens`, `repeat` or `warmup`, `step()` outside a region) is a usage error "
             "that names the test.", ""]  # fmt: skip
    for cls, what, names in FIXTURE_API:
        lines += [f"## `{cls.__name__}`: {what}", "", _rst(inspect.getdoc(cls) or ""), ""]
        for name in names:
            heading, doc = _member(cls, name)
            lines += [f"### {heading}", "", _rst(doc) or "(no description)", ""]
    return "\n".join(lines)


PAGES = {"markers.md": markers, "options.md": options, "cli.md": cli, "metrics.md": metrics, "results.md": results,
         "fixture.md": fixture}  # fmt: skip


def render() -> dict[Path, str]:
    return {REFERENCE / name: make() for name, make in PAGES.items()}


def main() -> int:
    for path, text in render().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
