"""`diagnose pack`: a session for a ticket, with secrets and request payloads gone from every file."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
import tarfile
from pathlib import Path

import pytest

from diagnose import pack, pipeline, session_io
from diagnose.cli import main
from diagnose.collectors import pyspy, snapshot
from diagnose.errors import InputError
from diagnose.redact import redact_text
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
    assert stacks > 10 and note["files"]["pyspy.raw"] == [f"command lines redacted ({stacks})"]
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
    packed = tmp_path / "packed.pickle"
    packed.write_bytes(files["gpu-incident/snapshot.pickle"])
    assert snapshot.load_breakdown(str(packed)) == snapshot.load_breakdown(str(folder / "snapshot.pickle"))
    note = json.loads(files["gpu-incident/pack.json"])
    actions = note["files"]["nsys-report.sqlite"]
    con = sqlite3.connect(folder / "nsys-report.sqlite")
    (env,) = con.execute("SELECT COUNT(*) FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT_VARIABLE'").fetchone()
    con.close()
    assert env > 30 and actions[0] == f"environment variables deleted ({env})"
    assert "captured stdout/stderr of the process redacted (2)" in actions
    assert set(note["left_out"]) == {"nsys-report.nsys-rep", "core.bin"}
    assert "environment" in note["left_out"]["nsys-report.nsys-rep"]
    assert note["files"]["snapshot.pickle"][0].startswith("copied (a CUDA memory snapshot")
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
    with pytest.raises(InputError, match="already exists and diagnose does not overwrite it without --force"):
        pack.pack(str(leaky))
    assert out.read_bytes() == before
    out.write_bytes(b"stale")
    assert pack.pack(str(leaky), force=True) == str(out)  # force: replaced by a whole new archive
    assert _members(out) and not list(tmp_path.glob(".pack-*"))
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
    assert len(err.strip().splitlines()) == 1 and str(out) in err and "--force" in err
    assert main(["pack", str(leaky), "-o", str(out), "--force"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
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


# -- each gap a reviewer found: plant the secret or prompt, pack, it is gone from every byte of every member,
#    and the packed session still diagnoses the same

def _assert_gone(archive: str | Path, needles: tuple[str, ...]) -> dict[str, bytes]:
    files = _members(Path(archive))
    for name, data in files.items():
        for needle in needles:
            assert needle.encode() not in data, (name, needle)
    return files


def _same_primary(folder: Path, archive: str) -> None:
    before = pipeline.analyze([str(folder)])
    assert before.primary is not None and pipeline.analyze([archive]).primary == before.primary


def test_every_process_of_a_subprocess_chain_is_redacted(leaky: Path) -> None:
    chain = ('process 1:"python -m launcher --token launcher-secret-1";process 2:"python worker.py --api-key '
             'worker-secret-2 --port 8000";thread (9): model-worker;run (worker.py:12);step (worker.py:40) 7\n')
    multiline = ('process 3:"python -c import os\nrun(os.environ) --password line-secret-3";thread (3): main;'
                 'f (x.py:1) 2\n')
    with (leaky / "pyspy.raw").open("a") as fh:
        fh.write(chain + multiline)
    out = pack.pack(str(leaky))
    files = _assert_gone(out, ("launcher-secret-1", "worker-secret-2", "line-secret-3"))
    raw = files["incident/pyspy.raw"].decode()
    assert 'process 1:"python -m launcher --token ***";process 2:"python worker.py --api-key *** --port 8000"' in raw
    sample = [s for s in pyspy.parse_raw(raw.splitlines(True)) if s.pid == 2]
    assert len(sample) == 1 and sample[0].count == 7 and sample[0].frames[-1].function == "step"
    _same_primary(leaky, out)


DOCKER_PROMPT = "DOCKER SECRET PROMPT about the merger"


def test_json_strings_get_the_log_line_cleaning(leaky: Path, tmp_path: Path) -> None:
    docker = [
        {"log": f"INFO 05-01 12:00:00 logger.py:39] Received request cmpl-9: prompt: '{DOCKER_PROMPT}', params: "
                "SamplingParams(n=1), prompt_token_ids: [9001, 9002, 9003], lora_request: None.\n",
         "stream": "stdout", "time": "2026-05-01T12:00:00.1Z"},
        {"msg": "starting engine --api-key docker-secret-1 --port 8000", "level": "info"},
        {"log": "vLLM API server args: ['serve', 'm', '--hf-token', 'docker-secret-2']\n", "stream": "stderr"},
    ]
    (leaky / "log-2-docker.log").write_text("".join(json.dumps(d) + "\n" for d in docker))
    _add_capture(leaky, "log", "log-2-docker.log")
    lines = (leaky / "process.jsonl").read_text().splitlines(True)
    rec = json.loads(lines[0])
    rec["processes"][0]["name"] = "python3 serve.py --token proc-secret-3"
    lines[0] = json.dumps(rec) + "\n"
    (leaky / "process.jsonl").write_text("".join(lines))
    nvml = (leaky / "nvml.jsonl").read_text().replace("NVML Shared Library Not Found",
                                                       "failed --auth-token nvml-secret-4")
    (leaky / "nvml.jsonl").write_text(nvml)
    secrets = ("docker-secret-1", "docker-secret-2", "proc-secret-3", "nvml-secret-4")
    files = _assert_gone(pack.pack(str(leaky)), (DOCKER_PROMPT, "9001, 9002", *secrets))
    first = json.loads(files["incident/log-2-docker.log"].decode().splitlines()[0])
    assert f"prompt: '<redacted {len(DOCKER_PROMPT)} chars>'" in first["log"]
    assert "prompt_token_ids: [<redacted 3 token ids>]" in first["log"] and first["stream"] == "stdout"
    assert json.loads(files["incident/process.jsonl"].decode().splitlines()[0])["processes"][0]["name"] == \
        "python3 serve.py --token ***"
    assert files["incident/process.jsonl"].decode().splitlines()[1] == lines[1].rstrip("\n")  # untouched lines stay
    _assert_gone(pack.pack(str(leaky), str(tmp_path / "keep.tar.gz"), keep_payloads=True), secrets)
    _same_primary(leaky, str(leaky) + ".tar.gz")


@pytest.mark.parametrize("line, kept", [
    ("INFO logger.py:39] Received request r: prompt: 'CUT SHORT PROMPT", "prompt: '<redacted 16 chars>"),
    ("INFO logger.py:39] Received request r: prompt: 'CUT SHORT PROMPT\n", "prompt: '<redacted 16 chars>\n"),
    ('{"text": "CUT SHORT PROMPT', '"text": "<redacted 16 chars>'),
    ("prompt: '', prompt_token_ids: [7, 8, 9", "prompt_token_ids: [<redacted 3 token ids>]"),
    ("INFO logger.py:39] Received request r: prompt: 'CUT SHORT\\", "prompt: '<redacted 10 chars>"),  # cut after a \\
    ("INFO logger.py:39] Received request r: prompt: 'CUT SHORT PROMPT\r\n", "prompt: '<redacted 16 chars>\r\n"),
    # the value ends with its line: the next line (a stats line, a traceback's next frame) is kept whole
    ("prompt_token_ids: [7, 8, 9\nINFO metrics.py:1] Avg prompt throughput: 5.0 tokens/s\n",
     "[<redacted 3 token ids>]\nINFO metrics.py:1] Avg prompt throughput: 5.0 tokens/s\n"),
    ("text: 'CUT SHORT PROMPT\nRuntimeError: CUDA error: out of memory\n",
     "'<redacted 16 chars>\nRuntimeError: CUDA error: out of memory\n"),
])
def test_a_line_cut_short_loses_its_prompt_too(line: str, kept: str) -> None:
    """A prompt whose closing quote (or a token list whose bracket) was never written — a log read while the
    service wrote it, a truncated paste — runs to the line's end and is removed as a closed one is."""
    count = pack._Counter()
    out = pack.clean_log_line(line, True, count)
    assert "CUT SHORT" not in out and "7, 8" not in out and out.endswith(kept) and count.payloads >= 1
    assert pack.clean_log_line(line, False, pack._Counter()) == line  # --keep-payloads keeps it as written


