"""Carry a wheel larger than one call's 64 MiB to a remote GPU machine in parts (Triton 3.9, for backward b7).

The GPU machines have Triton 3.6 and no network; Triton 3.9's wheel for CPython 3.12 is about 272 MiB, and each
call to the GPU machine carries the working tree (about 12 MiB) plus at most 64 MiB in all. So, on this machine:

    python3 scripts/wheel_parts.py download          # pip download triton==3.9.* (cp312, manylinux x86-64) into .t39/
    python3 scripts/wheel_parts.py split             # .t39/part1/ .. .t39/partK/, each <= --part-mib (default 46)
    python3 scripts/wheel_parts.py commands          # prints the K back-to-back calls below

and on the GPU machine, one call per part while it stays warm (the parts live in its /tmp, which a machine gone
idle loses: keep the calls back to back). Call i (1 <= i < K) carries ``.t39/part<i>`` and runs
``mkdir -p /tmp/t39parts && cp .t39/part<i>/* /tmp/t39parts/``; the last call carries ``.t39/part<K>`` and runs

    mkdir -p /tmp/t39parts && cp .t39/partK/* /tmp/t39parts/ && bash /tmp/t39parts/install.sh

where ``install.sh`` (written into every part's folder) concatenates the parts in order (``cat``), checks the
wheel's sha256 against the one recorded at split time, and runs ``pip install --no-deps --target /tmp/t39``. A
command then runs under Triton 3.9 with ``PYTHONPATH=/tmp/t39:src`` (the folder first, so it shadows the image's
Triton 3.6).

Why not one call: 64 MiB a call (device README, "Limits"). Why not fewer, larger parts: the part rides beside the
tree, so 64 MiB minus the tree (12 MiB) minus room for the tree to grow.
"""

from __future__ import annotations

import argparse
import hashlib
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / ".t39"  # git-ignored (.gitignore: /.t39/)
DEFAULT_REQUIREMENT = "triton==3.9.*"
# The GPU image: CPython 3.12 on manylinux x86-64 (device KINDS.md); pip matches a manylinux tag exactly.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
DEVICE_PARTS = "/tmp/t39parts"
DEVICE_TARGET = "/tmp/t39"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(dest: Path, requirement: str = DEFAULT_REQUIREMENT) -> Path:
    """pip download of the one wheel (no dependencies: the image has Triton's) into ``dest``; returns its path."""
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--implementation", "cp", *platforms, "-d", str(dest), requirement], check=True)
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one wheel in {dest}, found {[w.name for w in wheels]}: remove the others")
    return wheels[0]


def install_script(wheel_name: str, digest: str, n_parts: int) -> str:
    """What the last call runs: reassemble in order, check the sha256, install into DEVICE_TARGET."""
    parts = " ".join(f"{DEVICE_PARTS}/{wheel_name}.part{i}" for i in range(1, n_parts + 1))
    wheel = f"{DEVICE_PARTS}/{wheel_name}"
    return f"""#!/usr/bin/env bash
# Written by scripts/wheel_parts.py split: reassemble {wheel_name} from its {n_parts} parts and install it.
set -euo pipefail
for part in {parts}; do
    [ -f "$part" ] || {{ echo "missing $part: run the earlier calls again, back to back" >&2; exit 1; }}
done
cat {parts} > {shlex.quote(wheel)}
echo "{digest}  {wheel}" | sha256sum -c -
python3 -m pip install -q --no-deps --no-compile --no-cache-dir --upgrade --target {DEVICE_TARGET} {shlex.quote(wheel)}
PYTHONPATH={DEVICE_TARGET} python3 -c "import triton; print('installed triton', triton.__version__, triton.__file__)"
"""


def split(wheel: Path, dest: Path, part_bytes: int) -> list[Path]:
    """``wheel`` cut into consecutive parts of at most ``part_bytes``, part i in ``dest/part<i>/`` beside a copy
    of ``install.sh`` and ``SHA256`` (so whichever part travels last brings the check along); returns the part
    folders in order."""
    if part_bytes <= 0:
        raise ValueError(f"part_bytes={part_bytes}: a part must hold at least one byte")
    size = wheel.stat().st_size
    n_parts = max(1, -(-size // part_bytes))
    digest = sha256(wheel)
    folders = []
    with open(wheel, "rb") as source:
        for i in range(1, n_parts + 1):
            folder = dest / f"part{i}"
            folder.mkdir(parents=True, exist_ok=True)
            for old in folder.glob("*.part*"):  # a previous split of another wheel or part size
                old.unlink()
            (folder / f"{wheel.name}.part{i}").write_bytes(source.read(part_bytes))
            (folder / "SHA256").write_text(f"{digest}  {wheel.name}\n")
            (folder / "install.sh").write_text(install_script(wheel.name, digest, n_parts))
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("download", "split", "commands"))
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where the wheel and its parts go (ignored)")
    parser.add_argument("--requirement", default=DEFAULT_REQUIREMENT)
    parser.add_argument("--part-mib", type=float, default=46.0,
                        help="largest part in MiB (64 MiB a call, less the working tree)")
    parser.add_argument("--run", default="PYTHONPATH=/tmp/t39:src python3 benchmarks/gpu_b7.py --quick --out $OUT",
                        help="what the last call runs once Triton is installed (default: b7's quick run, about "
                             "2.5 minutes with the install)")
    args = parser.parse_args(argv)
    if args.action == "download":
        wheel = download(args.dir, args.requirement)
        print(f"{wheel}  {wheel.stat().st_size / 2**20:.1f} MiB  sha256 {sha256(wheel)}")
        return 0
    if args.action == "split":
        wheels = sorted(args.dir.glob("*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"expected one wheel in {args.dir} (run `download` first), found {len(wheels)}")
        folders = split(wheels[0], args.dir, int(args.part_mib * 2**20))
        for folder in folders:
            size = sum(f.stat().st_size for f in folder.iterdir())
            print(f"{folder}  {size / 2**20:.1f} MiB")
        return 0
    folders = sorted((p for p in args.dir.glob("part*") if p.is_dir()), key=lambda p: int(p.name[4:]))
    if not folders:
        raise SystemExit(f"no parts in {args.dir}: run `download` and `split` first")
    for i, (carry, command) in enumerate(device_commands(folders, args.run), start=1):
        print(f"call {i}/{len(folders)}: carry=[{carry!r}]\n  {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
