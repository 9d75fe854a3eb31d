"""What a change does to its own gate: the baseline values it loosens, head's baseline files against the base's.

A pull request that raises a test's recorded syncs in ``baselines/`` in the commit that adds the syncs passes a
gate that reads the head's files. The report judges against the base's files instead (``syncguard report
--base-ref``) and says above the fold what the head's files loosen: a count or a device-side value raised (or,
of a higher-is-better metric, lowered), a metric or a test's entry removed. ``syncguard ab --skip-judged`` A/B-tests
every test whose entry the change loosened. No torch here."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..metrics import metric
from .baselines import Baseline, BaselineError, parse


@dataclass(frozen=True)
class Loosened:
    """A baseline value the head's file makes more lenient than the base's (``new`` None: removed)."""

    device: str
    nodeid: str
    metric: str
    old: float
    new: float | None


def loosened(base: Baseline, head: Baseline) -> list[Loosened]:
    """The values of ``base`` that ``head`` loosens, by test and metric (host timings, never judged against a
    baseline, are left out)."""
    found = []
    for nodeid, entry in sorted(base.tests.items()):
        now = head.tests.get(nodeid, {})
        for name, old in sorted(entry.items()):
            spec = metric(name)
            if spec is not None and spec.host:
                continue
            new = now.get(name)
            higher_is_better = spec.higher_is_better if spec is not None else False
            if new is None or (new < old if higher_is_better else new > old):
                found.append(Loosened(base.device, nodeid, name, old, new))
    return found


def at_commit(checkout: Path, ref: str, path: Path) -> Baseline | None:
    """The baseline file ``path`` (of the checkout's working tree) as commit ``ref`` has it; None where the commit
    has no such file. :class:`.baselines.BaselineError` names the ref, or the file, when either is unusable."""
    try:
        top = _git(checkout, "rev-parse", "--show-toplevel").strip()
        commit = _git(checkout, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}").strip()
    except BaselineError as exc:
        raise BaselineError(f"--base-ref {ref}: {exc}") from None
    try:
        relative = path.resolve().relative_to(Path(top).resolve()).as_posix()
    except ValueError:
        raise BaselineError(f"--base-ref {ref}: {path} is outside the repository at {top}") from None
    try:
        _git(checkout, "cat-file", "-e", f"{commit}:{relative}")
    except BaselineError:
        return None
    try:
        text = _git(checkout, "cat-file", "blob", f"{commit}:{relative}")
    except BaselineError as exc:
        raise BaselineError(f"--base-ref {ref}: {relative}: {exc}") from None
    return parse(text, Path(f"{ref}:{relative}"))


def _git(checkout: Path, *args: str) -> str:
    """What ``git ARGS`` printed, as UTF-8 text; :class:`.baselines.BaselineError` where it failed or printed bytes
    that are not UTF-8 (a baseline file committed in another encoding)."""
    try:
        done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BaselineError(f"git {args[0]} could not run: {exc}") from exc
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip()[:300] or f"exit status {done.returncode}"
        raise BaselineError(f"git {args[0]} in {checkout}: {said}")
    try:
        return done.stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BaselineError(f"git {' '.join(args[:2])}: not UTF-8 text ({exc})") from None
