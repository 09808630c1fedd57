"""The package as users get it: one top-level package, the start-up file, one-way dependencies."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        cwd=out,
    )
    (whl,) = out.glob("rankwatch-*.whl")
    return whl


def test_rankwatch_is_the_only_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"rankwatch", "rankwatch-autoload.pth"}, tops
    for sub in ("hooks", "collector", "detector", "api"):
        assert f"rankwatch/{sub}/__init__.py" in names
    assert "rankwatch/collector/migrations/env.py" in names
    assert any(n.startswith("rankwatch/collector/migrations/versions/0001") for n in names)


def test_the_startup_file_does_nothing_without_the_variable(wheel: Path) -> None:
    pth = zipfile.ZipFile(wheel).read("rankwatch-autoload.pth").decode()
    assert pth.startswith("import os;") and "RANKWATCH" in pth and pth.count("\n") == 1


def _imports(code: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; {code}; print(' '.join(sorted(sys.modules)))"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    ).stdout.split()
    return set(out)


@pytest.mark.parametrize("module", ["rankwatch.collector", "rankwatch.detector", "rankwatch.api", "rankwatch.api.app"])
def test_the_service_never_imports_torch(module: str, tmp_path: Path) -> None:
    mods = _imports(f"import {module}", cwd=tmp_path)
    assert "torch" not in mods


def test_the_hooks_never_import_the_service(tmp_path: Path) -> None:
    mods = _imports(
        "import rankwatch.hooks.process_group, rankwatch.hooks.shipper, rankwatch.hooks.recorder", cwd=tmp_path
    )
    assert "torch" in mods
    for heavy in ("fastapi", "sqlalchemy", "uvicorn", "sklearn", "rankwatch.collector", "rankwatch.api"):
        assert heavy not in mods, heavy


def test_without_the_variable_nothing_is_imported_or_patched(tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKWATCH")}
    mods = _imports("import torch.distributed", env=env, cwd=tmp_path)
    assert not any(m.startswith("rankwatch") for m in mods)
    env["RANKWATCH"] = "http://127.0.0.1:9"
    mods = _imports("import torch.distributed", env=env, cwd=tmp_path)
    assert "rankwatch.hooks.process_group" in mods
    env["RANKWATCH"] = "0"
    mods = _imports("import torch.distributed", env=env, cwd=tmp_path)
    assert "rankwatch.hooks.process_group" not in mods
