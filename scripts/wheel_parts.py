"""Carry a wheel larger than one call's 64 MiB to a remote GPU machine in parts (Triton 3.9, for backward b7).

The GPU machines have Triton 3.6 and no network; Triton 3.9's wheel for CPython 3.12 is about 272 MiB, and each
call to the GPU machine carries at most 64 MiB in all, the working tree (about 18 MiB on 2026-12-07, and growing
with every committed result) included. So, on this machine:

    python3 scripts/wheel_parts.py download          # pip download triton==3.9.* (cp312, manylinux x86-64) into .t39/
    python3 scripts/wheel_parts.py slim              # .t39/<wheel stem>-slim.tar.xz: the files less SLIM_DROPPED
    python3 scripts/wheel_parts.py split             # .t39/part1/ .. .t39/partK/, each <= --part-mib (default 40)
    python3 scripts/wheel_parts.py commands          # prints the K back-to-back calls below

`slim` is optional and worth it: it leaves out what a Hopper machine never opens (SLIM_DROPPED: the AMD backend's
libraries, CUPTI, proton, a test library; 411 MiB of 994 unpacked) and packs the rest with xz, so Triton 3.9.0's
272.4 MiB wheel becomes a 110.2 MiB archive: 3 parts of at most 40 MiB where the wheel needs 7 (measured
2026-12-06: 347 s to pack on a shared 2-core machine, 10 s to check and extract).
`split` takes the slim archive when --dir holds one (else the wheel; or --artifact). On the GPU machine, one call
per part while it stays warm (the parts live in its /tmp, which a machine gone idle loses: keep the calls back to
back). Call i (1 <= i < K) carries ``.t39/part<i>`` and runs ``mkdir -p /tmp/t39parts && cp .t39/part<i>/*
/tmp/t39parts/``; the last call carries ``.t39/part<K>`` and runs

    mkdir -p /tmp/t39parts && cp .t39/partK/* /tmp/t39parts/ && bash /tmp/t39parts/install.sh

where ``install.sh`` (written into every part's folder) concatenates the parts in order (``cat``), checks the
sha256 against the one recorded at split time, and installs into /tmp/t39: a slim archive by ``tar -xJf`` (its
files are those the wheel installs, ``.dist-info`` included), a wheel by ``pip install --no-deps --target``. A
command then runs under Triton 3.9 with ``PYTHONPATH=/tmp/t39:src`` (the folder first, so it shadows the image's
Triton 3.6). Proton (``triton.profiler``) does not work from a slim install: profile under the image's Triton.

FlashAttention-4 (the reference b7 is measured against) travels the same way, as a bundle of its eight pinned wheels
(FA4_WHEELS: its CuTe DSL and CUDA 13 libraries, 96 MiB, already compressed, so packed in a plain tar):

    python3 scripts/wheel_parts.py bundle --dir .fa4       # pip download FA4_WHEELS, pack .fa4/fa4-wheels.tar
    python3 scripts/wheel_parts.py split --dir .fa4        # .fa4/part1/ .. part3/
    python3 scripts/wheel_parts.py commands --dir .fa4     # three more calls, after Triton's last one

Its ``install.sh`` unpacks the wheels and installs them all with ``pip install --no-deps --target`` into the same
/tmp/t39, so ``PYTHONPATH=/tmp/t39:src`` finds Triton 3.9 and ``flash_attn.cute`` together. Carry Triton's parts
first: each part folder brings an ``install.sh`` into /tmp/t39parts, and the last one copied is the one run.

Why not one call: 64 MiB a call (device README, "Limits"). Why not fewer, larger parts: the part rides beside the
tree, so 64 MiB minus the tree minus room for the tree to grow (46 MiB parts stopped fitting beside the tree of
2026-12-07: the device refused the call).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / ".t39"  # git-ignored (.gitignore: /.t39/)
DEFAULT_REQUIREMENT = "triton==3.9.*"
# The GPU image: CPython 3.12 on manylinux x86-64 (device KINDS.md); pip matches a manylinux tag exactly.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# FlashAttention-4's Hopper path and what it imports, pinned (flash-attn-4's and nvidia-cutlass-dsl's requirements as
# of 4.0.0b36 / 4.8.1; the CUDA 13 libraries, as the image's torch is built for CUDA 13; torch and Triton are the
# image's): the versions FlashAttention-4 was timed with beside the course on an H100 80GB on 2026-12-06.
FA4_WHEELS = ("flash-attn-4==4.0.0b36", "nvidia-cutlass-dsl==4.8.1", "nvidia-cutlass-dsl-libs-base==4.8.1",
              "nvidia-cutlass-dsl-libs-cu13==4.8.1", "apache-tvm-ffi==0.1.15.post2", "torch-c-dlpack-ext==0.1.5",
              "quack-kernels==0.6.5", "einops==0.8.2")
BUNDLE_SUFFIX = "-wheels.tar"
DEVICE_PARTS = "/tmp/t39parts"
DEVICE_TARGET = "/tmp/t39"
SLIM_SUFFIX = "-slim.tar.xz"
XZ_PRESET = 6  # xz's own default level; it packs libtriton.so's 500 MB into 89.5 MB

# What `slim` leaves out of Triton 3.9's wheel: files an sm_90 (Hopper) machine never opens to import triton, compile
# a kernel for a CUDA target or launch it. Each is a path prefix in the wheel, with the reason it is safe (read in
# Triton 3.9's own sources, named here so the claim can be checked again for a later wheel).
SLIM_DROPPED = (
    # The AMD backend's compiled parts: compiler.py loads the codegen library (ctypes, `_load_amd_codegen`) and the
    # bitcode libraries only to compile for a HIP target, and driver.py builds its launcher from include/ only once
    # its `is_active()` (torch built for ROCm) is true. Its Python modules stay: `import triton` imports every
    # backend that the wheel's entry_points.txt lists (backends/__init__.py, `_discover_backends`), amd included.
    "triton/backends/amd/lib/",
    "triton/backends/amd/include/",
    # CUPTI, for proton's profiler only: knobs.py's `proton_knobs` is the only place that names these folders; the
    # CUDA driver and compiler never do. So `triton.profiler` (proton) does not work from the slim tree.
    "triton/backends/nvidia/lib/cupti/",
    "triton/backends/nvidia/lib/cupti-blackwell/",
    # Proton's extension: imported only by triton/profiler/ (hooks/launch.py, hooks/instrumentation.py) and by
    # testing.py's `do_bench_proton` variants, never by `import triton`, compiling or `do_bench`.
    "triton/_C/libproton.so",
    # A library for Triton's own instrumentation tests: named only by _test_runner.py.
    "triton/instrumentation/libGPUInstrumentationTestLib.so",
)
# Not dropped, though its name says Blackwell: backends/nvidia/bin/ptxas-blackwell is the ptxas Triton 3.9 runs for
# every target of compute capability 90 and above (backends/nvidia/compiler.py, `get_ptxas`; plain ptxas only
# below 90), so a Hopper compile needs it.


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _pip_download(dest: Path, requirements) -> None:
    """pip download of ``requirements`` for the GPU image's Python (no dependencies) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--implementation", "cp", *platforms, "-d", str(dest), *requirements], check=True)


