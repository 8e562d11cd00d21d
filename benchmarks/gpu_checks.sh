#!/usr/bin/env bash
# The measurements herd still owes a GPU machine, in one command, from the project root:
#   1. the CUDA tests (the captured update against eager, the frame normaliser on the
#      device, the inference server's device path and device-to-device weights);
#   2. Pong with no flag (`benchmarks/pong.py --defaults`): the 100-game average's curve
#      and the frames and seconds at which it first reaches -15, 0, 10, 18 and 20;
#   3. throughput against the env-only ceiling: the headline on-policy configuration (on a
#      GPU: double-buffered actors, servers from their measured load) against single-buffered
#      actors, the server's path in each actor, and the threaded shape (few actor processes
#      on ale_vector's threads) with that path or served (by default; CONFIGS= names the
#      polled doorbell, CUDA graphs of every size and --inference_records=off, the other
#      GPU defaults still to check), with Sample Factory at equal work per frame when PEER is
#      set (serial on a few cores, async on many) and its venv or PEER_SITE is there
#      (benchmarks/peer_sample_factory.py).
# Everything it prints and records goes to $OUT (default /tmp/gpu_checks).
# usage: [STEPS=tests,pong,throughput] [PEER=serial|async] [PEER_SITE=DIR] [PEER_VARIANTS=all|equal-work]
#        [WORKERS=16] [ENVS=8] [WARMUP=30] [CONFIGS=on-policy,...] bash benchmarks/gpu_checks.sh [pong minutes] [throughput seconds]
# STEPS picks the parts (to split them between calls of a short device lease); PEER_SITE is
# a folder Sample Factory's wheels were installed to (pip install --target), for a machine
# that reaches no registry (docs/gpu.md); the peer's learner is on the GPU where there is one.
# What it took on an H200 (2026-11-30, docs/gpu.md says how to carry the wheels): the machine's
# start 30-60 s; the CUDA tests 80 s; Pong with no flag 140 s (the run ends by itself at 5M
# frames); the ceiling 35 s, then each configuration RUN_SECONDS + 10 s; the peer
# PEER_SECONDS + 20 s. Two calls fit a 15-minute lease: STEPS=tests,pong, then
# STEPS=throughput with PEER_VARIANTS=equal-work PEER_SECONDS=120 (and RUN_SECONDS 50 for
# the five default configurations below). After those: CONFIGS=on-policy-server-servers-2
# (the H200's two fixed servers), then -spin, -records-off, -cuda-graphs.
# On a CPU it runs too (the CUDA tests skip), for trying it before a GPU is lent:
#   WARMUP=10 WORKERS=2 ENVS=2 bash benchmarks/gpu_checks.sh 0.5 30
set -uo pipefail
OUT=${OUT:-/tmp/gpu_checks}; mkdir -p "$OUT"
PONG_MINUTES=${1:-4}; RUN_SECONDS=${2:-75}
WORKERS=${WORKERS:-16}; ENVS=${ENVS:-8}; STEPS=${STEPS:-tests,pong,throughput}
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
lscpu | grep -E "Model name|^CPU\(s\)" >> "$OUT/gpu.txt"
git rev-parse HEAD >> "$OUT/gpu.txt" 2>/dev/null
PEER_DEVICE=cpu; if nvidia-smi > /dev/null 2>&1; then PEER_DEVICE=gpu; fi

if [[ $STEPS == *tests* ]]; then
echo "== CUDA tests"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_devices.py tests/learner/test_capture_cuda.py tests/models/test_frame_normalizer.py \
    tests/inference/test_device_weights.py tests/inference/test_device_path.py tests/learner/test_device_copies.py \
    tests/inference/test_records.py tests/inference/test_growth.py tests/inference/test_in_actor.py \
    "tests/inference/test_server.py::test_cuda_server_equals_the_local_cpu_model" > "$OUT/cuda_tests.txt" 2>&1
tail -4 "$OUT/cuda_tests.txt"
fi

if [[ $STEPS == *pong* ]]; then
echo "== Pong, no flag, $PONG_MINUTES min"
python3 benchmarks/pong.py --defaults --minutes "$PONG_MINUTES" --tag _gpu_checks_defaults > "$OUT/pong.txt" 2>&1
tail -14 "$OUT/pong.txt"
fi

if [[ $STEPS == *throughput* ]]; then
echo "== throughput, $WORKERS workers x $ENVS envs"
# Each configuration costs RUN_SECONDS of device time: CONFIGS=... picks fewer to fit a budget.
if [ -z "${CONFIGS:-}" ]; then
    CONFIGS=on-policy,on-policy-server-single-buffer
    if nvidia-smi > /dev/null 2>&1; then
        CONFIGS=$CONFIGS,on-policy-server-in-actor,on-policy-server-in-actor-threaded,on-policy-server-threaded
    fi
fi
python3 benchmarks/throughput.py --workers "$WORKERS" --envs "$ENVS" --seconds "$RUN_SECONDS" --warmup "${WARMUP:-30}" --configs "$CONFIGS" \
    --label gpu_checks ${PEER:+--peer "$PEER" --peer_device "$PEER_DEVICE" --peer_seconds "${PEER_SECONDS:-120}" \
    --peer_variants "${PEER_VARIANTS:-all}"} ${PEER_SITE:+--peer_site "$PEER_SITE"} > "$OUT/throughput.txt" 2>&1
tail -14 "$OUT/throughput.txt"
fi

cp benchmarks/results/pong_*gpu_checks*.json benchmarks/results/throughput_*gpu_checks*.json "$OUT/" 2>/dev/null
echo "== results in $OUT"
