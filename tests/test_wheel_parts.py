"""scripts/wheel_parts.py: a wheel split into parts and put back together by the device's ``install.sh`` is the
same file (sha256), and a missing or damaged part stops the install before pip runs. A fake file stands in for
Triton's 272 MiB wheel."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module(monkeypatch, parts_dir: Path, target: Path):
    spec = importlib.util.spec_from_file_location("_wheel_parts", ROOT / "scripts" / "wheel_parts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "DEVICE_PARTS", str(parts_dir))  # the device's /tmp, here a temporary folder
    monkeypatch.setattr(module, "DEVICE_TARGET", str(target))
    return module


def _fake_device(tmp_path: Path, folders: list[Path], parts_dir: Path) -> dict:
    """Every part copied into the device's parts folder, as the K calls do; ``python3`` a stub that records its
    arguments (pip is not run here)."""
    parts_dir.mkdir()
    for folder in folders:
        for file in folder.iterdir():
            (parts_dir / file.name).write_bytes(file.read_bytes())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python3"
    stub.write_text(f'#!/usr/bin/env bash\necho "$@" >> {tmp_path / "python3.log"}\n')
    stub.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")


@pytest.mark.parametrize("size,part_bytes", [(1000, 300), (900, 300), (1, 300), (300, 1000)])
def test_split_then_install_script_restores_the_wheel(tmp_path, monkeypatch, size, part_bytes):
    parts_dir = tmp_path / "device-parts"
    module = _module(monkeypatch, parts_dir, tmp_path / "site")
    wheel = tmp_path / "fake-1.0-cp312-abi3-manylinux_2_27_x86_64.whl"
    wheel.write_bytes(os.urandom(size))
    folders = module.split(wheel, tmp_path / "out", part_bytes)
    assert len(folders) == -(-size // part_bytes)
    for folder in folders:
        (part,) = folder.glob("*.part*")
        assert 0 < part.stat().st_size <= part_bytes
    env = _fake_device(tmp_path, folders, parts_dir)
    subprocess.run(["bash", str(parts_dir / "install.sh")], check=True, env=env, capture_output=True, text=True)
    rebuilt = parts_dir / wheel.name
    assert hashlib.sha256(rebuilt.read_bytes()).hexdigest() == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert f"--target {tmp_path / 'site'}" in (tmp_path / "python3.log").read_text()


@pytest.mark.parametrize("damage", ["missing", "flipped"])
def test_a_bad_part_stops_the_install_before_pip(tmp_path, monkeypatch, damage):
    parts_dir = tmp_path / "device-parts"
    module = _module(monkeypatch, parts_dir, tmp_path / "site")
    wheel = tmp_path / "fake.whl"
    wheel.write_bytes(os.urandom(1000))
    folders = module.split(wheel, tmp_path / "out", 400)
    env = _fake_device(tmp_path, folders, parts_dir)
    second = parts_dir / "fake.whl.part2"
    if damage == "missing":
        second.unlink()
    else:
        data = bytearray(second.read_bytes())
        data[7] ^= 1
        second.write_bytes(bytes(data))
    proc = subprocess.run(["bash", str(parts_dir / "install.sh")], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert not (tmp_path / "python3.log").exists(), "pip ran on a wheel that failed its check"
    if damage == "missing":
        assert "missing" in proc.stderr and "back to back" in proc.stderr


def test_device_commands_copy_each_part_and_install_on_the_last(tmp_path, monkeypatch):
    module = _module(monkeypatch, Path("/tmp/t39parts"), Path("/tmp/t39"))
    wheel = tmp_path / "fake.whl"
    wheel.write_bytes(b"x" * 10)
    folders = module.split(wheel, tmp_path / "out", 4)
    calls = module.device_commands(folders, "echo run")
    assert [carry for carry, _ in calls] == [str(f) for f in folders]
    assert all(command.startswith("mkdir -p /tmp/t39parts && cp ") for _, command in calls)
    assert "install.sh" not in " ".join(command for _, command in calls[:-1])
    assert calls[-1][1].endswith("bash /tmp/t39parts/install.sh && echo run")
    with pytest.raises(ValueError, match="at least one byte"):
        module.split(wheel, tmp_path / "out", 0)
