"""The manual against the code: the reference pages are what devtools/reference_docs.py makes from the code, every
Python example of the README and docs/ runs as the test it is (its outcome and the failure text shown after it
checked), and every ``pytest`` or ``syncguard`` command line shown uses options that exist. (The manual's Sphinx
build, warnings as errors, runs in .ci/run.)"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "devtools"))

import reference_docs  # noqa: E402

from pytest_syncguard.gate.cli import build_parser  # noqa: E402
from tests import warm  # noqa: E402

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
PAGES = [p for p in PAGES if "_build" not in p.parts]
BLOCK = re.compile(r"(?:<!-- docs-test: expect (?P<expect>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)


def _blocks(lang: str) -> list[tuple[str, str, str | None, str]]:
    """(page:line, body, expected outcomes, the text block right after) of each ``lang`` block."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        matches = list(BLOCK.finditer(text))
        for i, match in enumerate(matches):
            if match["lang"] != lang:
                continue
            after = matches[i + 1] if i + 1 < len(matches) else None
            shown = after["body"] if after is not None and after["lang"] == "text" else ""
            where = f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}"
            found.append((where, match["body"], match["expect"], shown))
    return found


def test_the_reference_pages_are_made_from_the_code() -> None:
    stale = [
        str(path.relative_to(ROOT))
        for path, text in reference_docs.render().items()
        if not path.is_file() or path.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"out of date with the code: {stale}; run python devtools/reference_docs.py"


PYTHON = _blocks("python")


def test_every_python_example_says_what_it_should_do() -> None:
    assert len(PYTHON) >= 3
    missing = [where for where, _, expect, _ in PYTHON if expect is None]
    assert not missing, f"python examples without <!-- docs-test: expect ... -->: {missing}"


@pytest.mark.parametrize(("where", "body", "expect", "shown"), PYTHON, ids=[b[0] for b in PYTHON])
def test_a_python_example_runs_as_shown(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, where: str, body: str, expect: str | None, shown: str
) -> None:
    """Written as test_decode.py (the name its failure text shows) and run; where a failure text follows the
    example, it is the run's whole failure text, line for line (a line the run prints and the page leaves out
    fails too)."""
    pytester.makepyfile(test_decode=body)
    # In a fresh process, as a user runs it: an in-process run's call sites would show this test's frame too, and a
    # run forked from the suite's warm server (tests/warm.py) the server's outermost frame.
    monkeypatch.setenv(warm.COLD, "1")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    outcomes = {key: int(value) for key, value in (item.split("=") for item in (expect or "").split())}
    result.assert_outcomes(**outcomes)
    out = result.stdout.str()
    if shown.startswith("syncguard:"):
        found = re.search(r"^_{3,} \S+ _{3,}\n(.*?)\n(?:=|_{3,} )", out, re.S | re.M)
        assert found is not None, f"{where}: no failure text in the run's output:\n{out}"
        assert found[1].strip() == shown.strip(), f"{where}: the page shows\n{shown}\nthe run printed\n{found[1]}"


SHELL = _blocks("bash")
PYTEST_OPTION = re.compile(r"--syncguard[\w-]*")


def _commands() -> list[tuple[str, list[str]]]:
    found = []
    for where, body, _, _ in SHELL:
        for line in body.splitlines():
            for part in re.split(r"&&|;", line):
                words = shlex.split(part.split(" #")[0])
                if words[:3] == ["python", "-m", "pytest"] or words[:1] == ["pytest"] or words[:1] == ["syncguard"]:
                    found.append((where, words))
    return found


def test_every_command_shown_uses_options_that_exist() -> None:
    from _pytest.config.argparsing import Parser

    from pytest_syncguard import plugin

    parser = Parser(_ispytest=True)
    plugin.pytest_addoption(parser)
    known = {name for option in parser.getgroup("syncguard").options for name in option.names()}
    commands = _commands()
    assert any(words[0] == "syncguard" for _, words in commands) and any("pytest" in words for _, words in commands)
    cli = build_parser()
    for where, words in commands:
        if words[0] == "syncguard":
            try:
                cli.parse_args(words[1:])
            except SystemExit:
                pytest.fail(f"{where}: `{shlex.join(words)}` is not a valid syncguard command line")
        else:
            unknown = [w.split("=")[0] for w in words if PYTEST_OPTION.fullmatch(w.split("=")[0]) and w.split("=")[0]
                       not in known]  # fmt: skip
            assert not unknown, f"{where}: unknown options {unknown} in `{shlex.join(words)}`"


def test_the_tutorials_allowed_sync_is_recorded_and_not_counted(pytester: pytest.Pytester) -> None:
    """The tutorial says what the results document holds of a sync inside ``syncguard.allow()``: as it says."""
    import json

    (where, body, _, _), *_ = [b for b in PYTHON if b[0].startswith("docs/tutorial.md") and "allow()" in b[1]]
    pytester.makepyfile(test_decode=body)
    result = pytester.runpytest_subprocess("--syncguard", "--syncguard-json", "results.json", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    (test,) = json.loads((pytester.path / "results.json").read_text())["tests"]
    assert (test["syncs"], test["allowed_syncs"]) == (0, 1), where
    tutorial = (ROOT / "docs" / "tutorial.md").read_text(encoding="utf-8")
    assert '`"syncs": 0` and `"allowed_syncs": 1`' in tutorial


def test_the_readmes_docs_command_installs_what_it_runs() -> None:
    """`python -m sphinx` alone failed on a fresh install (`No module named sphinx`): the README's command installs
    the `docs` extra first, and that extra holds what the manual's configuration loads."""
    import tomllib

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (command,) = re.findall(r"`([^`]*python -m sphinx[^`]*)`", readme)
    install, build = command.split(" && ")
    assert shlex.split(install) == ["bash", "tools/install.sh", "docs"]
    assert shlex.split(build)[:3] == ["python", "-m", "sphinx"]
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["docs"]
    names = {re.split(r"[<>=!~\[ ]", requirement)[0] for requirement in extra}
    conf = (ROOT / "docs" / "conf.py").read_text()
    assert {"sphinx", "myst-parser", "furo"} <= names
    assert "myst_parser" in conf and '"furo"' in conf
