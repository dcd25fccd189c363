#!/usr/bin/env bash
# Small-M dense FP8 linear on the GPU: the graph-timed sweep (bench_gemv.py, default --sweep modes: the product modes on
# the engine's decode calls; capped at LINEAR_BENCH_S), then its GPU tests (3 workers, capped at LINEAR_TEST_S).
# Writes $OUT/linear-gemv.json and $OUT/linear.log. Extra arguments go to bench_gemv.py.
#   LINEAR_STEPS=bench,tests (default) | tests | bench
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env linear.log
steps=",${LINEAR_STEPS:-bench,tests},"
step bench "${LINEAR_BENCH_S:-80}" python3 bench/linear/bench_gemv.py --out "$OUT" "$@"
step tests "${LINEAR_TEST_S:-80}" python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" \
  -n "${LINEAR_TEST_N:-3}" tests/kernels/test_gemv_gpu.py
echo "linear: rc=$rc" | tee -a "$log"
exit $rc
