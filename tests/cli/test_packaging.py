"""A regular install works: the wheel, installed (not editable) into a fresh venv, runs what a
new user runs on the demo collection, and every file the package reads at run time ships.

The venv sees the test environment's third-party packages (`--system-site-packages`, so no
dependency is downloaded or built), but not this checkout: the wheel is built from a copy of
the package folders, the commands run outside the repository with no PYTHONPATH, and a driver
records where every imported `specreg` module came from. The editable install's finder sits
behind the venv's own site-packages on the import path; the driver proves it never served a
module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support import REPO

TARGET = "Qwen2.5 Coder 32B Instruct"
DRAFT = "Qwen2.5 Coder 0.5B Instruct"

# Runs one specreg command in the venv's interpreter, then writes the files of every specreg
# module it imported (so a module served from the checkout cannot go unnoticed).
DRIVER = """\
import json, sys
from specreg.cli.main import main
out, sys.argv = sys.argv[1], ["specreg", *sys.argv[2:]]
try:
    main()
finally:
    files = {n: getattr(m, "__file__", None) for n, m in list(sys.modules.items())
             if n == "specreg" or n.startswith("specreg.")}
    with open(out, "w") as f:
        json.dump(files, f)
"""


def _package_dirs() -> dict[str, Path]:
    """Package -> source folder: `specreg` and each design-card folder it links to as a part."""
    top = REPO / "specreg"
    parts = {f"specreg.{link.name}": link.resolve() for link in top.iterdir() if link.is_symlink()}
    return {"specreg": top, **parts}


def _copy_sources(dst: Path) -> None:
    """What a source distribution holds: pyproject, README and the package folders."""
    dst.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dst / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in _package_dirs().values():
        shutil.copytree(folder, dst / folder.name, symlinks=True, ignore=skip)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    _copy_sources(root / "src")
    out = root / "wheelhouse"
    # The build backend pyproject names (setuptools>=68, with wheel) is in the test extras, so
    # the build needs no index: pip's isolated build env would only install that same backend.
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    build += ["--no-index", "-q", "-w", str(out)]
    proc = subprocess.run(
        [*build, str(root / "src")],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (found,) = out.glob("specreg-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(root)],
        check=True,
    )
    python = root / "bin" / "python"
    # No index: every dependency must already be satisfied by what the venv sees, so the
    # wheel's declared requirements are checked without downloading anything.
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-index", "-q", str(wheel)],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return root


def test_every_data_file_of_the_package_folders_ships(wheel: Path) -> None:
    """Templates, static files, CSVs, prompt sets ...: whatever sits next to the code ships."""
    expected = set()
    for package, base in _package_dirs().items():
        for folder, dirs, files in os.walk(base):  # links to the parts are walked as parts
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            rel = Path(folder).relative_to(base).parts
            for name in files:
                if not name.endswith(".pyc"):
                    expected.add("/".join((*package.split("."), *rel, name)))
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert sorted(expected - shipped) == []


class Venv:
    def __init__(self, root: Path, work: Path, home: Path) -> None:
        self.root, self.work = root, work
        self.driver = work / "driver.py"
        self.driver.write_text(DRIVER)
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        self.env.update(SPECREG_HOME=str(home), COLUMNS="200", VIRTUAL_ENV=str(root))
        self.env["PATH"] = f"{root / 'bin'}{os.pathsep}{self.env.get('PATH', '')}"
        self.imported: dict[str, str | None] = {}

    def specreg(self, *args: str, expect: int = 0) -> str:
        record = self.work / "imported.json"
        proc = subprocess.run(
            [str(self.root / "bin" / "python"), str(self.driver), str(record), *args],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
        )
        assert proc.returncode == expect, (args, proc.stdout[-2000:], proc.stderr[-2000:])
        self.imported.update(json.loads(record.read_text()))
        return proc.stdout


def test_a_regular_install_runs_the_demo_workflow(venv: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    v = Venv(venv, work, tmp_path / "home")
    site_packages = next((venv / "lib").glob("python3*/site-packages"))

    out = v.specreg("demo", "demo")
    assert "next: specreg scan demo" in out
    v.specreg("scan", "demo")
    v.specreg("compat", TARGET, DRAFT)
    assert DRAFT in v.specreg("drafts", TARGET)
    doc = json.loads(v.specreg("recommend", TARGET, "--bandwidth", "20", "--json"))
    assert doc["kind"] == "recommendation" and doc["options"][0]["method"] == "draft"
    v.specreg("report", "-o", "site")
    assert (work / "site" / "matrix.html").stat().st_size > 1000
    ids = {
        name: json.loads(v.specreg("show", name, "--json"))["model"]["model_id"]
        for name in (TARGET, DRAFT)
    }
    (work / "specreg.yaml").write_text(
        "version: 1\n"
        "llama: {dialect: current}\n"
        f"models:\n  {ids[TARGET]}: {{aliases: [coder32]}}\n"
        f"  {ids[DRAFT]}: {{aliases: [coder-draft]}}\n"
        "roles:\n  coder:\n    target: coder32\n"
        "    configs: {default: {draft: coder-draft, draft_max: 16}}\n"
    )
    script = v.specreg("export", "--format", "llama-server")
    assert "--spec-draft-n-max 16" in script and "run_coder()" in script

    # Every specreg module any command imported came from the installed wheel.
    assert "specreg.reports.site" in v.imported and "specreg.recommender.prior" in v.imported
    elsewhere = {
        name: file
        for name, file in v.imported.items()
        if file is None or not Path(file).is_relative_to(site_packages / "specreg")
    }
    assert elsewhere == {}
    direct_url = next(site_packages.glob("specreg-*.dist-info")) / "direct_url.json"
    assert not json.loads(direct_url.read_text()).get("dir_info", {}).get("editable")
