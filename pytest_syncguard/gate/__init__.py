"""The CI side: ``syncguard`` (:mod:`.cli`), the report of a run (:mod:`.report`), the A/B on one runner (:mod:`.ab`),
the history's data branch (:mod:`.history_branch`), the forge a comment is posted to (:mod:`.forge`) and the
trusted workflow's post of an artifact (:mod:`.artifact`). It reads a run only through the results document
(:mod:`pytest_syncguard.document`), judges it with :mod:`pytest_syncguard.judge`, renders it with
:mod:`pytest_syncguard.render`, and imports nothing of the pytest side, nor torch: it runs on any CI machine."""
