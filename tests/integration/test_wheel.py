"""The wheel, installed in a fresh venv, is one package: ``diagnose``, with its data files.

Builds the wheel from this checkout, installs it with pip into a new venv (no index: the wheel
alone; the dependencies come from this venv's site-packages through a path entry, which adds no
package of this project), and runs it from a folder outside the checkout, as ``pipx install .``
would: ``diagnose --help``, ``python -m diagnose --help``, an analysis that needs the package's data
(the report model, its vocabulary, the JSON schema), and the old top-level names are gone.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

PACKAGE_FOLDERS = ("analyzer", "collectors", "rules", "reports", "dashboard", "examples")
OOM = os.path.join(ROOT, "tests", "data", "oom", "oom_external_other_process_torch2_4.txt")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # built from a copy of what the build reads, never in the checkout: setuptools keeps build/lib
    # between builds, where a data file dropped from the package would still be found
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    for folder in PACKAGE_FOLDERS:
        shutil.copytree(os.path.join(ROOT, folder), src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(out), str(src)], check=True, timeout=300)
    (built,) = out.glob("diagnose-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    env = tmp_path_factory.mktemp("fresh") / "venv"
    venv.create(env, with_pip=True)
    py = env / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
                   check=True, timeout=300)
    own = subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                         capture_output=True, text=True).stdout.strip()
    # this venv's dependencies (pandas, psutil, …) as a plain path entry: its .pth files are not read,
    # so this checkout's editable install of diagnose stays out of the fresh venv
    Path(own, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return env


def _run(env: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(list(args), capture_output=True, text=True, cwd=cwd, env=clean, timeout=300)


def test_the_wheel_holds_one_top_level_package_and_its_data(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert {n.split("/")[0] for n in names} == {"diagnose", "diagnose-0.1.0.dist-info"}
    for data in ("diagnose/py.typed", "diagnose/diagnosis.schema.json", "diagnose/rules/report_model.json",
                 "diagnose/derive/report_vocabulary.txt", "diagnose/__main__.py",
                 "diagnose/collectors/nvml.py", "diagnose/dashboard/app.py", "diagnose/examples/service/server.py",
                 "diagnose/examples/data/t4_busy_util91_engine16_power_capped_ericsson.prom"):
        assert data in names, data
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    with zipfile.ZipFile(wheel) as zf:
        assert "diagnose = diagnose.cli:main" in zf.read(entry).decode()


def test_the_installed_wheel_runs_from_anywhere(fresh: Path, tmp_path: Path) -> None:
    bin_ = fresh / "bin"
    helped = _run(fresh, str(bin_ / "diagnose"), "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "analyze" in helped.stdout, helped.stderr
    as_module = _run(fresh, str(bin_ / "python"), "-m", "diagnose", "--help", cwd=tmp_path)
    assert as_module.returncode == 0 and as_module.stdout == helped.stdout, as_module.stderr

    where = _run(fresh, str(bin_ / "python"), "-c", "import diagnose, diagnose.rules; print(diagnose.__file__)",
                 cwd=tmp_path)
    assert where.stdout.strip().startswith(str(fresh)), where  # the wheel's copy, not this checkout
    for old in ("analyzer", "collectors", "rules", "reports", "dashboard", "examples"):
        gone = _run(fresh, str(bin_ / "python"), "-c", f"import {old}", cwd=tmp_path)
        assert gone.returncode != 0 and "ModuleNotFoundError" in gone.stderr, old

    # a real OOM message: the evidence parsers, the rules and the report model, all from the wheel
    judged = _run(fresh, str(bin_ / "diagnose"), "analyze", OOM, "--format", "json", cwd=tmp_path)
    assert judged.returncode == 0, judged.stderr
    doc = json.loads(judged.stdout)
    assert doc["candidates"][0]["category"] == "oom_external" and doc["schema"].startswith("diagnose")
    assert doc["probability"] is not None  # the calibrator's weights (rules/calibration.json) came with the wheel
