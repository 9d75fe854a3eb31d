"""The largest allocation sites of a real allocator snapshot (recorded on an H100, see tests/data/README.md)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from pytest_syncguard.analysis.snapshot import SnapshotError, allocation_sites, load
from pytest_syncguard.render.terminal import allocation_site_lines

SNAPSHOT = Path(__file__).parent / "data" / "grow24.memory.pickle.gz"


def test_sites_of_a_real_snapshot_agree_with_its_alloc_actions() -> None:
    snapshot = load(SNAPSHOT)
    allocs = [e for trace in snapshot["device_traces"] for e in trace if e["action"] == "alloc"]
    sites = allocation_sites(snapshot, internal=lambda filename: False)
    # Every allocation of the loop was made on its torch.cat line, the outermost frames being main and <module>.
    assert [s.site for s in sites] == ["/work/main/devtools/capture_snapshot.py:14 in grow"]
    (site,) = sites
    assert site.allocations == len(allocs) == 48  # 24 steps: one randn and one cat result each
    assert site.total_bytes == sum(e["size"] for e in allocs)
    assert site.largest_bytes == 8 * 24 * 4096 * 4  # the last cat result: 3 MiB
    lines = allocation_site_lines(sites)
    assert lines[1].split() == [
        "3.00",
        "MiB",
        "48",
        "x",
        f"{site.total_bytes / 2**20:.1f}",
        "MiB",
        "at",
        *site.site.split(),
    ]


def test_internal_frames_are_skipped_and_sites_ranked_by_largest_allocation() -> None:
    snapshot = load(SNAPSHOT)
    outer = allocation_sites(snapshot, internal=lambda filename: filename.endswith("capture_snapshot.py"))
    assert [s.site for s in outer] == ["?"]  # no frame outside the "internal" file
    made = {
        "device_traces": [
            [
                {"action": "alloc", "size": 10, "frames": [{"filename": "a.py", "line": 1, "name": "f"}]},
                {"action": "alloc", "size": 30, "frames": [{"filename": "b.py", "line": 2, "name": "g"}]},
                {"action": "free_completed", "size": 500, "frames": [{"filename": "c.py", "line": 3, "name": "h"}]},
                {"action": "alloc", "size": 20, "frames": [{"filename": "a.py", "line": 1, "name": "f"}]},
            ]
        ]
    }
    ranked = allocation_sites(made, internal=lambda filename: False)
    assert [(s.site, s.allocations, s.total_bytes, s.largest_bytes) for s in ranked] == [
        ("b.py:2 in g", 1, 30, 30),
        ("a.py:1 in f", 2, 30, 20),
    ]
    assert len(allocation_sites(made, internal=lambda filename: False, top=1)) == 1


def test_a_file_that_is_no_snapshot_is_an_error_naming_it(tmp_path: Path) -> None:
    truncated = tmp_path / "cut.memory.pickle.gz"
    truncated.write_bytes(SNAPSHOT.read_bytes()[:500])
    foreign = tmp_path / "other.pickle"
    foreign.write_bytes(pickle.dumps({"segments": []}))
    text = tmp_path / "text.pickle"
    text.write_text("not a pickle")
    for path in (truncated, foreign, text, tmp_path / "missing.pickle"):
        with pytest.raises(SnapshotError, match=str(path.name)):
            load(path)
