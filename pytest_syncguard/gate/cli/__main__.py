"""``python -m pytest_syncguard.gate.cli``: the ``syncguard`` command."""

from . import main

if __name__ == "__main__":
    raise SystemExit(main())
