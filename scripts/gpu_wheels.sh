#!/usr/bin/env bash
# Wheels that let the GPU machine (no Jupyter, no internet) execute the course's notebooks with nbclient:
# nbclient, nbformat, ipykernel, ipywidgets and every package they need that the machine does not already have.
#
#   scripts/gpu_wheels.sh                      # CPython 3.12, manylinux x86-64, into .whl/ (git-ignored)
#   PY_VERSION=3.11 DEST=/tmp/whl311 scripts/gpu_wheels.sh   # the same set for a local 3.11 check
#
# pip's resolver finds the dependency closure (a dry run, nothing installed); the walk below then keeps only what
# is reachable from the roots without passing through a package the GPU image already holds (so numpy, torch,
# matplotlib, pyyaml, psutil, packaging, pygments, attrs, ... are never carried: a second copy on PYTHONPATH
# would shadow the image's), and `pip download --no-deps` fetches exactly those, one version each.
# On the GPU machine (see scripts/gpu_notebooks.py):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
PY_VERSION=${PY_VERSION:-3.12}
DEST=${DEST:-.whl}
MAX_MIB=${MAX_MIB:-40}
# What the notebooks need beyond the image: the roots below. The lessons and solutions import only flashcourse,
# numpy, torch, triton, IPython and the standard library; flashcourse adds ipywidgets (widgets, quiz), matplotlib,
# pyyaml and rich (all in the image); genanki is only for `flashcourse interview export --format anki`.
ROOTS=${ROOTS:-"nbclient nbformat ipykernel ipywidgets"}
# The GPU image's packages (device KINDS.md, "Python packages already there", read 2026-11-17): never carried.
GPU_HAS="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas
nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp"

PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
TARGET=(--python-version "$PY_VERSION" --implementation cp --only-binary=:all: "${PLATFORMS[@]}")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "[gpu_wheels] resolving $ROOTS for CPython $PY_VERSION manylinux x86-64"
# shellcheck disable=SC2086
"$PYTHON" -m pip install -q --dry-run --ignore-installed --report "$work/report.json" --target "$work/x" \
    "${TARGET[@]}" $ROOTS

# The closure from the roots, stopping at what the image has: NAME==VERSION lines.
GPU_HAS="$GPU_HAS" ROOTS="$ROOTS" PY_VERSION="$PY_VERSION" "$PYTHON" - "$work/report.json" >"$work/needed.txt" <<'EOF'
import json, os, re, sys
try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
except ImportError:  # pip carries its own copy
    from pip._vendor.packaging.markers import Marker
    from pip._vendor.packaging.requirements import Requirement

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

report = json.load(open(sys.argv[1]))
resolved = {norm(i["metadata"]["name"]): i["metadata"] for i in report["install"]}
has = {norm(n) for n in os.environ["GPU_HAS"].split()}
env = {"python_version": os.environ["PY_VERSION"], "python_full_version": os.environ["PY_VERSION"] + ".0",
       "implementation_name": "cpython", "platform_python_implementation": "CPython", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix", "extra": ""}
todo, keep = [norm(r) for r in os.environ["ROOTS"].split()], {}
while todo:
    name = todo.pop()
    if name in keep or name in has:
        continue
    meta = resolved[name]
    keep[name] = meta["version"]
    for line in meta.get("requires_dist", []):
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            todo.append(norm(req.name))
for name in sorted(keep):
    print(f"{name}=={keep[name]}")
EOF

mkdir -p "$DEST"
echo "[gpu_wheels] downloading $(wc -l <"$work/needed.txt") wheels into $DEST/"
# shellcheck disable=SC2046
"$PYTHON" -m pip download -q --no-deps "${TARGET[@]}" -d "$DEST" $(cat "$work/needed.txt")

# Check the set: every needed package there once, nothing the image has, no other version of ours, the size.
"$PYTHON" - "$DEST" "$work/needed.txt" "$MAX_MIB" "$GPU_HAS" <<'EOF'
import re, sys
from pathlib import Path

dest, needed, max_mib, has = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split()
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
want = dict(line.split("==") for line in needed.read_text().split())
wheels = {}
for wheel in sorted(dest.glob("*.whl")):
    name, version = wheel.name.split("-")[:2]
    wheels.setdefault(norm(name), []).append((version, wheel))
problems = []
for name, found in wheels.items():
    if name in want:
        for version, wheel in found:
            if version != want[name]:  # an older download of ours: two versions stop the whole install
                wheel.unlink()
                print(f"[gpu_wheels] removed {wheel.name} (now {want[name]})")
    elif name in {norm(h) for h in has}:
        problems.append(f"{found[0][1].name}: the GPU image already has {name}; carrying it would shadow it")
    else:
        print(f"[gpu_wheels] note: {found[0][1].name} is in {dest}/ but not in this set (someone else's?)")
total = 0
for name, version in sorted(want.items()):
    matches = [w for v, w in wheels.get(name, []) if v == version]
    if len(matches) != 1:
        problems.append(f"{name}=={version}: {len(matches)} wheels in {dest}/")
        continue
    size = matches[0].stat().st_size
    total += size
    print(f"  {name:28} {version:12} {size / 2**20:6.2f} MiB  {matches[0].name}")
print(f"[gpu_wheels] {len(want)} wheels, {total / 2**20:.1f} MiB in all (limit {max_mib:g} MiB)")
if total > max_mib * 2**20:
    problems.append(f"{total / 2**20:.1f} MiB is over {max_mib:g} MiB")
for problem in problems:
    print(f"[gpu_wheels] ERROR: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
