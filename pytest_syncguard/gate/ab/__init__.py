"""``syncguard ab``: the plan of rounds (:mod:`.plan`), the pytest processes of each side (:mod:`.sides`) and the
statistics that judge a timing from its rounds (:mod:`.stats`). The side's end of the pipe is the pytest side's
(:mod:`pytest_syncguard.ab_worker`); the words both ends speak are :mod:`pytest_syncguard.ab_channel`."""