def test_json_keys_named_like_secrets(leaky: Path, tmp_path: Path) -> None:
    doc = {"HF_TOKEN": "k-secret-1", "GITHUB_TOKEN": "k-secret-2", "auth_token": "k-secret-3", "DB_PASS": "k-secret-4",
           "api-key": "k-secret-5", "env": {"clientSecret": "k-secret-6"}, "api_keys": ["k-secret-7", "k-secret-8"],
           "credentials": {"value": "k-secret-11", "expires": 3600},
           "max_tokens": 256, "prompt_tokens": 12, "input_tokens": 4096, "tokenizer": "gpt2", "model": "m"}
    (leaky / "log-3-app.jsonl").write_text(json.dumps(doc) + "\n")
    _add_capture(leaky, "log", "log-3-app.jsonl")
    info = json.loads((leaky / "process-info.json").read_text())
    info["env"] = {"DB_PASS": "k-secret-9", "OPENAI_API_KEY": "k-secret-10"}
    (leaky / "process-info.json").write_text(json.dumps(info, indent=2))
    secrets = tuple(f"k-secret-{i}" for i in range(1, 12))
    for keep in (True, False):
        out = pack.pack(str(leaky), str(tmp_path / f"k{keep}.tar.gz"), keep_payloads=keep)
        files = _assert_gone(out, secrets)
        got = json.loads(files["incident/log-3-app.jsonl"])
        assert all(got[k] == "***" for k in ("HF_TOKEN", "GITHUB_TOKEN", "auth_token", "DB_PASS", "api-key"))
        assert got["api_keys"] == ["***", "***"] and got["env"] == {"clientSecret": "***"}
        assert got["credentials"] == {"value": "***", "expires": 3600}
        assert {k: got[k] for k in ("max_tokens", "prompt_tokens", "input_tokens", "tokenizer", "model")} == \
            {"max_tokens": 256, "prompt_tokens": 12, "input_tokens": 4096, "tokenizer": "gpt2", "model": "m"}
        assert json.loads(files["incident/process-info.json"])["env"] == {"DB_PASS": "***", "OPENAI_API_KEY": "***"}
        _same_primary(leaky, out)


