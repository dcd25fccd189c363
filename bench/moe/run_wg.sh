#!/usr/bin/env bash
# The FP8 tensor-core decode-MoE candidates (``triton_moe_small_wg``, bench/NOTES.md "MoE decode run 12") on the
# GPU in one call of <= 150 s: their GPU tests (reference at T = 1-2 on both models, EP slices, no-local zeros,
# graph replay == eager), then ``bench_small.py`` timing them at T = 1 and 2 beside the shipped tiles
# (gvq_d32_r / gvq2_d64_rp) in the same process, and the sm_90 build numbers of the candidates.
# Writes $OUT/moe-wg.log, $OUT/wg-tests.xml, $OUT/moe-small.json (bench_small's). Carry .devmeta.
#   bash bench/moe/run_wg.sh            (WG_STEPS=tests,bench: both; WG_TS=1,2)
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env moe-wg.log
export DAYZERO_DEADLINE="${DAYZERO_DEADLINE:-$(( $(date +%s) + 145 ))}"
steps=",${WG_STEPS:-tests,bench},"
wg=$(python3 -c "from dayzero.kernels.triton_moe_small_wg import WG_VARIANTS; print(','.join(n for n in WG_VARIANTS if not n.startswith('wg2')))")
# bench first (its compile workers fill Triton's cache for the tests too); T = 1: the wg2 tiles are wg_d64_s2(_q)
# there; T = 2: only the wg2 tiles run wg kernels
step bench 80 env MOE_SMALL_VARIANTS_T1="gvq_d32_r,$wg" MOE_SMALL_VARIANTS_T2="gvq2_d64_rp,gvq2_d64_r,wg2_d64_s2,wg2_d64_s2_q" \
  python3 bench/moe/bench_small.py --out "$OUT" --ts "${WG_TS:-1,2}"
step tests 55 python3 -m pytest -q -n 2 -p no:cacheprovider --noconftest -o addopts="" \
  tests/kernels/test_moe_small_wg_gpu.py --junitxml "$OUT/wg-tests.xml"
exit $rc
