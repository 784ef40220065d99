#!/usr/bin/env bash
# The course's GPU work, run from the repository root on a CUDA machine (PYTHONPATH=src, nothing installed):
# one stage per invocation, each under 10 minutes. Results land in $OUT; copy them into benchmarks/results/.
#   scripts/gpu_run.sh verify     pytest -m gpu, launch overhead, decode, softmax cost
#   scripts/gpu_run.sh check      pytest -m gpu, then launch-config sweeps (forward, backward, decode)
#   scripts/gpu_run.sh bench      versions table, full attention grid, decode benchmark
#   scripts/gpu_run.sh ncu        Nsight Compute counters of the default forward and the b1/b5 backward kernels
#   scripts/gpu_run.sh limits     Nsight Compute over the backward (b1, b6a, b6c, cuDNN), FP8 vs fp16 decode and a
#                                 prefix-LM mask_mod (ours, Flex): benchmarks/ncu_limits.py, one JSON within 480 s
#                                 (every case in order until the budget is spent; the gap cases, last: `gaps`)
#   scripts/gpu_run.sh gaps       Nsight Compute over the gaps of the 2026-12-02 runs, each beside its reference:
#                                 the default forward at N = 4096 (D = 128, and causal; D = 64 causal) and cuDNN's,
#                                 the FP8 forward v8c_fp8 (V as given), Triton FP8 (V keys-adjacent) and cuDNN fp16
#                                 at D = 128, N = 8192, the backward at D = 256 causal (b1) and cuDNN's; one JSON
#                                 <date>-<device>-ncu-limits.json (rename it -ncu-gaps before committing) and the raw
#                                 pages as ncu-limits-raw.tgz
#   scripts/gpu_run.sh grids      the attention grid in four parts (dtype x head dim); merge them with
#                                 `python -m flashcourse.bench merge attention-fp16 <parts>` (no GPU needed)
#   scripts/gpu_run.sh fa3        the Gluon forward stages v8a-v8e, each checked, then timed (also fa3_backward:
#                                 b6a-b6c, and fa3_fp8: v8c_fp8; one call each)
#   scripts/gpu_run.sh variants_masks [DTYPE...]   the variants benchmark's mask_mod and head_dim 256 rows
#   scripts/gpu_run.sh variants_base [DTYPE...]    its six other variants (causal, windows, documents, GQA, softcap)
#                                 in float16 and bfloat16 or the dtypes named, 520 s shared between them; each call
#                                 writes <date>-<device>-variants.json to $OUT (a later dtype merges into the file);
#                                 join the calls' files with `python -m flashcourse.bench merge variants <files>`
#   scripts/gpu_run.sh tests1     `make test-gpu` in two calls of under 10 minutes each (on an H100 on 2026-12-07:
#   scripts/gpu_run.sh tests2     330 s and 300 s): tests2 the seven test files heaviest in kernels, tests1 the
#                                 others with the launch fit; each writes <date>-<device>-gpu-tests.json with its
#                                 `files` (rename them -part1 / -part2 before committing). Under another Triton
#                                 installed in a folder: PYTHONPATH=/tmp/t39 scripts/gpu_run.sh tests1
#   scripts/gpu_run.sh SUBCOMMAND ARGS...   any `python -m flashcourse.bench` command, e.g. attention --quick
set -uo pipefail
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/flashcourse-out}
mkdir -p "$OUT"
py=python3
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
$py -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"

stage() {  # stage NAME SECONDS COMMAND...: run with a time limit, log to $OUT/NAME.log
    local name=$1 limit=$2; shift 2
    echo "=== $name (limit ${limit}s)"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log" | tail -60
    echo "=== $name took $((SECONDS - t0)) s (rc ${PIPESTATUS[0]})"
}

GPU_TESTS="tests/test_kernels_forward.py tests/test_kernels_backward.py tests/test_decode.py
    tests/test_kernel_configs.py tests/test_ablation.py"

case "${1:-check}" in
verify)
    stage pytest_gpu 300 $py -m pytest -m gpu -x -q -p no:cacheprovider $GPU_TESTS
    stage overhead 60 $py -m flashcourse.bench overhead --out "$OUT"
    stage decode 90 $py -m flashcourse.bench decode --out "$OUT"
    stage softmax_cost 90 $py -m flashcourse.bench softmax-cost --out "$OUT"
    ;;
check)
    stage pytest_gpu 260 $py -m pytest -m gpu -x -q -p no:cacheprovider $GPU_TESTS
    stage tune 200 $py -m flashcourse.bench tune --out "$OUT" --n 8192
    stage decode_tune 90 $py -m flashcourse.bench decode --tune --out "$OUT"
    ;;
bench)
    stage decode 50 $py -m flashcourse.bench decode --out "$OUT"
    stage versions 140 $py -m flashcourse.bench versions --out "$OUT"
    stage attention_fp16 175 $py -m flashcourse.bench attention --dtype float16 --tag=-fp16 --out "$OUT"
    stage attention_bf16 175 $py -m flashcourse.bench attention --dtype bfloat16 --tag=-bf16 --out "$OUT"
    ;;
