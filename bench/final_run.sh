#!/usr/bin/env bash
# The lead's closing device call: every GPU test file on the tree as it is, in parallel processes
# (Triton compiles on the host's cores; the tests are small on the GPU), then the engine numbers,
# one model build each (`dayzero bench all`): 20B and 120B prefill 8192 tokens, decode batch 1 and
# 64 in CUDA graphs, 20B decode also with three q/k/v GEMMs, 20B per-op breakdown. Writes under
# $OUT: <test file>.xml / .log, tests.txt, final.log, bench-all-{20b,120b}.json.
#   FINAL_STEPS   steps (default: tests,b20,b120)
#   FINAL_TESTS   test files (default: every tests/kernels/test_*_gpu.py)
#   FINAL_XDIST   pytest-xdist workers per file, e.g. test_moe_small_gpu=2,test_attention_gpu=4
#   FINAL_TEST_S  cap of the parallel test phase (default 200 s)
#   DAYZERO_DEADLINE (epoch seconds) shortens every bench step so the call ends by then.
set -u
cd "$(dirname "$0")/.."
source bench/steps.sh
bench_env final.log
steps=",${FINAL_STEPS:-tests,b20,b120},"

run_tests() {
  local pids=() f n
  for f in ${FINAL_TESTS:-tests/kernels/test_*_gpu.py}; do
    n=$(basename "$f" .py)
    local x; x=$(echo ",${FINAL_XDIST:-}," | grep -o ",$n=[0-9]*" | cut -d= -f2)
    timeout "${FINAL_TEST_S:-200}" python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" \
      ${x:+-n $x} --junitxml="$OUT/$n.xml" "$f" >"$OUT/$n.log" 2>&1 &
    pids+=($!)
  done
  local bad=0 p
  for p in "${pids[@]}"; do wait "$p" || bad=1; done
  for f in ${FINAL_TESTS:-tests/kernels/test_*_gpu.py}; do
    n=$(basename "$f" .py)
    echo "$n: $(tail -n 1 "$OUT/$n.log")"
  done | tee "$OUT/tests.txt"
  return $bad
}

export OUT FINAL_XDIST="${FINAL_XDIST:-}" FINAL_TESTS="${FINAL_TESTS:-}" FINAL_TEST_S="${FINAL_TEST_S:-200}"
export -f run_tests
step tests $(( FINAL_TEST_S + 10 )) bash -c run_tests
step b20 ${FINAL_B20_S:-150} python3 -m dayzero bench all --model 20b --tokens 8192 --repeat 3 --batch 1,64 --context 1024 \
  --steps 16 --graphs on --qkv both --breakdown --json "$OUT/bench-all-20b.json"
step b120 ${FINAL_B120_S:-150} python3 -m dayzero bench all --model 120b --tokens 8192 --repeat 2 --batch 1,64 \
  --context 1024 --steps 8 --graphs on --json "$OUT/bench-all-120b.json"
echo "final: rc=$rc" | tee -a "$log"
exit $rc
