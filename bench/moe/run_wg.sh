#!/usr/bin/env bash
# The FP8 tensor-core decode-MoE tiles (``triton_moe_small_wg``, bench/NOTES.md "MoE decode run 12", "Session 8")
# on the GPU in one call: ``bench_small.py`` times the candidates beside the shipped tiles at each T in the same
# process, then their GPU tests (reference at T = 1-8 on both models, EP slices, no-local zeros, graph replay ==
# eager); WG_STEPS=...,pick: ``pick_small.py`` turns the winners (> 2 % faster at both E, tests passed) into a
# DAYZERO_MOE_SMALL_TILES rule and, where it differs from the shipped tiles, runs the registered-op / graph-replay
# tests, the engine's CUDA-graph tests and the 20B / 120B decode rows (batch 1 and 64) under it.
# Writes $OUT/moe-wg.log, $OUT/wg-tests.xml, $OUT/moe-small.json (bench_small's), $OUT/bench-decode-*.json
# (WG_STEPS=...,trace: $OUT/wg-trace.json). Carry .devmeta.
#   bash bench/moe/run_wg.sh            (WG_STEPS=bench,tests[,pick]; WG_TS=1,2,4,8; WG_T<T>: the variants at T)
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env moe-wg.log
export DAYZERO_DEADLINE="${DAYZERO_DEADLINE:-$(( $(date +%s) + 145 ))}"
steps=",${WG_STEPS:-bench,tests},"
# bench first (its compile workers fill Triton's cache for the tests too); the shipped tile at each T first
# (session 9's second lists: the PDL down doing its h-independent loads before the wait, ``_qtwR`` (removed; NOTES
# "Session 9, helper") were measured in session 9's third call; then the ring depth / PDL-off / g128 lists (NOTES "Session 9,
# lead: ring depth", measured); then gate_up over 2 K ranges (measured slower, removed: source in commit 08a488b); now the
# shipped tiles alone (WG_T<T> names candidates); the earlier lists are in this file's git history)
step bench "${WG_BENCH_S:-90}" env MOE_SMALL_VARIANTS_T1="${WG_T1:-wg_d64_s2_qt}" \
  MOE_SMALL_VARIANTS_T2="${WG_T2:-wg2_d64_s2_qtp_st3}" \
  MOE_SMALL_VARIANTS_T4="${WG_T4:-wg8_d64_qtp_st2,wg8_d64_qtp}" \
  MOE_SMALL_VARIANTS_T8="${WG_T8:-wgs8_d64_qt}" \
  python3 bench/moe/bench_small.py --out "$OUT" --ts "${WG_TS:-1,2,4,8}"
# WG_STEPS=trace: bench/moe/wg_trace.py, per-program %globaltimer stamps of the shipped wg tiles at T = 1, 2, 4
step trace "${WG_TRACE_S:-60}" python3 bench/moe/wg_trace.py --out "$OUT" --ts "${WG_TRACE_TS:-1,2,4}" \
  --tiles "${WG_TRACE_TILES:-}"
step tests "${WG_TEST_S:-60}" python3 -m pytest -q -n 2 -p no:cacheprovider --noconftest -o addopts="" \
  tests/kernels/test_moe_small_wg_gpu.py --junitxml "$OUT/wg-tests.xml"
# the picks as the default (through the env override), then what a default change must pass, and the engine rows
step pick 150 sh -c 'rule=$(python3 bench/moe/pick_small.py "$1/moe-small.json" "$1/wg-tests.xml") || exit 1
  base=$(python3 bench/moe/pick_small.py --shipped "${WG_TS:-1,2,4,8}")
  echo "picked: $rule (shipped: $base)"
  [ "$rule" = "$base" ] && { echo "nothing beats the shipped tiles"; exit 0; }
  export DAYZERO_MOE_SMALL_TILES="$rule"
  python3 -m pytest -q -n 2 -p no:cacheprovider --noconftest -o addopts="" \
    tests/kernels/test_moe_small_gpu.py -k "registered or graph_replay or override" || exit 1
  python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" tests/kernels/test_cuda_graph_gpu.py \
    tests/kernels/test_engine_triton_gpu.py || exit 1
  for m in 20b 120b; do
    python3 -m dayzero bench decode --model $m --batch 1,64 --context 1024 --steps 16 --json "$1/bench-decode-$m.json" \
      2>&1 | grep -E "^decode" || exit 1
  done' _ "$OUT"
exit $rc