grids)
    for dtype in float16 bfloat16; do
        tag=$([ $dtype = float16 ] && echo fp16 || echo bf16)
        for d in 128 64; do
            stage attention_${tag}_d$d 150 $py -m flashcourse.bench attention --dtype $dtype --head-dim $d \
                --tag=-$tag-d$d --out "$OUT"
        done
    done
    ;;
ncu)
    stage ncu 110 /usr/local/cuda/bin/ncu --clock-control none -k "regex:_fwd_v7|_bwd_dkdv|_bwd_dq" \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --csv --page details $py benchmarks/ncu_kernels.py
    cp "$OUT/ncu.log" "$OUT/ncu.csv"
    ;;
final)  # the attention grid, decode, and the GPU tests of the default kernels
    stage attention_fp16 175 $py -m flashcourse.bench attention --dtype float16 --tag=-fp16 --out "$OUT"
    stage attention_bf16 175 $py -m flashcourse.bench attention --dtype bfloat16 --tag=-bf16 --out "$OUT"
    stage decode 40 $py -m flashcourse.bench decode --out "$OUT"
    stage pytest_gpu 140 $py -m pytest -m gpu -x -q -p no:cacheprovider -k "not every_version" \
        tests/test_kernels_forward.py tests/test_kernels_backward.py tests/test_decode.py
    ;;
fa3)
    stage fa3_forward 560 $py benchmarks/gpu_fa3.py --budget 540 --out "$OUT"
    ;;
fa3_backward)
    stage fa3_backward 560 $py benchmarks/gpu_fa3_backward.py --budget 450 --out "$OUT"
    ;;
limits)
    stage limits 560 $py benchmarks/ncu_limits.py --run-ncu --budget 470 --out "$OUT"
    # the raw pages as one archive: a device call returns at most 8 files from $OUT
    (cd "$OUT" && tar czf ncu-limits-raw.tgz ncu-limits && rm -rf ncu-limits)
    ;;
gaps)  # ncu_limits.GAP_CASES, in order (tests/test_ncu_limits.py holds this list to them): 11 cases, where the
    # 19 cases run so far took 8-48 s each under ncu (meta.cases of the 2026-12-02 -ncu-limits / -ncu-variant-gaps)
    gap_cases=(fwd-d128-n4096-ours fwd-d128-n4096-cudnn fwd-d128-n4096-causal-ours fwd-d128-n4096-causal-cudnn
               fwd-d64-n4096-causal-ours fwd-d64-n4096-causal-cudnn fp8-fwd-v8c fp8-fwd-triton-keys-adjacent
               fp8-fwd-cudnn-fp16 bwd-d256-causal-ours bwd-d256-causal-cudnn)
    only=()
    for name in "${gap_cases[@]}"; do only+=(--only "$name"); done
    stage gaps 560 $py benchmarks/ncu_limits.py --run-ncu "${only[@]}" --budget 470 --out "$OUT"
    # the raw pages as one archive: a device call returns at most 8 files from $OUT
    (cd "$OUT" && tar czf ncu-limits-raw.tgz ncu-limits && rm -rf ncu-limits)
    ;;
fa3_fp8)
    stage fa3_fp8 400 $py benchmarks/gpu_fa3_fp8.py --out "$OUT"
    ;;
tests1 | tests2)
    heavy=(tests/test_decode.py tests/test_decode_new_tokens.py tests/test_dropout.py tests/test_edges.py
           tests/test_edges_kernels.py tests/test_kernels_forward.py tests/test_plan.py)
    if [ "$1" = tests1 ]; then
        stage tests1 570 $py scripts/gpu_tests.py --out "$OUT" --exclude "${heavy[@]}"
    else
        stage tests2 570 $py scripts/gpu_tests.py --out "$OUT" --files "${heavy[@]}" --no-launch-fit
    fi
    ;;
variants_masks | variants_base)
    if [ "$1" = variants_masks ]; then
        names=("mask_mod: prefix-LM" "mask_mod: chunked local" "mask_mod: stripes" "head_dim: 256"
               "head_dim: 256, causal")
    else
        names=(causal "window 1024" "window 4096" "8 documents, causal" "GQA 32/8, causal" "softcap 30, causal")
    fi
    dtypes=("${@:2}")
    [ ${#dtypes[@]} -gt 0 ] || dtypes=(float16 bfloat16)
    for dtype in "${dtypes[@]}"; do  # 520 s in all keeps the call under 9 minutes with the start
        stage "${1}_$dtype" $((520 / ${#dtypes[@]})) $py -m flashcourse.bench variants --dtype "$dtype" \
            --variants "${names[@]}" --out "$OUT"
    done
    ;;
*)
    stage custom 560 $py -m flashcourse.bench "$@" --out "$OUT"
    ;;
esac