USER_PROMPT = "TOP SECRET user question about the quarterly numbers"


def test_copied_json_logs_keep_measurements_and_lose_every_long_string(leaky: Path, tmp_path: Path) -> None:
    rec = {"ts": 1796018610.5, "request_id": "req-7f3a9c1e-5b2d-4e8f-a1c6-0d9e8b7a6f5e", "level": "info",
           "model": "meta-llama/Meta-Llama-3.1-70B-Instruct", "latency_ms": 812.5, "queue_s": 0.25,
           "cached": False, "user_message": USER_PROMPT, "extra": {"question": f"again: {USER_PROMPT}"},
           "history": [f"earlier: {USER_PROMPT}", "ok"], "note": "short note"}
    compose = "vllm-1  | " + json.dumps({"event": "request", "body": f"{{'q': '{USER_PROMPT}'}}"})
    cut = json.dumps({"ts": 1.0, "user_message": USER_PROMPT})[:-12]  # a line cut short: no closing quote
    (leaky / "log-4-app.jsonl").write_text("\n".join([json.dumps(rec), compose, cut]) + "\n")
    _add_capture(leaky, "log", "log-4-app.jsonl")
    out = pack.pack(str(leaky))
    files = _assert_gone(out, (USER_PROMPT, USER_PROMPT[:40]))
    lines = files["incident/log-4-app.jsonl"].decode().splitlines()
    got = json.loads(lines[0])
    kept = ("ts", "request_id", "level", "model", "latency_ms", "queue_s", "cached", "note")
    assert {k: got[k] for k in kept} == {k: rec[k] for k in kept}
    assert got["user_message"] == f"<redacted {len(USER_PROMPT)} chars>"
    assert got["extra"]["question"].startswith("<redacted ") and got["history"][0].startswith("<redacted ")
    assert got["history"][1] == "ok"
    assert lines[1].startswith("vllm-1  | {") and json.loads(lines[1][10:])["event"] == "request"
    kept_all = _members(Path(pack.pack(str(leaky), str(tmp_path / "keep.tar.gz"), keep_payloads=True)))
    assert json.loads(kept_all["incident/log-4-app.jsonl"].decode().splitlines()[0]) == rec
    _same_primary(leaky, out)


def _evidence(path: str) -> tuple[list[str], dict[str, object]]:
    d = pipeline.analyze([path])
    return [f.code for f in d.findings], {e.key: e.value for e in d.evidence}


@pytest.mark.parametrize("demo", sorted(p.name for p in (Path(DATA) / "sessions").iterdir() if p.is_dir()))
def test_the_demo_sessions_diagnose_identically_after_packing(tmp_path: Path, demo: str) -> None:
    folder = tmp_path / demo
    shutil.copytree(Path(DATA) / "sessions" / demo, folder)
    assert _evidence(pack.pack(str(folder))) == _evidence(str(folder))


