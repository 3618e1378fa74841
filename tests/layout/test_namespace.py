"""One import namespace, checked on a real install: the project's wheel unpacked into a fresh virtual
environment (its dependencies reached through a path file, so nothing is downloaded) exposes tuner.db,
tuner.api and tuner.kernels with the search spaces as package data, and no top-level db, api or kernels."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import importlib.util, sys
import tuner, tuner.db, tuner.api.main
from tuner import registry
assert tuner.__file__.startswith(sys.prefix), tuner.__file__
for name in registry.names():
    template = registry.get(name)
    assert template.space_path.is_file(), template.space_path
    template.space()
missing = [m for m in ("db", "api", "kernels", "search_spaces") if importlib.util.find_spec(m) is not None]
assert not missing, missing
store = tuner.db.Store.open("sqlite:///" + sys.argv[1])  # the migrations are package data too
store.count_jobs()
print("namespace ok")
"""


@pytest.mark.slow
def test_an_installed_wheel_has_one_namespace(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
         str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = wheels.glob("tuner-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"tuner", wheel.name.split("-py3")[0] + ".dist-info"}
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    zipfile.ZipFile(wheel).extractall(site)
    run = subprocess.run([python, "-c", CHECK, str(tmp_path / "t.db")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "namespace ok" in run.stdout
