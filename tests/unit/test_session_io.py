"""Sessions open from a folder or a packed .tar.gz; a hostile archive is refused, never extracted outside."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from diagnose import pipeline, session_io
from diagnose.cli import main
from diagnose.errors import InputError

SESSIONS = Path(__file__).resolve().parent.parent / "data" / "sessions"
PREFILL = SESSIONS / "prefill_long_prompts_demo"


def _pack(folder: Path, out: Path, arcname: str | None = None) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        tar.add(folder, arcname=arcname or folder.name)
    return out


def test_packed_session_analyzes_like_the_folder(tmp_path: Path) -> None:
    packed = _pack(PREFILL, tmp_path / "s.tar.gz")
    a = pipeline.analyze([str(PREFILL)])
    b = pipeline.analyze([str(packed)])
    assert b.primary is not None and a.primary is not None
    assert b.primary.value == a.primary.value == "prefill_ttft"
    assert [f.code for f in b.findings] == [f.code for f in a.findings]
    assert b.target == a.target


def test_extraction_is_removed_after_use(tmp_path: Path) -> None:
    packed = _pack(PREFILL, tmp_path / "s.tgz")
    with session_io.opened(str(packed)) as folder:
        assert os.path.isfile(os.path.join(folder, "manifest.json"))
        seen = folder
    assert not os.path.exists(seen)


def test_a_pack_of_the_files_without_the_folder_opens(tmp_path: Path) -> None:
    packed = _pack(PREFILL, tmp_path / "flat.tar.gz", arcname=".")
    with session_io.opened(str(packed)) as folder:
        assert os.path.isfile(os.path.join(folder, "manifest.json"))


def _evil(tmp_path: Path, member: tarfile.TarInfo, data: bytes = b"x") -> Path:
    out = tmp_path / "evil.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        manifest = (PREFILL / "manifest.json").read_bytes()
        ok = tarfile.TarInfo("s/manifest.json")
        ok.size = len(manifest)
        tar.addfile(ok, io.BytesIO(manifest))
        member.size = len(data) if member.isfile() else 0
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return out


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink_out"])
def test_hostile_archives_are_refused_and_write_nothing_outside(tmp_path: Path, kind: str) -> None:
    victim = tmp_path / "victim.txt"
    if kind == "dotdot":
        member = tarfile.TarInfo("s/../../victim.txt")
    elif kind == "absolute":
        member = tarfile.TarInfo(str(victim))
    else:
        member = tarfile.TarInfo("s/link")
        member.type = tarfile.SYMTYPE
        member.linkname = str(victim)
    packed = _evil(tmp_path, member)
    with pytest.raises(InputError) as err, session_io.opened(str(packed)):
        pass
    assert "not a readable .tar.gz session" in str(err.value)
    assert not victim.exists()


def test_not_a_tarball_is_one_sentence_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bogus = tmp_path / "broken.tar.gz"
    bogus.write_bytes(b"this is not gzip")
    assert main(["analyze", str(bogus)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diagnose: ") and "not a readable .tar.gz session" in err
    assert "Traceback" not in err


def test_archive_without_a_session_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "other.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        info = tarfile.TarInfo("notes/readme.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    with pytest.raises(InputError, match="does not hold one diagnose session"), session_io.opened(str(out)):
        pass


def test_folder_without_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"without a manifest\.json"), session_io.opened(str(tmp_path)):
        pass


def test_a_corrupted_archive_is_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    packed = _pack(PREFILL, tmp_path / "s.tar.gz")
    blob = bytearray(packed.read_bytes())
    for i in range(200, len(blob) - 200, 997):  # flip bytes inside the deflate stream
        blob[i] ^= 0x5A
    packed.write_bytes(bytes(blob))
    assert main(["report", str(packed)]) == 2
    err = capsys.readouterr().err
    assert "not a readable .tar.gz session" in err and "Traceback" not in err


def test_a_file_missing_from_the_session_costs_only_its_capture(tmp_path: Path) -> None:
    """A truncated archive or a copied folder without pyspy.raw: the rest is still diagnosed."""
    import shutil

    folder = tmp_path / "s"
    shutil.copytree(PREFILL, folder)
    (folder / "pyspy.raw").unlink()
    (folder / "process.jsonl").write_text('{"ts": "soon", "processes": 7}\n')
    d = pipeline.analyze([str(folder)])
    assert d.primary is not None and d.primary.value == "prefill_ttft"  # from the stage log and metrics
    failed = {os.path.basename(i.path): i.reason for i in d.inputs if i.status == "failed"}
    assert "missing from the session" in failed["pyspy.raw"]
    assert "could not be read" in failed["process.jsonl"]
    assert any("missing from the session" in s.reason for s in d.skipped)  # CPU rules say why they could not run


@pytest.mark.parametrize("manifest", ["[]", '{"schema": "diagnose/session/v1", "target": null, "window": {}}', "{"])
def test_a_broken_manifest_is_one_sentence_naming_the_archive(
        tmp_path: Path, manifest: str, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "manifest.json").write_text(manifest)
    packed = _pack(folder, tmp_path / "s.tar.gz")
    for path in (folder, packed):
        assert main(["analyze", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"{path} is not a readable diagnose session" in err and "Traceback" not in err
        assert "diagnose-session-" not in err  # never the private extraction folder


def test_a_secret_left_in_a_manifest_never_reaches_a_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import shutil

    folder = tmp_path / "s"
    shutil.copytree(PREFILL, folder)
    doc = json.loads((folder / "manifest.json").read_text())
    doc["target"]["cmdline"] += ["--api-key", "s3cr3t-value-42", "HF_TOKEN=hf_abcdefghijklmnopqrstuvwx"]
    (folder / "manifest.json").write_text(json.dumps(doc))
    for fmt in ("json", "md", "html"):
        assert main(["report", str(folder), "--format", fmt]) == 0
        out = capsys.readouterr().out
        assert "s3cr3t-value-42" not in out and "hf_abcdefghij" not in out
        assert "--api-key" in out
