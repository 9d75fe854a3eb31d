"""Sphinx configuration of the pytest-syncguard manual (Markdown pages through MyST).

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (what .ci/run runs; warnings fail it)."""

project = "pytest-syncguard"
author = "the pytest-syncguard developers"
copyright = "2026, the pytest-syncguard developers (MIT license)"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
html_theme = "furo"
html_title = "pytest-syncguard"
# Code blocks written as ```text hold terminal output and usage lines, not code to highlight.
highlight_language = "none"
