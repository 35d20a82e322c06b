"""One package folder, ``pagedserve/``, found by setuptools' discovery: every subpackage ships."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parent.parent


def test_discovery_finds_every_package_folder() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = config["packages"]["find"]["include"]
    found = set(find_packages(str(ROOT), include=include))
    folders = {".".join(init.parent.relative_to(ROOT).parts)
               for init in (ROOT / "pagedserve").rglob("__init__.py")}
    assert found == folders
    assert "pagedserve.server.engine" in found


def test_every_package_folder_has_an_init() -> None:
    # A folder of modules without __init__.py would be left out of the wheel.
    missing = [str(folder.relative_to(ROOT)) for folder in (ROOT / "pagedserve").rglob("*")
               if folder.is_dir() and folder.name not in ("__pycache__", "csrc")
               and any(folder.glob("*.py")) and not (folder / "__init__.py").is_file()]
    assert missing == []


def test_import_pagedserve_from_the_checkout() -> None:
    code = "import pagedserve, sys; print(pagedserve.__file__); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60, cwd=ROOT)
    path, torch_loaded = done.stdout.split()
    assert Path(path) == ROOT / "pagedserve" / "__init__.py"
    assert torch_loaded == "False"  # LLM and torch load on first use


def test_python_dash_m_runs_the_command() -> None:
    done = subprocess.run([sys.executable, "-m", "pagedserve", "--version"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pagedserve ")


def test_console_script_points_at_the_dispatcher() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"pagedserve": "pagedserve.cli.main:main"}
    from pagedserve.cli.main import SUBCOMMANDS, main

    assert callable(main)
    assert set(SUBCOMMANDS) == {"generate", "serve", "batch", "bench", "router"}
