"""scripts/wheel_parts.py: a wheel split into parts and put back together by the device's ``install.sh`` is the
same file (sha256), and a missing or damaged part stops the install before pip runs; a wheel slimmed to a tar.xz
and carried the same way extracts to the wheel's files, byte for byte and modes kept, less the dropped ones. Small
fake wheels stand in for Triton's 272 MiB one."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
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


# A stand-in for Triton's wheel: some members under SLIM_DROPPED's paths, some beside them that must stay (the AMD
# backend's Python modules, CUPTI's headers, both ptxas), an executable and a directory entry.
FAKE_MEMBERS = {
    "triton/__init__.py": (b"__version__ = '3.9.0'\n", 0o644),
    "triton/backends/amd/compiler.py": (b"# amd\n", 0o644),
    "triton/backends/amd/lib/libtriton_amd_codegen.so": (os.urandom(3000), 0o755),
    "triton/backends/amd/include/hip/hip_runtime.h": (b"// hip\n", 0o644),
    "triton/backends/nvidia/bin/ptxas": (os.urandom(2000), 0o755),
    "triton/backends/nvidia/bin/ptxas-blackwell": (os.urandom(2500), 0o755),
    "triton/backends/nvidia/include/cupti.h": (b"// kept: a header, not the library\n", 0o644),
    "triton/backends/nvidia/lib/cupti/libcupti.so": (os.urandom(1500), 0o755),
    "triton/backends/nvidia/lib/cupti-blackwell/libcupti.so": (os.urandom(1500), 0o755),
    "triton/_C/libtriton.so": (os.urandom(5000), 0o755),
    "triton/_C/libproton.so": (os.urandom(1200), 0o755),
    "triton/instrumentation/libGPUInstrumentationTestLib.so": (os.urandom(800), 0o755),
    "triton-3.9.0.dist-info/entry_points.txt": (b"[triton.backends]\namd = triton.backends.amd\n", 0o644),
}
FAKE_DROPPED = {name for name in FAKE_MEMBERS
                if "/amd/lib/" in name or "/amd/include/" in name or "/lib/cupti" in name
                or name.endswith(("libproton.so", "libGPUInstrumentationTestLib.so"))}


def _fake_wheel(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "triton-3.9.0-cp312-abi3-manylinux_2_27_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        directory = zipfile.ZipInfo("triton/backends/")
        directory.external_attr = (0o40755 << 16) | 0x10  # what pip's wheels hold for a folder: S_IFDIR, MS-DOS flag
        archive.writestr(directory, b"")
        for name, (data, mode) in FAKE_MEMBERS.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 10, 27, 18, 26, 0))
            info.external_attr = (0o100000 | mode) << 16
            archive.writestr(info, data)
    return wheel


def _device_path(tmp_path: Path, xz: bool) -> dict:
    """PATH for install.sh: the python3 stub first; without ``xz``, only the few programs the script needs, so the
    fallback to Python's tarfile is taken (the stub then runs the real Python for ``-m tarfile``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "python3"
    stub.write_text(f"""#!/usr/bin/env bash
if [ "$1 $2" = "-m tarfile" ]; then exec {sys.executable} "$@"; fi
echo "$@" >> {tmp_path / "python3.log"}
""")
    stub.chmod(0o755)
    if xz:
        return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    for program in ("bash", "cat", "sha256sum", "mkdir"):  # bash for the stub's `#!/usr/bin/env bash`
        (bin_dir / program).symlink_to(shutil.which(program))
    assert shutil.which("xz", path=str(bin_dir)) is None
    return dict(os.environ, PATH=str(bin_dir))


