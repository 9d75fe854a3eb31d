"""The judge: a run's results against their baselines and the history's levels (:mod:`.baselines`,
:mod:`.history`), one band of tolerance (:mod:`.comparison`), the run's comparison (:mod:`.run`), the chain of causes
of what moved (:mod:`.chain`), and the one verdict of a report (:mod:`.verdict`). Both programs stand on it: the pytest
side judges a test's baseline here, the CI side a run's. It imports neither, nor torch."""
