"""Run a repository's GitHub workflow job that uses this repository's composite action (.github/actions/syncguard, or
the copy `syncguard init` vendored into that repository) on this machine, as the runner would run it: the job's step
that names the action, with its ``with:`` inputs, then the action's own steps in order, each ``if:`` and ``${{ }}``
expression evaluated against the event given, each step's outputs passed on through ``GITHUB_OUTPUT``. The checkout
step is the repository as it is; a step that uses a JavaScript action (the artifact upload) is named and skipped: its
folder stays on disk. How the action was proven in a scratch repository (docs/howto/ci-gpu-runner.md): a push to
main, then a pull request, on a lent GPU.

    python devtools/run_action.py REPO/.github/workflows/gpu.yml --event push [--token T]
    python devtools/run_action.py REPO/.github/workflows/gpu.yml --event pull_request --pr 7 --base SHA

Only the expressions the action and a workflow snippet use are understood (context paths, string literals,
``==``, ``!=``, ``&&``, ``||``, ``always()``, ``toJSON(path)``); anything else is an error, never a guess.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

ACTION = Path(__file__).resolve().parents[1] / ".github" / "actions" / "syncguard"
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
TOKEN = re.compile(r"\s*(always\(\)|toJSON\([A-Za-z_][\w.-]*\)|'[^']*'|==|!=|&&|\|\||[A-Za-z_][\w.-]*)")


def lookup(context: dict[str, Any], path: str) -> Any:
    """A context path (``github.event.pull_request.number``); "" where any part is absent, as on GitHub."""
    value: Any = context
    for part in path.split("."):
        value = value.get(part, "") if isinstance(value, dict) else ""
    return value


def evaluate(expression: str, context: dict[str, Any]) -> Any:
    """An expression of context paths and literals joined by ``==``, ``!=``, ``&&``, ``||``."""
    tokens, at = [], 0
    while at < len(expression):
        found = TOKEN.match(expression, at)
        if found is None:
            raise SystemExit(f"run_action: cannot read {expression[at:]!r} in {expression!r}")
        tokens.append(found.group(1))
        at = found.end()
    values: list[Any] = []
    for token in tokens:
        if token in ("==", "!=", "&&", "||"):
            values.append(token)
        elif token == "always()":
            values.append(True)
        elif token.startswith("toJSON("):
            values.append(json.dumps(lookup(context, token[len("toJSON(") : -1])))
        elif token.startswith("'"):
            values.append(token[1:-1])
        else:
            values.append(lookup(context, token))
    # Comparisons first, then &&, then ||, left to right (GitHub's precedence).
    for ops in (("==", "!="), ("&&",), ("||",)):
        at = 1
        while at < len(values):
            op = values[at]
            if op in ops:
                values[at - 1 : at + 2] = [_apply(op, values[at - 1], values[at + 1])]
            else:
                at += 2
    if len(values) != 1:
        raise SystemExit(f"run_action: cannot evaluate {expression!r}")
    return values[0]


def _apply(op: str, left: Any, right: Any) -> Any:
    if op in ("==", "!="):
        return (str(left) == str(right)) == (op == "==")
    if op == "&&":
        return right if left else left
    return left or right


def substitute(text: str, context: dict[str, Any]) -> str:
    return EXPRESSION.sub(lambda m: str(evaluate(m.group(1), context)), str(text))


def run_steps(action: dict[str, Any], inputs: dict[str, str], context: dict[str, Any], cwd: Path) -> int:
    """The composite action's steps; the exit status of the first that failed (later ``always()`` steps still run)."""
    status = 0
    context = {**context, "inputs": inputs, "steps": {}}
    for step in action["runs"]["steps"]:
        name = step.get("name", step.get("id", "step"))
        condition = str(step.get("if", "success()")).strip()
        if condition == "success()":
            wanted = status == 0
        else:
            wanted = bool(evaluate(condition.removeprefix("${{").removesuffix("}}"), {**context, "success": None}))
        if not wanted:
            print(f"run_action: skipped: {name}", flush=True)
            continue
        if "uses" in step:
            print(f"run_action: skipped: {name} (uses {step['uses'].split('@')[0]}, a JavaScript action)", flush=True)
            continue
        with tempfile.NamedTemporaryFile("r", suffix=".output", delete=False) as output:
            outputs_path = Path(output.name)
        env = {**os.environ, **{k: substitute(v, context) for k, v in step.get("env", {}).items()},
               "GITHUB_OUTPUT": str(outputs_path)}  # fmt: skip
        print(f"run_action: step: {name}", flush=True)
        code = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=cwd, env=env).returncode
        outputs = dict(line.split("=", 1) for line in outputs_path.read_text().splitlines() if "=" in line)
        outputs_path.unlink()
        if "id" in step:
            context["steps"][step["id"]] = {"outputs": outputs}
        print(f"run_action: {name}: exit {code}", flush=True)
        status = status or code
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workflow", type=Path)
    parser.add_argument("--event", choices=("push", "pull_request"), required=True)
    parser.add_argument("--token", default="", help="what ${{ github.token }} is (empty: none)")
    parser.add_argument("--pr", default="", help="the pull request's number")
    parser.add_argument("--base", default="", help="the pull request's base commit")
    parser.add_argument("--branch", default="main", help="the branch pushed to (the default branch: main)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="INPUT=VALUE",
        help="replace an input the workflow gives (comment=false: posting needs GitHub)",
    )
    args = parser.parse_args()
    repo = args.workflow.resolve().parents[2]
    workflow = yaml.safe_load(args.workflow.read_text())
    (job,) = workflow["jobs"].values()
    (uses,) = [s for s in job["steps"] if ".github/actions/syncguard" in s.get("uses", "")]
    # A vendored copy (`syncguard init`: uses ./.github/actions/syncguard) is the repository's own; else this one's.
    action_dir = repo / ".github" / "actions" / "syncguard" if uses["uses"].startswith("./") else ACTION
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True).stdout
    event: dict[str, Any] = {"repository": {"default_branch": "main"}}
    if args.event == "pull_request":
        event["pull_request"] = {"number": args.pr, "base": {"sha": args.base}}
    context = {"github": {"action_path": str(action_dir), "event_name": args.event, "event": event, "token": args.token,
                          "ref_name": args.branch, "sha": sha.strip()}}  # fmt: skip
    action = yaml.safe_load((action_dir / "action.yml").read_text())
    inputs = {name: str(spec.get("default", "")) for name, spec in action["inputs"].items()}
    for name, value in (uses.get("with") or {}).items():
        if name not in inputs:
            raise SystemExit(f"run_action: {args.workflow}: the action has no input {name!r}")
        inputs[name] = substitute(str(value), context)
    for replaced in args.set:
        name, _, value = replaced.partition("=")
        if name not in inputs:
            raise SystemExit(f"run_action: --set {replaced}: the action has no input {name!r}")
        inputs[name] = value
    return run_steps(action, inputs, context, repo)


if __name__ == "__main__":
    sys.exit(main())