@pytest.mark.parametrize("xz", [True, False], ids=["tar-xJ", "python-tarfile"])
def test_slim_archive_carried_in_parts_extracts_the_kept_files_only(tmp_path, monkeypatch, xz):
    parts_dir, target = tmp_path / "device-parts", tmp_path / "site"
    module = _module(monkeypatch, parts_dir, target)
    out = tmp_path / "out"
    wheel = _fake_wheel(out)
    assert module.artifact_to_split(out) == wheel, "no slim archive yet: the wheel is what travels"
    archive = module.slim(wheel, out, progress_bytes=2000)
    assert archive.name == wheel.stem + "-slim.tar.xz" and module.artifact_to_split(out) == archive
    folders = module.split(archive, out, max(1, archive.stat().st_size // 3))
    assert len(folders) >= 3
    env = _fake_device(tmp_path, folders, parts_dir) | {"PATH": _device_path(tmp_path, xz)["PATH"]}
    subprocess.run([shutil.which("bash"), str(parts_dir / "install.sh")], check=True, env=env,
                   capture_output=True, text=True)
    extracted = {str(path.relative_to(target)) for path in target.rglob("*") if path.is_file()}
    assert extracted == set(FAKE_MEMBERS) - FAKE_DROPPED
    for name in extracted:
        data, mode = FAKE_MEMBERS[name]
        assert (target / name).read_bytes() == data, name
        assert (target / name).stat().st_mode & 0o777 == mode, f"{name}: ptxas must stay executable"
    assert "import triton" in (tmp_path / "python3.log").read_text(), "the install ends by importing what it put"


def test_a_damaged_part_of_a_slim_archive_stops_before_extracting(tmp_path, monkeypatch):
    parts_dir, target = tmp_path / "device-parts", tmp_path / "site"
    module = _module(monkeypatch, parts_dir, target)
    archive = module.slim(_fake_wheel(tmp_path / "out"), tmp_path / "out")
    folders = module.split(archive, tmp_path / "out", archive.stat().st_size // 2 + 1)
    env = _fake_device(tmp_path, folders, parts_dir)
    first = parts_dir / f"{archive.name}.part1"
    data = bytearray(first.read_bytes())
    data[100] ^= 1
    first.write_bytes(bytes(data))
    proc = subprocess.run(["bash", str(parts_dir / "install.sh")], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr
    assert not target.exists(), "an archive that failed its check was extracted"


def test_split_takes_the_slim_archive_unless_told_otherwise(tmp_path, monkeypatch, capsys):
    module = _module(monkeypatch, tmp_path / "device-parts", tmp_path / "site")
    out = tmp_path / "out"
    wheel = _fake_wheel(out)
    module.main(["slim", "--dir", str(out)])
    archive = out / (wheel.stem + "-slim.tar.xz")
    module.main(["split", "--dir", str(out), "--part-mib", "1"])
    assert [f.name for f in (out / "part1").glob("*.part*")] == [archive.name + ".part1"]
    module.main(["split", "--dir", str(out), "--part-mib", "1", "--artifact", str(wheel)])
    assert [f.name for f in (out / "part1").glob("*.part*")] == [wheel.name + ".part1"]
    capsys.readouterr()
    module.main(["commands", "--dir", str(out), "--run", "echo run"])
    assert f"carry {wheel.name}" in capsys.readouterr().out


def test_a_bundle_of_wheels_travels_in_parts_and_installs_every_wheel(tmp_path, monkeypatch, capsys):
    """FlashAttention-4's wheels packed in one tar: split wants the bundle over any single wheel, the parts put back
    together unpack to the same wheels, and pip is asked to install each of them into the target."""
    parts_dir = tmp_path / "device-parts"
    module = _module(monkeypatch, parts_dir, tmp_path / "site")
    out = tmp_path / "out"
    out.mkdir()
    wheels = []
    for name in ("flash_attn_4-4.0.0b36-py3-none-any.whl", "einops-0.8.2-py3-none-any.whl",
                 "nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl"):
        (out / name).write_bytes(os.urandom(700))
        wheels.append(out / name)
    archive = module.pack_wheels(sorted(wheels), out / "fa4-wheels.tar")
    assert module.artifact_to_split(out) == archive  # not "expected one wheel": the bundle is what travels
    folders = module.split(archive, out, 1000)
    assert len(folders) == -(-archive.stat().st_size // 1000) > 1
    env = _fake_device(tmp_path, folders, parts_dir)
    subprocess.run(["bash", str(parts_dir / "install.sh")], check=True, env=env, capture_output=True, text=True)
    for wheel in wheels:
        assert (parts_dir / "wheels" / wheel.name).read_bytes() == wheel.read_bytes()
    pip = (tmp_path / "python3.log").read_text().splitlines()
    assert pip[0].startswith(f"-m pip install -q --no-deps --no-compile --no-cache-dir --upgrade --target "
                             f"{tmp_path / 'site'} ")
    assert sorted(Path(arg).name for arg in pip[0].split()[10:]) == sorted(w.name for w in wheels)
    assert pip[1] == f"-m pip list --path {tmp_path / 'site'}"
    with pytest.raises(SystemExit, match="no wheels"):
        module.pack_wheels([], out / "empty-wheels.tar")
