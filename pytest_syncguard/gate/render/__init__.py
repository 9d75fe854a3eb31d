"""What renders the judged results: the terminal text, the PR comment's Markdown, JUnit properties and Perfetto
timeline files. Judging is the package above's."""