def test_real_logs_attached_to_a_session_diagnose_identically_after_packing(tmp_path: Path) -> None:
    """Every log fixture (engine logs, OOM messages, stage logs, benchmarks, compile logs, nvidia-smi, metrics),
    as `attach --log` copies it: the cleaning must not cost any evidence."""
    folder = tmp_path / "logs"
    shutil.copytree(Path(DATA) / "sessions" / "healthy_light_load_demo", folder)
    n = 0
    for kind in ("logs", "oom", "timing", "bench", "compile_logs", "nvsmi", "metrics"):
        for src in sorted((Path(DATA) / kind).iterdir()):
            if src.is_file() and src.suffix != ".md":
                if b"\x00" in src.read_bytes()[:8192]:
                    continue  # a real log with a NUL-filled hole: pack leaves binary-looking files out, named
                shutil.copyfile(src, folder / f"log-{n}-{src.name}")
                _add_capture(folder, "log", f"log-{n}-{src.name}")
                n += 1
    assert n > 30

    def evidence(path: str) -> tuple[list[str], dict[tuple[str, str], object]]:
        d = pipeline.analyze([path])
        return [f.code for f in d.findings], {(Path(e.source).name, e.key): e.value for e in d.evidence}

    before = evidence(str(folder))
    assert len(before[1]) > 150
    out = pack.pack(str(folder))
    assert evidence(out) == before
    files = _members(Path(out))
    note = json.loads(files["logs/pack.json"])["files"]
    for name in (p.name for p in folder.iterdir() if p.name.startswith("log-")):
        assert note[name] == ["no secret or payload found"], name  # no fixture holds a secret or a prompt…
        assert files[f"logs/{name}"] == (folder / name).read_bytes(), name  # …so each is kept byte for byte


GiB = 1 << 30


def test_probe_output_parses_identically_after_packing(tmp_path: Path) -> None:
    """The stage log and the allocator/OOM/compile lines the probe writes, in its own format."""
    folder = tmp_path / "probe-session"
    shutil.copytree(PREFILL, folder)
    dev = {"allocated_bytes.all.current": 9 * GiB, "allocated_bytes.all.peak": 20 * GiB,
           "reserved_bytes.all.current": 23 * GiB, "reserved_bytes.all.peak": 23 * GiB,
           "active_bytes.all.current": 9 * GiB, "inactive_split_bytes.all.current": 14 * GiB,
           "num_alloc_retries": 14, "num_ooms": 1, "free_bytes": GiB // 4, "total_bytes": 24 * GiB,
           "weights_bytes": 6 * GiB}
    state = {"devices": {"0": dev}, "alloc_conf": "garbage_collection_threshold:0.6,max_split_size_mb:128",
             "expandable_segments": False}
    message = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.50 GiB of which "
               "250.00 MiB is free. Of the allocated memory 9.00 GiB is allocated by PyTorch, and 14.00 GiB is "
               "reserved by PyTorch but unallocated.")
    records = [
        {"ts": 1796018609.5 + i, "request_id": f"7c1d2e3f-{i:04d}-4a5b-8c9d-0e1f2a3b4c5d", "status": "ok",
         "stages_ms": {"preprocess": 1.5, "queue": 20.0 + i, "prefill_long_stage_name": 100.0 * i, "decode": 300.0},
         "e2e_ms": 500.0 + 100 * i, "input_tokens": 500 * i, "output_tokens": 20, "ttft_ms": 150.0 + i,
         "customer_note": USER_PROMPT}  # a field the service added with req.set(): redacted
        for i in range(1, 9)
    ] + [
        {"ts": 1796018620.0, "cuda_memory": state},
        {"ts": 1796018621.0, "compile": {"counters": {"stats.unique_graphs": 3}, "delta": {}, "compiles": 3,
                                         "recompiles": 2, "recompile_limit_hits": 0,
                                         "recent_reasons": ["tensor 'L['x']' size mismatch at index 0. expected 4, "
                                                            "actual 8"], "compile_s": 12.5}},
        {"ts": 1796018622.0, "oom": {"message": message, "cuda_memory": state,
                                     "snapshot": "/var/log/svc/stages.jsonl.oom-1.pickle"}},
        {"ts": 1796018623.0, "probe": {"dropped": 0, "written": 12, "requests": 8, "service": "svc"}},
    ]
    (folder / "probe-0-stages.jsonl").write_text(
        "".join(json.dumps(r, separators=(", ", ": ")) + "\n" for r in records))  # the probe's writer
    _add_capture(folder, "probe", "probe-0-stages.jsonl")
    out = pack.pack(str(folder))
    packed = _assert_gone(out, (USER_PROMPT,))["probe-session/probe-0-stages.jsonl"].decode().splitlines()
    assert packed[0] == json.dumps({**records[0], "customer_note": f"<redacted {len(USER_PROMPT)} chars>"},
                                   separators=(", ", ": "))
    assert packed[8:] == [json.dumps(r, separators=(", ", ": ")) for r in records[8:]]  # nothing to clean: as written
    before = _evidence(str(folder))
    assert before[1]["mem.oom_count"] == 1 and before[1]["mem.allocated_bytes"] == 9 * GiB
    assert _evidence(out) == before


