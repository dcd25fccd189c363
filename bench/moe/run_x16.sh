#!/usr/bin/env bash
# Decode-MoE gate_up with fp16 products (``SplitTiles.x16``, the ``*_x16`` tiles; bench/NOTES.md "MoE decode: x16")
# on the GPU in one call of <= 170 s: bench_small.py at T = 2, 4, 8, 16, 32, 64 timing each shipped tile beside the
# x16 twins in the same process (E = 32 and 128), then the GPU tests of the x16 tiles (reference at every T on both
# models, graph replay == eager bitwise) and the registered op under DAYZERO_MOE_SMALL_TILES with x16 above 16 pairs.
# Writes $OUT/moe-x16.log, $OUT/moe-small.json, $OUT/x16-tests.xml. Carry .devmeta.
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env moe-x16.log
export DAYZERO_DEADLINE="${DAYZERO_DEADLINE:-$(( $(date +%s) + 165 ))}"
steps=",${X16_STEPS:-bench,tests,registered},"
# T = 2 and 4: the shipped GEMV gate_up tiles beside MMA tiles whose gate_up was F2F-bound (k1_d64_r, bn64_r) and twins
step bench 95 env MOE_SMALL_VARIANTS_T2="gvq2_d64_rp,k1_d64_r,k1_d64_r_x16" \
  MOE_SMALL_VARIANTS_T4="gvqt8_d32_rp,k1_d64_r,k1_d64_r_x16,bn64_r,bn64_r_x16" \
  MOE_SMALL_VARIANTS_T8="bn64_r,bn64_r_x16" MOE_SMALL_VARIANTS_T16="bn64,bn64_x16,bn64_r,bn64_r_x16" \
  MOE_SMALL_VARIANTS_T32="bn64,bn64_x16" MOE_SMALL_VARIANTS_T64="bn64,bn64_x16,g64_d128,g64_d128_x16" \
  python3 bench/moe/bench_small.py --out "$OUT" --ts "${X16_TS:-2,4,8,16,32,64}"
tiles="gvq_d32_r@4,gvq2_d64_rp@8,gvqt8_d32_rp@16,bn64_r_x16@32,bn64_x16"
step tests 55 env DAYZERO_MOE_SMALL_TEST_TS=1,2,7,16,33,64 python3 -m pytest -q -n 3 -p no:cacheprovider --noconftest \
  -o addopts="" tests/kernels/test_moe_small_gpu.py --junitxml "$OUT/x16-tests.xml" \
  -k "(split_vs_reference and x16) or (graph_replay and x16)"
step registered 30 env DAYZERO_MOE_SMALL_TILES="$tiles" python3 -m pytest -q -p no:cacheprovider --noconftest \
  -o addopts="" tests/kernels/test_moe_small_gpu.py -k "registered"
exit $rc