def download(dest: Path, requirement: str = DEFAULT_REQUIREMENT) -> Path:
    """pip download of the one wheel (no dependencies: the image has Triton's) into ``dest``; returns its path."""
    _pip_download(dest, [requirement])
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one wheel in {dest}, found {[w.name for w in wheels]}: remove the others")
    return wheels[0]


def bundle(dest: Path, requirements=FA4_WHEELS, name: str = "fa4") -> Path:
    """pip download of ``requirements`` (each pinned, no dependencies) into ``dest``, packed with no compression (a
    wheel is a zip already) as ``dest/<name>-wheels.tar``; returns it."""
    _pip_download(dest, requirements)
    return pack_wheels(sorted(dest.glob("*.whl")), dest / f"{name}{BUNDLE_SUFFIX}")


def pack_wheels(wheels: list[Path], archive: Path) -> Path:
    """``wheels`` side by side in a plain tar at ``archive`` (written whole, then renamed)."""
    if not wheels:
        raise SystemExit(f"no wheels to pack into {archive.name}")
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w") as tar:
        for wheel in wheels:
            tar.add(wheel, arcname=wheel.name)
    os.replace(partial, archive)
    print(f"{archive}  {archive.stat().st_size / 2**20:.1f} MiB: {', '.join(w.name for w in wheels)}")
    return archive


def _dropped(name: str) -> bool:
    return any(name == prefix or name.startswith(prefix) for prefix in SLIM_DROPPED)