def test_only_pickles_the_restricted_unpickler_reads_as_snapshots_are_copied(leaky: Path, tmp_path: Path) -> None:
    import collections
    import pickle

    good = (Path(DATA) / "snapshots" / "oom_peak.pickle").read_bytes()
    (leaky / "snapshot.pickle").write_bytes(good + b"TRAILING pickle-secret-1")
    (leaky / "evil.pickle").write_bytes(pickle.dumps(collections.OrderedDict(k="pickle-secret-2"), protocol=4))
    (leaky / "env.pickle").write_bytes(pickle.dumps({"env": {"HF_TOKEN": "pickle-secret-3"}}, protocol=4))
    (leaky / "junk.bin").write_bytes(b"\x80 not a pickle pickle-secret-4")
    shutil.copyfile(Path(DATA) / "snapshots" / "malicious_os_system.pickle", leaky / "malicious.pickle")
    out = pack.pack(str(leaky))
    files = _assert_gone(out, tuple(f"pickle-secret-{i}" for i in range(1, 5)))
    note = json.loads(files["incident/pack.json"])
    assert set(note["left_out"]) == {"evil.pickle", "env.pickle", "junk.bin", "malicious.pickle"}
    assert all("not a CUDA memory snapshot" in why for why in note["left_out"].values())
    copied = tmp_path / "copied.pickle"
    copied.write_bytes(files["incident/snapshot.pickle"])
    want = tmp_path / "want.pickle"
    want.write_bytes(good)
    assert snapshot.load_breakdown(str(copied)) == snapshot.load_breakdown(str(want))
    _same_primary(leaky, out)


def test_sqlite_text_cells_are_redacted_whatever_the_column_type(leaky: Path) -> None:
    db = leaky / "extra.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE t (a VARCHAR(200), b, c BLOB, d INTEGER, e TEXT, n INTEGER)")
    con.execute("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)",
                ("OPENAI_API_KEY=db-secret-1", "Authorization: Bearer db-secret-2-abcdefgh",
                 b"HF_TOKEN=db-secret-3", "api_key=db-secret-4", "password=db-secret-5", 42))
    con.execute('CREATE TABLE "we""ird" ("col umn" VARCHAR)')
    con.execute('INSERT INTO "we""ird" VALUES (?)', ("token=db-secret-6",))
    con.commit()
    con.close()
    out = pack.pack(str(leaky))
    files = _assert_gone(out, tuple(f"db-secret-{i}" for i in range(1, 7)))
    packed = leaky.parent / "packed.sqlite"
    packed.write_bytes(files["incident/extra.sqlite"])
    con = sqlite3.connect(packed)
    row = con.execute("SELECT a, b, c, d, e, n, typeof(c) FROM t").fetchone()
    con.close()
    assert row == ("OPENAI_API_KEY=***", redact_text("Authorization: Bearer db-secret-2-abcdefgh"), b"HF_TOKEN=***",
                   "api_key=***", "password=***", 42, "blob")
    _same_primary(leaky, out)


def test_pack_dot_and_unwritable_outputs(leaky: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(leaky)
    assert main(["pack", "."]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "incident.tar.gz")
    assert {n.split("/")[0] for n in _members(tmp_path / "incident.tar.gz")} == {"incident"}
    assert pack.default_output(str(leaky) + "/") == str(tmp_path / "incident.tar.gz")
    for bad in ("/proc/x.tar.gz", "/proc/self/x.tar.gz"):
        assert main(["pack", str(leaky), "-o", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("diagnose: ") and "Traceback" not in err and "-o" in err, err

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tarfile, "open", full)
    assert main(["pack", str(leaky), "-o", str(tmp_path / "full.tar.gz")]) == 2
    err = capsys.readouterr().err
    assert "could not write" in err and "No space left on device" in err and "Traceback" not in err
    assert not list(tmp_path.glob(".pack-*")) and not (tmp_path / "full.tar.gz").exists()


def test_pack_note_wording_for_dropped_locals(leaky: Path) -> None:
    frame = {"name": "handle", "filename": "/srv/app.py", "line": 3, "locals": [{"name": "x", "repr": "'1'"}]}
    with (leaky / "pyspy-dumps.jsonl").open("a") as fh:
        fh.write(json.dumps({"ts": 1.0, "pid": 1, "threads": [{"thread_name": "w", "frames": [frame, frame]}]}) + "\n")
    note = json.loads(_members(Path(pack.pack(str(leaky))))["incident/pack.json"])
    assert note["files"]["pyspy-dumps.jsonl"] == ["local variables dropped (2 frames)"]
