"""`diagnose pack`: a session for a ticket, with secrets and request payloads gone from every file."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
import tarfile
from pathlib import Path

import pytest

from analyzer import pipeline, session_io
from analyzer.cli import main
from analyzer.errors import InputError
from reports import pack
from tests.conftest import DATA

PREFILL = Path(DATA) / "sessions" / "prefill_long_prompts_demo"
NSYS_EXPORT = Path(DATA) / "nsys" / "pinned_copy_bound_vector_add_rtx4060ti_nsys2026_1.sqlite"

SECRETS = ("sk-ABCDEFGHIJKLMNOPQRSTUVWX1234", "s3cr3t-flag-value", "eyJhbGciSECRETBEARER123", "pa55word",
           "hf_ABCDEFGHIJKLMNOPQRSTUVWXYZ")
PROMPTS = ("TOP SECRET PROMPT", "SECRET MODEL OUTPUT", "101, 2023, 2003, 1037")


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def _write_manifest(folder: Path, doc: dict) -> None:
    doc["files"] = sorted({f for c in doc["captures"] for f in c["files"]})
    (folder / "manifest.json").write_text(json.dumps(doc, indent=2))


def _add_capture(folder: Path, collector: str, name: str) -> None:
    doc = _manifest(folder)
    doc["captures"].append({"collector": collector, "status": "ok", "reason": "", "remedy": "",
                            "window": doc["window"], "files": [name]})
    _write_manifest(folder, doc)


@pytest.fixture
def leaky(tmp_path: Path) -> Path:
    """The prefill demo session with secrets in its command lines and logs, and prompts in its logs."""
    folder = tmp_path / "incident"
    shutil.copytree(PREFILL, folder)
    doc = _manifest(folder)
    argv = doc["target"]["cmdline"] + ["--api-key", SECRETS[1], f"HF_TOKEN={SECRETS[4]}"]
    doc["target"]["cmdline"] = argv
    _write_manifest(folder, doc)
    info = json.loads((folder / "process-info.json").read_text())
    info["cmdline"] = argv
    (folder / "process-info.json").write_text(json.dumps(info, indent=2))
    raw = (folder / "pyspy.raw").read_text()
    (folder / "pyspy.raw").write_text(raw.replace("--stage-log", f"--api-key {SECRETS[1]} --stage-log"))
    lines = []
    for i, line in enumerate((folder / "log-0-stages.jsonl").read_text().splitlines()):
        rec = json.loads(line)
        rec["prompt"] = f"{PROMPTS[0]} number {i}"
        rec["output"] = {"text": PROMPTS[1]}
        lines.append(json.dumps(rec))
    (folder / "log-0-stages.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "log-1-vllm.log").write_text(
        "INFO 05-01 12:00:00 logger.py:39] Received request cmpl-1: prompt: 'TOP SECRET PROMPT about the "
        "launch', params: SamplingParams(n=1, temperature=0.0), prompt_token_ids: [101, 2023, 2003, 1037], "
        "lora_request: None.\n"
        f"DEBUG 05-01 12:00:01 client.py:9] Authorization: Bearer {SECRETS[2]}\n"
        f"DEBUG 05-01 12:00:01 client.py:9] OPENAI_API_KEY={SECRETS[0]}\n")
    _add_capture(folder, "log", "log-1-vllm.log")
    prom = (folder / "metrics-0.prom").read_text()
    (folder / "metrics-0.prom").write_text(prom.replace("http://127.0.0.1", f"http://admin:{SECRETS[3]}@127.0.0.1"))
    return folder


def _members(archive: Path) -> dict[str, bytes]:
    out = {}
    with tarfile.open(archive, "r:gz") as tar:
        for m in tar.getmembers():
            assert m.isfile() or m.isdir(), m.name  # no links, no devices
            assert not m.name.startswith(("/", "..")) and ".." not in m.name.split("/")
            assert m.uname == "" and m.uid == 0
            if m.isfile():
                fh = tar.extractfile(m)
                assert fh is not None
                out[m.name] = fh.read()
    return out


def test_the_fixture_does_leak(leaky: Path) -> None:
    blob = b"".join(p.read_bytes() for p in leaky.iterdir())
    assert all(s.encode() in blob for s in SECRETS) and all(p.encode() in blob for p in PROMPTS)


def test_secrets_and_prompts_are_gone_from_every_file(leaky: Path, tmp_path: Path) -> None:
    out = pack.pack(str(leaky))
    assert out == str(leaky) + ".tar.gz"
    files = _members(Path(out))
    assert set(files) == {f"incident/{p.name}" for p in leaky.iterdir()} | {"incident/pack.json"}
    for name, data in files.items():
        for secret in (*SECRETS, *PROMPTS):
            assert secret.encode() not in data, (name, secret)
    manifest = json.loads(files["incident/manifest.json"])
    assert manifest["target"]["cmdline"][-3:] == ["--api-key", "***", "HF_TOKEN=***"]
    assert b'--api-key *** --stage-log' in files["incident/pyspy.raw"]
    log = files["incident/log-1-vllm.log"].decode()
    assert "prompt: '<redacted 34 chars>'" in log and "prompt_token_ids: [<redacted 4 token ids>]" in log
    assert "Authorization: ***" in log and "OPENAI_API_KEY=***" in log
    stage = json.loads(files["incident/log-0-stages.jsonl"].decode().splitlines()[0])
    assert stage["prompt"] == "<redacted 26 chars>" and stage["output"].startswith("<redacted ")
    assert stage["input_tokens"] == 614 and stage["stages_ms"]["prefill"] == 151.956  # measurements stay
    note = json.loads(files["incident/pack.json"])
    assert note["payloads"] == "redacted" and note["secrets"] == "redacted" and note["left_out"] == {}
    assert note["files"]["log-1-vllm.log"] == ["secrets redacted (2 values)", "prompts/outputs redacted (2)"]
    assert note["files"]["log-0-stages.jsonl"] == ["prompts/outputs redacted (22)"]
    stacks = (leaky / "pyspy.raw").read_text().count("--api-key")
    assert stacks > 10 and note["files"]["pyspy.raw"] == [f"command lines redacted ({stacks} lines)"]
    assert "secrets redacted" in note["files"]["manifest.json"][0]


def test_keep_payloads_keeps_prompts_but_not_secrets(leaky: Path, tmp_path: Path) -> None:
    out = pack.pack(str(leaky), str(tmp_path / "with-prompts.tar.gz"), keep_payloads=True)
    files = _members(Path(out))
    blob = b"".join(files.values())
    for secret in SECRETS:
        assert secret.encode() not in blob, secret
    assert b"TOP SECRET PROMPT about the launch" in blob and PROMPTS[1].encode() in blob
    assert json.loads(files["incident/pack.json"])["payloads"] == "kept"  # the folder keeps the session's name


def test_the_packed_session_diagnoses_the_same(leaky: Path) -> None:
    before = pipeline.analyze([str(leaky)])
    after = pipeline.analyze([pack.pack(str(leaky))])
    assert before.primary is not None and after.primary == before.primary
    assert [f.code for f in after.findings] == [f.code for f in before.findings]
    values = {e.key: e.value for e in after.evidence}
    for e in before.evidence:
        if e.key.startswith(("latency.", "stage.", "tokens.", "serving.")):
            assert values[e.key] == e.value, e.key


def _nsys_session(tmp_path: Path) -> Path:
    folder = tmp_path / "gpu-incident"
    shutil.copytree(PREFILL, folder)
    db = folder / "nsys-report.sqlite"
    shutil.copyfile(NSYS_EXPORT, db)
    con = sqlite3.connect(db)
    con.execute("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', ?)",
                (f'OPENAI_API_KEY="{SECRETS[0]}"',))
    con.execute("UPDATE META_DATA_CAPTURE SET value = value || ? WHERE name = 'PROCESS_0:COMMAND'",
                (f" --api-key {SECRETS[1]}",))
    con.execute("UPDATE StringIds SET value = ? WHERE id = 21", (f"user said: {PROMPTS[0]}",))
    con.commit()
    con.close()
    _add_capture(folder, "nsys", "nsys-report.sqlite")
    (folder / "nsys-report.nsys-rep").write_bytes(b"\x00NSYS" + SECRETS[0].encode())
    (folder / "core.bin").write_bytes(b"\x00\x01" + SECRETS[1].encode())
    shutil.copyfile(Path(DATA) / "snapshots" / "oom_peak.pickle", folder / "snapshot.pickle")
    return folder


def test_nsight_exports_are_cleaned_not_dropped(tmp_path: Path) -> None:
    folder = _nsys_session(tmp_path)
    assert SECRETS[0].encode() in (folder / "nsys-report.sqlite").read_bytes()
    out = pack.pack(str(folder))
    files = _members(Path(out))
    db = files["gpu-incident/nsys-report.sqlite"]
    for secret in (SECRETS[0], SECRETS[1], PROMPTS[0]):
        assert secret.encode() not in db, secret
    assert "gpu-incident/nsys-report.nsys-rep" not in files and "gpu-incident/core.bin" not in files
    assert files["gpu-incident/snapshot.pickle"] == (folder / "snapshot.pickle").read_bytes()
    note = json.loads(files["gpu-incident/pack.json"])
    actions = note["files"]["nsys-report.sqlite"]
    con = sqlite3.connect(folder / "nsys-report.sqlite")
    (env,) = con.execute("SELECT COUNT(*) FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT_VARIABLE'").fetchone()
    con.close()
    assert env > 30 and actions[0] == f"environment variables deleted ({env})"
    assert "captured stdout/stderr of the process redacted (2)" in actions
    assert set(note["left_out"]) == {"nsys-report.nsys-rep", "core.bin"}
    assert "environment" in note["left_out"]["nsys-report.nsys-rep"]
    assert note["files"]["snapshot.pickle"][0].startswith("copied as is")
    # the GPU evidence survives the cleaning
    before = {e.key: e.value for e in pipeline.analyze([str(folder)]).evidence if e.source.endswith(".sqlite")}
    after = {e.key: e.value for e in pipeline.analyze([out]).evidence if e.source.endswith(".sqlite")}
    assert len(before) > 20 and after == before


def test_symlinks_in_a_session_are_left_out(leaky: Path) -> None:
    (leaky / "passwd").symlink_to("/etc/passwd")
    files = _members(Path(pack.pack(str(leaky))))
    assert "incident/passwd" not in files
    assert json.loads(files["incident/pack.json"])["left_out"] == {"passwd": "a symbolic link"}


def test_refuses_to_overwrite_and_bad_outputs(leaky: Path, tmp_path: Path) -> None:
    out = Path(pack.pack(str(leaky)))
    before = out.read_bytes()
    with pytest.raises(InputError, match="already exists and diagnose pack does not overwrite files"):
        pack.pack(str(leaky))
    assert out.read_bytes() == before
    with pytest.raises(InputError, match="does not exist"):
        pack.pack(str(leaky), str(tmp_path / "no" / "such" / "x.tar.gz"))
    with pytest.raises(InputError, match=r"does not end in \.tar\.gz"):
        pack.pack(str(leaky), str(tmp_path / "x.zip"))
    with pytest.raises(InputError, match="already packed"):
        pack.pack(str(out))
    with pytest.raises(InputError, match="does not exist"):
        pack.pack(str(tmp_path / "nothing-here"))
    assert not list(tmp_path.glob(".pack-*"))  # no partial archive left behind


def test_a_packed_session_can_be_cleaned_again(leaky: Path, tmp_path: Path) -> None:
    first = pack.pack(str(leaky), str(tmp_path / "raw.tar.gz"), keep_payloads=True)
    second = pack.pack(first, str(tmp_path / "clean.tar.gz"))
    files = _members(Path(second))
    assert b"TOP SECRET PROMPT" not in b"".join(files.values())
    assert set(json.loads(files["raw/pack.json"])["files"]) == {p.name for p in leaky.iterdir()}


def _append(archive: Path, member: tarfile.TarInfo, out: Path, data: bytes = b"x") -> Path:
    with tarfile.open(archive, "r:gz") as src, tarfile.open(out, "w:gz") as dst:
        for m in src.getmembers():
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
        member.size = len(data) if member.isfile() else 0
        dst.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return out


@pytest.mark.parametrize("kind", ["dotdot", "symlink"])
def test_a_tampered_pack_is_refused(leaky: Path, tmp_path: Path, kind: str) -> None:
    good = Path(pack.pack(str(leaky)))
    victim = tmp_path / "victim.txt"
    if kind == "dotdot":
        member = tarfile.TarInfo("incident/../../victim.txt")
    else:
        member = tarfile.TarInfo("incident/log-9.txt")
        member.type = tarfile.SYMTYPE
        member.linkname = str(victim)
    evil = _append(good, member, tmp_path / "evil.tar.gz")
    with pytest.raises(InputError, match=r"not a readable \.tar\.gz session"), session_io.opened(str(evil)):
        pass
    assert main(["report", str(evil)]) == 2
    assert not victim.exists()


def test_cli_pack(leaky: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ticket.tar.gz"
    assert main(["pack", str(leaky), "-o", str(out)]) == 0
    stdout, err = capsys.readouterr()
    assert stdout.strip() == str(out)
    assert "secrets and request payloads redacted" in err and "pack.json" in err
    assert main(["pack", str(leaky), "-o", str(out)]) == 2
    _, err = capsys.readouterr()
    assert err.startswith("diagnose: ") and "already exists" in err and "Traceback" not in err
    assert main(["pack", str(leaky), "-o", str(tmp_path / "keep.tar.gz"), "--keep-payloads"]) == 0
    assert "request payloads kept" in capsys.readouterr().err


def test_pyspy_dump_locals_are_dropped_or_hidden(leaky: Path, tmp_path: Path) -> None:
    frame = {"name": "handle", "filename": "/srv/app.py", "line": 3,
             "locals": [{"name": "api_key", "repr": f"'{SECRETS[1]}'"},
                        {"name": "prompt", "repr": f"'{PROMPTS[0]}'"}]}
    dump = {"ts": 1.0, "pid": 1, "threads": [{"thread_name": "w", "frames": [frame]}]}
    with (leaky / "pyspy-dumps.jsonl").open("a") as fh:
        fh.write(json.dumps(dump) + "\n")
    files = _members(Path(pack.pack(str(leaky))))
    last = json.loads(files["incident/pyspy-dumps.jsonl"].decode().splitlines()[-1])
    assert last["threads"][0]["frames"][0]["locals"] is None
    assert last["threads"][0]["frames"][0]["name"] == "handle"  # the stack itself stays
    kept = _members(Path(pack.pack(str(leaky), str(tmp_path / "k.tar.gz"), keep_payloads=True)))
    local_vars = json.loads(kept["incident/pyspy-dumps.jsonl"].decode().splitlines()[-1])["threads"][0]["frames"][0]
    assert local_vars["locals"] == [{"name": "api_key", "repr": "***"}, {"name": "prompt", "repr": f"'{PROMPTS[0]}'"}]
