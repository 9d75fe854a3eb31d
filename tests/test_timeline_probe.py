"""The timeline probe's switch of kineto's CUPTI teardown: on for a capture, restored on every exit path, and a
value set by others (the user before, torch for CUDA graphs before or inside) left alone. Runs without CUDA."""

from __future__ import annotations

import os

import pytest

from pytest_syncguard.probes.timeline import TEARDOWN, cupti_detached_afterwards


@pytest.fixture
def unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEARDOWN, raising=False)


@pytest.mark.usefixtures("unset")
def test_a_capture_detaches_cupti_and_restores_the_variable() -> None:
    with cupti_detached_afterwards():
        assert os.environ[TEARDOWN] == "1"
    assert TEARDOWN not in os.environ


@pytest.mark.usefixtures("unset")
def test_the_variable_is_restored_when_the_capture_raises() -> None:
    with pytest.raises(KeyboardInterrupt), cupti_detached_afterwards():
        raise KeyboardInterrupt
    assert TEARDOWN not in os.environ


@pytest.mark.parametrize("value", ["0", "1"])
def test_a_value_set_before_is_left_as_it_is(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(TEARDOWN, value)
    with cupti_detached_afterwards():
        assert os.environ[TEARDOWN] == value
    assert os.environ[TEARDOWN] == value


@pytest.mark.usefixtures("unset")
def test_a_value_set_inside_the_capture_is_kept() -> None:
    """torch sets ``TEARDOWN_CUPTI=0`` when it compiles CUDA graphs on a CUDA that cannot attach CUPTI again."""
    with cupti_detached_afterwards():
        os.environ[TEARDOWN] = "0"
    assert os.environ.pop(TEARDOWN) == "0"
