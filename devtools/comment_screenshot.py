"""A PR comment as a reviewer sees it, drawn by headless Chromium: the comment's Markdown rendered by cmarkgfm (the
GitHub-flavoured Markdown library GitHub's own renderer is built on) in a page of GitHub's comment width and fonts,
screenshotted. A Mermaid block stays its source here (GitHub draws it with Mermaid's script, which this page does not
load). How docs/_static/pr-comment.png was made:

    python devtools/comment_screenshot.py report-cpu.md docs/_static/pr-comment.png
"""

from __future__ import annotations

import argparse
import html
import shutil
import subprocess
import tempfile
from pathlib import Path

import cmarkgfm  # type: ignore[import-untyped]

STYLE = """
body { font: 14px/1.5 -apple-system, "Segoe UI", "Noto Sans", Helvetica, Arial, sans-serif; color: #1f2328;
       margin: 0; padding: 16px; width: 780px; background: #fff; }
.comment { border: 1px solid #d1d9e0; border-radius: 6px; padding: 16px; }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; background: #eff1f3; padding: .1em .3em;
       border-radius: 4px; }
pre { background: #f6f8fa; padding: 12px; overflow: auto; border-radius: 6px; }
pre code { background: none; padding: 0; }
table { border-collapse: collapse; } td, th { border: 1px solid #d1d9e0; padding: 4px 8px; }
h3 { font-size: 16px; margin: 16px 0 8px; } h4 { font-size: 14px; }
ul { padding-left: 2em; }
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("markdown", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--height", type=int, default=1100, help="the window's height in pixels")
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        raise SystemExit("comment_screenshot: no Chromium on PATH")
    # Raw HTML kept, as GitHub keeps <details> (collapsed) and <summary>.
    unsafe = cmarkgfm.cmark.Options.CMARK_OPT_UNSAFE
    body = cmarkgfm.github_flavored_markdown_to_html(args.markdown.read_text(encoding="utf-8"), options=unsafe)
    page = f"<!doctype html><meta charset=utf-8><title>{html.escape(args.markdown.name)}</title>"
    page += f"<style>{STYLE}</style><div class=comment>{body}</div>"
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "comment.html"
        source.write_text(page, encoding="utf-8")
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--window-size=812,{args.height}", f"--screenshot={args.png.resolve()}", source.as_uri()],
                       check=True, capture_output=True, timeout=120)  # fmt: skip
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