def slim(wheel: Path, dest: Path, progress_bytes: int = 4 << 20) -> Path:
    """The files ``wheel`` installs, less SLIM_DROPPED, as ``dest/<wheel stem>-slim.tar.xz``: extracting it into a
    folder on ``PYTHONPATH`` is the install (the ``.dist-info`` travels too, which ``import triton`` reads for its
    backends). Members of at least ``progress_bytes`` are printed as they are packed: xz takes minutes."""
    archive = dest / (wheel.stem + SLIM_SUFFIX)
    partial = archive.with_name(archive.name + ".partial")  # renamed when complete: `split` never sees half of one
    start = time.monotonic()
    kept = dropped = 0
    with zipfile.ZipFile(wheel) as source, tarfile.open(partial, "w:xz", preset=XZ_PRESET) as tar:
        for member in source.infolist():
            if _dropped(member.filename):
                dropped += member.file_size
                continue
            entry = tarfile.TarInfo(member.filename.rstrip("/"))
            # A zip made on Unix keeps the file mode in the high 16 bits; ptxas must stay executable.
            mode = member.external_attr >> 16 & 0o7777
            entry.mtime = time.mktime(member.date_time + (0, 0, -1))
            if member.is_dir():
                entry.type, entry.mode = tarfile.DIRTYPE, mode or 0o755
                tar.addfile(entry)
                continue
            entry.size, entry.mode = member.file_size, mode or 0o644
            with source.open(member) as data:
                tar.addfile(entry, data)
            kept += member.file_size
            if member.file_size >= progress_bytes:
                print(f"  {time.monotonic() - start:6.0f} s  packed {member.filename} ({member.file_size / 2**20:.1f} "
                      "MiB)", flush=True)
    os.replace(partial, archive)
    print(f"{archive}  {archive.stat().st_size / 2**20:.1f} MiB: {kept / 2**20:.0f} MiB of files kept, "
          f"{dropped / 2**20:.0f} MiB dropped, in {time.monotonic() - start:.0f} s")
    return archive


def install_script(artifact_name: str, digest: str, n_parts: int) -> str:
    """What the last call runs: reassemble in order, check the sha256, install into DEVICE_TARGET (a wheel by pip,
    a slim archive by extracting it)."""
    parts = " ".join(f"{DEVICE_PARTS}/{artifact_name}.part{i}" for i in range(1, n_parts + 1))
    artifact = shlex.quote(f"{DEVICE_PARTS}/{artifact_name}")
    target = shlex.quote(DEVICE_TARGET)
    check = (f"PYTHONPATH={target} python3 -c \"import triton; "
             "print('installed triton', triton.__version__, triton.__file__)\"")
    if artifact_name.endswith(BUNDLE_SUFFIX):
        wheels = shlex.quote(f"{DEVICE_PARTS}/wheels")
        install = f"""rm -rf {wheels} && mkdir -p {wheels} {target}
tar -xf {artifact} -C {wheels}
python3 -m pip install -q --no-deps --no-compile --no-cache-dir --upgrade --target {target} {wheels}/*.whl"""
        check = f"python3 -m pip list --path {target}"
    elif artifact_name.endswith(SLIM_SUFFIX):
        # tar -J runs the xz program; where an image lacks it, Python's own tarfile reads xz through lzma.
        install = f"""mkdir -p {target}
if command -v xz > /dev/null; then
    tar -xJf {artifact} -C {target}
else
    python3 -m tarfile -e {artifact} {target}
fi"""
    else:
        install = (f"python3 -m pip install -q --no-deps --no-compile --no-cache-dir --upgrade --target {target} "
                   f"{artifact}")
    return f"""#!/usr/bin/env bash
# Written by scripts/wheel_parts.py split: reassemble {artifact_name} from its {n_parts} parts and install it.
set -euo pipefail
for part in {parts}; do
    [ -f "$part" ] || {{ echo "missing $part: run the earlier calls again, back to back" >&2; exit 1; }}
done
cat {parts} > {artifact}
echo "{digest}  {DEVICE_PARTS}/{artifact_name}" | sha256sum -c -
{install}
{check}
"""


