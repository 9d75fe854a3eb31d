"""Where a PR's comment, its head and labels, and the links to lines and commits live: GitHub (:mod:`.github`)."""
