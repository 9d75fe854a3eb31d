"""What renders judged results and documents: the terminal text, the PR comment's Markdown, JUnit properties,
Perfetto timeline files and the history's charts. Judging is :mod:`pytest_syncguard.judge`'s."""