def split(artifact: Path, dest: Path, part_bytes: int) -> list[Path]:
    """``artifact`` (a wheel or a slim archive) cut into consecutive parts of at most ``part_bytes``, part i in
    ``dest/part<i>/`` beside a copy of ``install.sh`` and ``SHA256`` (so whichever part travels last brings the
    check along); returns the part folders in order."""
    if part_bytes <= 0:
        raise ValueError(f"part_bytes={part_bytes}: a part must hold at least one byte")
    size = artifact.stat().st_size
    n_parts = max(1, -(-size // part_bytes))
    digest = sha256(artifact)
    folders = []
    with open(artifact, "rb") as source:
        for i in range(1, n_parts + 1):
            folder = dest / f"part{i}"
            folder.mkdir(parents=True, exist_ok=True)
            for old in folder.glob("*.part*"):  # a previous split of another artifact or part size
                old.unlink()
            (folder / f"{artifact.name}.part{i}").write_bytes(source.read(part_bytes))
            (folder / "SHA256").write_text(f"{digest}  {artifact.name}\n")
            (folder / "install.sh").write_text(install_script(artifact.name, digest, n_parts))
            folders.append(folder)
    for stale in sorted(dest.glob("part*")):  # folders of an earlier split with more parts
        if stale.is_dir() and stale not in folders:
            for file in stale.iterdir():
                file.unlink()
            stale.rmdir()
    return folders


def device_commands(folders: list[Path], run: str) -> list[tuple[str, str]]:
    """(carry, command) of each call, in order; ``run`` is what the last call does after installing."""
    calls = []
    for i, folder in enumerate(folders, start=1):
        carry = folder.relative_to(ROOT).as_posix() if folder.is_relative_to(ROOT) else str(folder)
        command = f"mkdir -p {DEVICE_PARTS} && cp {carry}/* {DEVICE_PARTS}/"
        if i == len(folders):
            command += f" && bash {DEVICE_PARTS}/install.sh && {run}"
        calls.append((carry, command))
    return calls


def _one_wheel(folder: Path) -> Path:
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one wheel in {folder} (run `download` first), found {[w.name for w in wheels]}")
    return wheels[0]


def artifact_to_split(folder: Path) -> Path:
    """The bundle of wheels in ``folder`` where `bundle` has written one, else the slim archive of its one wheel
    where `slim` has written it, else that wheel."""
    bundles = sorted(folder.glob(f"*{BUNDLE_SUFFIX}"))
    if bundles:
        return bundles[-1]
    wheel = _one_wheel(folder)
    archive = folder / (wheel.stem + SLIM_SUFFIX)
    return archive if archive.exists() else wheel


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("download", "slim", "bundle", "split", "commands"))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where the wheel and its parts go (ignored)")
    parser.add_argument("--requirement", default=DEFAULT_REQUIREMENT)
    parser.add_argument("--artifact", type=Path,
                        help="split this file instead of --dir's slim archive (or its wheel where there is none)")
    parser.add_argument("--part-mib", type=float, default=40.0,
                        help="largest part in MiB (64 MiB a call, less the working tree)")
    parser.add_argument("--run", default="PYTHONPATH=/tmp/t39:src python3 benchmarks/gpu_b7.py --quick --out $OUT",
                        help="what the last call runs once Triton is installed (default: b7's quick run, about "
                             "2.5 minutes with the install)")
    args = parser.parse_args(argv)
    if args.action == "download":
        wheel = download(args.dir, args.requirement)
        print(f"{wheel}  {wheel.stat().st_size / 2**20:.1f} MiB  sha256 {sha256(wheel)}")
        return 0
    if args.action == "slim":
        slim(_one_wheel(args.dir), args.dir)
        return 0
    if args.action == "bundle":
        bundle(args.dir)
        return 0
    if args.action == "split":
        artifact = args.artifact or artifact_to_split(args.dir)
        folders = split(artifact, args.dir, int(args.part_mib * 2**20))
        print(f"{artifact.name} ({artifact.stat().st_size / 2**20:.1f} MiB) in {len(folders)} parts:")
        for folder in folders:
            size = sum(f.stat().st_size for f in folder.iterdir())
            print(f"{folder}  {size / 2**20:.1f} MiB")
        return 0
    folders = sorted((p for p in args.dir.glob("part*") if p.is_dir()), key=lambda p: int(p.name[4:]))
    if not folders:
        raise SystemExit(f"no parts in {args.dir}: run `download`, `slim` and `split` first")
    # Every part folder's SHA256 names what the parts add up to.
    digest, artifact_name = (folders[-1] / "SHA256").read_text().split()
    print(f"{len(folders)} calls, back to back, carry {artifact_name} (sha256 {digest[:12]}...):")
    for i, (carry, command) in enumerate(device_commands(folders, args.run), start=1):
        print(f"call {i}/{len(folders)}: carry=[{carry!r}]\n  {command}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
