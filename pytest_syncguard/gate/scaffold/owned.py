"""Writing init's files without ever replacing one it did not write: a manifest in the repository keeps the hash of
each file as init wrote it, and a later run replaces only a file that is still exactly that."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ...files import write_atomically

#: init's record of what it wrote (path -> sha256 of the text written), at the repository's root.
MANIFEST = ".syncguard-init.json"


@dataclass(frozen=True)
class Outcome:
    path: str
    done: str  # "wrote", "updated", "unchanged", "removed" or "left alone"
    why: str = ""


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def apply(root: Path, files: dict[str, str], retired: tuple[str, ...] = ()) -> list[Outcome]:
    """Write ``files`` under ``root``: each new or still as init wrote it; any other left alone, and said. A
    ``retired`` file (the other choice's workflow) is removed where it is still as init wrote it."""
    manifest_path = root / MANIFEST
    owned: dict[str, str] = {}
    if manifest_path.is_file():
        try:
            owned = dict(json.loads(manifest_path.read_text(encoding="utf-8"))["files"])
        except (ValueError, KeyError, TypeError) as error:
            unread = f"{manifest_path}: not init's record of what it wrote ({error}): fix or remove it"
            raise ValueError(unread) from None
    outcomes = []
    for relative, text in files.items():
        path, data = root / relative, text.encode()
        if path.is_symlink() or (path.exists() and not path.is_file()):
            outcomes.append(Outcome(relative, "left alone", "not a regular file"))
            continue
        if path.exists():
            found = path.read_bytes()
            if found == data:
                owned[relative] = _digest(data)
                outcomes.append(Outcome(relative, "unchanged"))
                continue
            if owned.get(relative) != _digest(found):
                why = "edited since init wrote it" if relative in owned else "init did not write it"
                outcomes.append(Outcome(relative, "left alone", why))
                continue
        done = "updated" if path.exists() else "wrote"
        write_atomically(path, text)
        if relative.endswith(".sh"):
            path.chmod(0o755)
        owned[relative] = _digest(data)
        outcomes.append(Outcome(relative, done))
    for relative in retired:
        path = root / relative
        if not path.is_file() or path.is_symlink():
            continue
        if owned.get(relative) == _digest(path.read_bytes()):
            path.unlink()
            del owned[relative]
            outcomes.append(Outcome(relative, "removed", "replaced by the files above"))
        else:
            outcomes.append(Outcome(relative, "left alone", "edited since init wrote it: remove it yourself"))
    record = {"written_by": "syncguard init", "files": dict(sorted(owned.items()))}
    write_atomically(manifest_path, json.dumps(record, indent=2) + "\n")
    return outcomes
