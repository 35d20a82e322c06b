"""The distribution lists every package folder, so a non-editable install ships them all."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = config["package-dir"]
    found = set()
    for package, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *relative)))
    assert sorted(config["packages"]) == sorted(found)


def test_console_script_points_at_the_dispatcher() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"pagedserve": "pagedserve.server.cli.main:main"}
    from pagedserve.server.cli.main import SUBCOMMANDS, main

    assert callable(main)
    assert set(SUBCOMMANDS) == {"generate", "serve", "batch", "bench"}
