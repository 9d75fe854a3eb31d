"""The results document and everything it holds: what a finished run says of each test (:mod:`.measured`), its
budgets' checks (:mod:`.budget`) and its comparison with a baseline (:mod:`.comparison`), read and written by
:mod:`.file`, earlier layouts upgraded by :mod:`.upgrades`. Below both the pytest side, which writes it, and the gate,
which reads it: nothing here imports either, nor torch."""
