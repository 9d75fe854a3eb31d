"""The CI side: a run's results judged against baselines (:mod:`.baselines`, :mod:`.comparison`, :mod:`.run`) and
A/B on one runner (:mod:`.ab`), the chain of causes of what regressed (:mod:`.chain`), and what renders them
(:mod:`.render`: the terminal, the PR comment, JUnit, Perfetto files), posted by :mod:`.comment`, driven by the
``syncguard`` command (:mod:`.cli`). It reads a run only through the results document (:mod:`..document`) and
imports nothing of the pytest side, nor torch: it runs on any CI machine."""
