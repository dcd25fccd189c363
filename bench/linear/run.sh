#!/usr/bin/env bash
# Small-M dense FP8 linear on the GPU: its GPU tests (3 workers, capped at LINEAR_TEST_S), then the graph-timed sweep.
# Writes $OUT/linear-gemv.json and $OUT/linear.log. Extra arguments go to bench_gemv.py.
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env linear.log
timeout "${LINEAR_TEST_S:-90}" python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" -n "${LINEAR_TEST_N:-3}" \
  tests/kernels/test_gemv_gpu.py 2>&1 | tail -30 | tee "$log"
tests_rc=${PIPESTATUS[0]}
bench_rc=0
if [ "${LINEAR_STEPS:-tests,bench}" != tests ]; then  # LINEAR_STEPS=tests: the GPU tests only
  python3 bench/linear/bench_gemv.py --out "$OUT" "$@" 2>&1 | tee -a "$log"
  bench_rc=${PIPESTATUS[0]}
fi
echo "linear: tests rc=$tests_rc bench rc=$bench_rc" | tee -a "$log"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
