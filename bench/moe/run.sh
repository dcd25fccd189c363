#!/usr/bin/env bash
# FP8 linear / MoE / router on the GPU in one go: GPU tests, kernel benchmarks with same-run anchors,
# then the end-to-end engine runs (HF comparison at 2048 tokens, `dayzero bench prefill|decode`).
# Writes under $OUT: moe.log, moe-kernels.json, e2e-hf-20b.json, bench-{prefill,decode}-<model>.json.
# MOE_STEPS selects steps (default: all): tests,kernels,e2e,prefill20,decode20,prefill120,decode120.
# .devmeta/ is git-excluded: name it in the device call's `carry` so the results record the commit
# (runs 1-3 did not: their JSON says "HEAD"/"unknown"; bench/NOTES.md maps them to commits).
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env moe.log
steps=",${MOE_STEPS:-tests,kernels,prefill20,decode20,e2e,prefill120,decode120},"
# MOE_TEST_ARGS: pytest selection for the tests step (default: both files, every test)
step tests "${MOE_TEST_TIMEOUT:-130}" python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" \
  ${MOE_TEST_ARGS:-tests/kernels/test_linear_gpu.py tests/kernels/test_moe_gpu.py}
step kernels "${MOE_KERNEL_TIMEOUT:-170}" python3 bench/moe/bench_kernels.py --out "$OUT" ${MOE_KERNEL_ARGS:-}
step prefill20 60 python3 -m dayzero bench prefill --model 20b --tokens 8192 --repeat 5 --breakdown \
  --json "$OUT/bench-prefill-20b.json"
step decode20 70 python3 -m dayzero bench decode --model 20b --batch 1,64 --context 1024 --steps 32 --breakdown \
  --json "$OUT/bench-decode-20b.json"
step prefill120 90 python3 -m dayzero bench prefill --model 120b --tokens 8192 --repeat 3 --breakdown \
  --json "$OUT/bench-prefill-120b.json"
step e2e 260 python3 bench/moe/e2e_hf.py --out "$OUT" --model 20b --tokens 2048 --budget-s 240
step decode120 90 python3 -m dayzero bench decode --model 120b --batch 1,64 --context 1024 --steps 16 --breakdown \
  --json "$OUT/bench-decode-120b.json"
# decode MoE (not in the default list: MOE_STEPS=small): bench first (its worker processes fill Triton's
# cache for the tests too), then the GPU tests of the split-K path over 2 pytest-xdist workers (each builds ~37 GB of test experts)
step small "${MOE_SMALL_TIMEOUT:-230}" sh -c 'timeout "${MOE_SMALL_BENCH_S:-130}" python3 bench/moe/bench_small.py --out "$1" ${MOE_SMALL_ARGS:-}; r=$?; timeout "${MOE_SMALL_TEST_S:-95}" python3 -m pytest -q -n 2 -p no:cacheprovider --noconftest -o addopts="" tests/kernels/test_moe_small_gpu.py -k "${MOE_SMALL_TEST_K:-split or registered}" --junitxml "$1/small-tests.xml" || r=1; exit $r' _ "$OUT"
# after a change of the decode MoE default (MOE_STEPS=small,small_graph): the engine's CUDA-graph decode test;
# MOE_SMALL_PICK=1: first the split tiles that won in this call's bench (pick_small.py) become the default
# through DAYZERO_MOE_SMALL_TILES, and the registered-op / graph-replay tests of the decode MoE run on them too
step small_graph "${MOE_SMALL_GRAPH_S:-90}" sh -c 'if [ -n "${MOE_SMALL_PICK:-}" ]; then
    xml=""; [ -f "$1/small-tests.xml" ] && xml="$1/small-tests.xml"
    DAYZERO_MOE_SMALL_TILES=$(python3 bench/moe/pick_small.py "$1/moe-small.json" $xml) || exit 1
    export DAYZERO_MOE_SMALL_TILES; echo "picked tiles: $DAYZERO_MOE_SMALL_TILES"
    python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" tests/kernels/test_moe_small_gpu.py \
      -k "registered or graph_replay or override" || exit 1
  fi
  python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" tests/kernels/test_cuda_graph_gpu.py' _ "$OUT"
# ncu of the T = 1 split-K gate_up kernel (default tiles, then g64_d128) where ncu is installed (MOE_STEPS=...,small_ncu): $OUT/ncu-small.txt
step small_ncu "${MOE_SMALL_NCU_S:-60}" sh -c 'command -v ncu >/dev/null || { echo "ncu: not installed"; exit 0; }; ncu --clock-control none --kernel-name regex:gate_up --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats python3 bench/moe/profile_small.py >"$1/ncu-small.txt" 2>&1; r=$?; grep -v "^==PROF==" "$1/ncu-small.txt" | tail -170; exit $r' _ "$OUT"
step gluon "${MOE_GLUON_TIMEOUT:-330}" bash bench/moe/gluon_step.sh "$OUT"  # Gluon warp-specialised prefill GEMMs (not in the default list: MOE_STEPS=gluon; knobs in gluon_step.sh)
echo "moe: rc=$rc" | tee -a "$log"
exit $rc
