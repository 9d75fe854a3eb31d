"""A baseline file's size limit follows the suite: up to SMALL_FILE_BYTES any file is read, beyond it one that holds
at least one test per PER_TEST_BYTES (a large suite's), and none past MAX_FILE_BYTES; the limits made small here, the
file the project's writer makes from the committed H100 baseline's entries (bench/bench_baseline_scale.py writes a
20,000-test one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_syncguard.judge import baselines

SOURCE = baselines.read(Path(__file__).parents[1] / "baselines" / "nvidia-h100-80gb-hbm3.json")


def _file(folder: Path, count: int, padding: int = 0) -> Path:
    """A baseline file of ``count`` tests (the H100 file's, renamed), its fingerprint padded by ``padding`` bytes."""
    source = SOURCE
    assert source is not None
    names = sorted(source.tests)
    tests = {f"{names[i % len(names)]}[{i}]": source.tests[names[i % len(names)]] for i in range(count)}
    fingerprint = {**source.fingerprint, "note": "x" * padding}
    path = folder / f"{source.device}.json"
    path.write_text(baselines.document(source.device, fingerprint, tests))
    return path


def test_a_large_suites_file_is_read_and_a_large_file_of_few_tests_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(baselines, "SMALL_FILE_BYTES", 8 << 10)
    monkeypatch.setattr(baselines, "PER_TEST_BYTES", 2 << 10)
    monkeypatch.setattr(baselines, "MAX_FILE_BYTES", 256 << 10)
    many = _file(tmp_path, 200)
    assert 8 << 10 < many.stat().st_size < 200 * (2 << 10)
    found = baselines.read(many)
    assert found is not None and len(found.tests) == 200
    few = _file(tmp_path, 3, padding=20 << 10)
    size = few.stat().st_size
    with pytest.raises(baselines.BaselineError, match=rf"{size} bytes for 3 tests: beyond 0 MB .* at most 2 kB a test"):
        baselines.read(few)
    assert few.stat().st_size == size  # left as it is
    huge = _file(tmp_path, 2000)
    with pytest.raises(baselines.BaselineError, match=r"bytes, more than a baseline file holds"):
        baselines.read(huge)
