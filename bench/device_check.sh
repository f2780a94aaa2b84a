#!/usr/bin/env bash
# The GPU check: the kernel benchmark, then a 7B-dims `pope-fast bench` of every family against its
# transformers pipeline (mPLUG-Owl2: pope-fast alone, transformers has no class for it), one run per
# family under its own time limit so a slow one cannot take the others' figures with it.
#
# On any CUDA machine with torch, triton, transformers and bitsandbytes installed, from the repository root:
#   bash bench/device_check.sh                 # figures under $OUT (default /tmp/out)
# Wheels in .whl/ are installed first (for a machine without a package index); POPE question files in
# .device-pope/ replace the built-in questions; MODELS (families, in order), BUDGET (seconds for all of it,
# default 500) and BENCH_TIMEOUT (seconds per family, default 170) adjust the run; KERNELS=0 skips the kernel
# benchmark (25 s on an H200), TOWER=0 the Qwen2.5-VL tower's, VERIFY=0 the fp16 `pope-fast verify` of every family's tiny checkpoint
# (VERIFY_MODELS: only these) and TORCHRUN=0 the one-rank NCCL torchrun of the demo.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
# The machine's own torch/triton/transformers; pope-fast itself needs no install beyond its sources.
python3 -m pip install -q --no-deps --no-build-isolation . || { echo "pope-fast did not install"; exit 1; }  # not -e: setuptools' develop re-runs pip with build isolation, which needs an index
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
date -u | tee -a "$OUT/gpu.txt"; git rev-parse --short HEAD 2>/dev/null | tee -a "$OUT/gpu.txt"

POPE=()
[ -d .device-pope ] && POPE=(--pope "$PWD/.device-pope" --questions 0)
# run from outside the checkout: its pope_fast/ folder would shadow the installed package, whose subpackages
# (readout/, engine/, ...) live beside it in the source tree
cd "$OUT" || exit 1
[ "${KERNELS:-1}" = 0 ] || timeout 150 python3 -m pope_fast.bench.kernels 2>&1 | tee "$OUT/kernels.md"
# Qwen2.5-VL-7B's tower on one 640 x 480 image: transformers' forward against ours, counted, timed and compared bit
# for bit in fp16 (TOWER=0 skips it; ~30 s)
[ "${TOWER:-1}" = 0 ] || timeout 120 python3 -m pope_fast.bench.tower --device cuda --dtype fp16 --width 1280 --heads 16 \
  2>&1 | tee "$OUT/tower.md"
# every registered family but qwen3_vl_moe, whose random checkpoint at its seed size (Qwen3-VL-30B-A3B, 31B
# parameters) is 62 GB in fp16, more than the lent machine's disk: name it in MODELS where the disk holds it
MODELS=${MODELS:-$(python3 -c "from pope_fast.engine import FAMILIES; print(*(f for f in FAMILIES if f != 'qwen3_vl_moe'))")}
# `pope-fast verify` in fp16 on each family's tiny random checkpoint (bench keeps them in --work-dir): the engine
# against transformers' class where cuBLAS and the Triton kernels compute; every family unless VERIFY_MODELS names
# some (VERIFY=0 skips it; ~2 minutes)
VERIFY_MODELS=${VERIFY_MODELS:-$(python3 -c "from pope_fast.engine import FAMILIES; print(*FAMILIES)")}
if [ "${VERIFY:-1}" != 0 ]; then
  timeout 240 pope-fast bench --models "$(echo "$VERIFY_MODELS" | tr ' ' ',')" --size tiny --questions 6 \
    --no-reference --work-dir /tmp/pope-fast-tiny > /dev/null 2> "$OUT/verify-bench.err"
  for model in $VERIFY_MODELS; do
    [ -d "/tmp/pope-fast-tiny/$model-tiny" ] || { echo "verify $model: no tiny checkpoint"; continue; }
    timeout 90 pope-fast verify --model "/tmp/pope-fast-tiny/$model-tiny" --dtype fp16 > "$OUT/verify-$model.txt" 2>&1
    echo "verify $model: $(tail -1 "$OUT/verify-$model.txt")"
  done
fi
# torchrun on the GPU (NCCL, one rank) against one plain process: the demo's records, byte for byte (TORCHRUN=0
# skips it; ~30 s)
if [ "${TORCHRUN:-1}" != 0 ]; then
  timeout 120 pope-fast eval --device cuda --out "$OUT/demo-single" > /dev/null 2> "$OUT/demo-single.err" \
    && timeout 150 torchrun --standalone --nproc-per-node 1 -m pope_fast eval --device cuda --out "$OUT/demo-torchrun" \
      > /dev/null 2> "$OUT/demo-torchrun.err" \
    && cmp "$OUT/demo-single/records.jsonl" "$OUT/demo-torchrun/records.jsonl" \
    && echo "torchrun (nccl, 1 rank): the same records as one process" \
    || { echo "torchrun (nccl, 1 rank): FAILED"; tail -3 "$OUT/demo-single.err" "$OUT/demo-torchrun.err"; }
fi
# Each family gets BENCH_TIMEOUT seconds at most, and none starts once less
# than a minute of the BUDGET (seconds since the script started) is left.
for model in $MODELS; do
  left=$(( ${BUDGET:-500} - SECONDS ))
  [ "$left" -lt 60 ] && { echo "skipped $model: ${left}s of the budget left"; continue; }
  limit=$(( left < ${BENCH_TIMEOUT:-170} ? left : ${BENCH_TIMEOUT:-170} ))
  timeout "$limit" pope-fast bench --models "$model" --size 7b --reference-sample 100 "${POPE[@]}" \
    --format json > "$OUT/bench-$model.json" 2> "$OUT/bench-$model.err"
  tail -3 "$OUT/bench-$model.err"
  rm -rf "${TMPDIR:-/tmp}"/pope-fast-bench-*  # a timed-out run leaves its ~15 GB random checkpoint behind
done
python3 - "$OUT" <<'PY'
import json, pathlib, sys
from pope_fast.bench import format_report
for path in sorted(pathlib.Path(sys.argv[1]).glob("bench-*.json")):
    try:
        print(format_report(json.loads(path.read_text())))
    except ValueError:
        print(f"{path.name}: no report (timed out or failed; see {path.stem}.err)")
PY
