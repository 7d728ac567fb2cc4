"""Open a session for reading, whether it is a folder or a packed ``.tar.gz``.

A packed session came from somebody else's machine (a ticket attachment), so it is untrusted:
only plain files and folders under relative paths are accepted (an absolute path, ``..``, a
link or a device refuses the whole archive), extraction runs with tarfile's ``data`` filter as a
second guard, with a cap on members and bytes, into a private temporary folder that is
removed when the ``with`` block ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterator

from diagnose.errors import InputError
from diagnose.units import size

MANIFEST = "manifest.json"
PACK_SUFFIXES = (".tar.gz", ".tgz")
MAX_MEMBERS = 10_000
MAX_UNPACKED_BYTES = 4 * 2**30


def label(path: str) -> str:
    """A session's short name: its folder's name, or its archive's name without ``.tar.gz``."""
    base = os.path.basename(os.path.abspath(path))  # `.` names the folder itself
    for suffix in PACK_SUFFIXES:
        base = base.removesuffix(suffix)
    return base


def is_packed(path: str) -> bool:
    return path.endswith(PACK_SUFFIXES) and os.path.isfile(path)


def is_session(path: str) -> bool:
    return is_packed(path) or (os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST)))


def require(path: str) -> None:
    """An ``InputError`` (one sentence and remedy) unless ``path`` is a session folder or .tar.gz."""
    if not is_session(path):
        with opened(path):  # raises the sentence that fits: no such path, no manifest, …
            pass


def _session_root(top: str, origin: str) -> str:
    if os.path.isfile(os.path.join(top, MANIFEST)):
        return top
    found = [os.path.join(top, d) for d in sorted(os.listdir(top))
             if os.path.isfile(os.path.join(top, d, MANIFEST))]
    if len(found) != 1:
        raise InputError(f"{origin} does not hold one diagnose session (no single folder with a manifest.json).",
                         "Pack the session folder itself: `diagnose pack SESSION`.")
    return found[0]


def _extract(path: str, dest: str) -> None:
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = []
            total = 0
            for member in tar:
                parts = member.name.replace("\\", "/").split("/")
                if member.name.startswith("/") or ".." in parts or not (member.isfile() or member.isdir()):
                    raise tarfile.TarError(f"it holds {member.name!r}, which is not a plain file inside the "
                                           "session folder (sessions hold no links, devices or paths outside)")
                members.append(member)
                total += max(0, member.size)
                if len(members) > MAX_MEMBERS or total > MAX_UNPACKED_BYTES:
                    raise InputError(f"{path} unpacks to more than {MAX_MEMBERS:,} files or "
                                     f"{size(MAX_UNPACKED_BYTES, 0)}, which no session does.",
                                     "Check that this is the file `diagnose pack` or `attach -o X.tar.gz` wrote.")
            tar.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path} is not a readable .tar.gz session ({exc}).",
                         "Pass the file `diagnose pack` or `attach -o X.tar.gz` wrote, or the session folder.") from exc


@contextlib.contextmanager
def opened(path: str) -> Iterator[str]:
    """Yield a folder holding the session's files (the folder itself, or a private extraction)."""
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, MANIFEST)):
            raise InputError(f"{path} is a folder without a manifest.json, so it is not a diagnose session.",
                             "Pass a session folder written by `diagnose attach` (or its .tar.gz).")
        yield path
        return
    if not os.path.exists(path):
        raise InputError(f"{path} does not exist.", "Check the path of the session folder or .tar.gz.")
    if not path.endswith(PACK_SUFFIXES):
        raise InputError(f"{path} is neither a session folder nor a packed session (.tar.gz).",
                         "Pass the folder `diagnose attach -o` wrote, or its .tar.gz.")
    tmp = tempfile.mkdtemp(prefix="diagnose-session-")
    try:
        _extract(path, tmp)
        yield _session_root(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def unpack_to(path: str, dest_parent: str) -> str:
    """Extract a packed session under ``dest_parent`` for as long as the caller keeps it; returns its folder."""
    tmp = tempfile.mkdtemp(prefix="session-", dir=dest_parent)
    _extract(path, tmp)
    return _session_root(tmp, path)
