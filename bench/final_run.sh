#!/usr/bin/env bash
# The lead's closing device call: every GPU test file on the tree as it is, mostly in parallel processes
# (Triton compiles on the host's cores; the tests are small on the GPU), then the engine numbers,
# one model build each (`dayzero bench all`): 20B and 120B prefill 8192 tokens, decode batch 1 and
# 64 in CUDA graphs, 20B decode also with three q/k/v GEMMs, 20B per-op breakdown. Writes under
# $OUT: <test file>.xml / .log, tests.txt, final.log, bench-all-{20b,120b}.json.
#   FINAL_STEPS   steps (default: tests,b20,b120)
#   FINAL_TESTS   test files (default: every tests/kernels/test_*_gpu.py)
#   FINAL_SERIAL  test file names run one by one after the parallel ones (default: the two MoE files)
#   FINAL_XDIST   pytest-xdist workers per file, e.g. test_moe_small_gpu=2,test_attention_gpu=4
#   FINAL_TEST_S  cap of the parallel test phase (default 200 s)
#   DAYZERO_DEADLINE (epoch seconds) shortens every bench step so the call ends by then.
set -u
cd "$(dirname "$0")/.."
source bench/steps.sh
bench_env final.log
steps=",${FINAL_STEPS:-tests,b20,b120},"

one_test() {  # one_test FILE: pytest on it (FINAL_XDIST workers if named), log and junit under $OUT
  local n x; n=$(basename "$1" .py)
  x=$(echo ",${FINAL_XDIST:-}," | grep -o ",$n=[0-9]*" | cut -d= -f2)
  # one or two CPU threads a test process (FINAL_TEST_OMP): the CPU emulation tests of the Gluon attention files
  # crawled under a dozen test processes at torch's default thread count (session 6: cut by the cap)
  OMP_NUM_THREADS="${FINAL_TEST_OMP:-2}" timeout "${FINAL_TEST_S:-200}" python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" \
    ${x:+-n $x} --junitxml="$OUT/$n.xml" "$1" >"$OUT/$n.log" 2>&1
}

run_tests() {
  # files named in FINAL_SERIAL run one by one after the others (the MoE tests build up to ~20 GB
  # of experts each: run beside six other test processes, 21 of them failed in the final run of
  # 2026-11-30 and all passed alone)
  local pids=() f bad=0 p all="${FINAL_TESTS:-tests/kernels/test_*_gpu.py}"
  local serial=" ${FINAL_SERIAL-test_moe_gpu test_moe_small_gpu} "
  for f in $all; do
    case "$serial" in *" $(basename "$f" .py) "*) continue ;; esac
    one_test "$f" & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || bad=1; done
  for f in $all; do
    case "$serial" in *" $(basename "$f" .py) "*) one_test "$f" || bad=1 ;; esac
  done
  for f in $all; do
    echo "$(basename "$f" .py): $(tail -n 1 "$OUT/$(basename "$f" .py).log")"
  done | tee "$OUT/tests.txt"
  return $bad
}

export OUT FINAL_SERIAL="${FINAL_SERIAL-test_moe_gpu test_moe_small_gpu}" FINAL_XDIST="${FINAL_XDIST:-}" FINAL_TESTS="${FINAL_TESTS:-}" FINAL_TEST_S="${FINAL_TEST_S:-200}"
export -f one_test run_tests
step tests $(( 3 * FINAL_TEST_S )) bash -c run_tests
step b20 ${FINAL_B20_S:-150} python3 -m dayzero bench all --model 20b --tokens 8192 --repeat 3 --batch 1,64 --context 1024 \
  --steps 16 --graphs on --qkv both --breakdown --json "$OUT/bench-all-20b.json"
step b120 ${FINAL_B120_S:-150} python3 -m dayzero bench all --model 120b --tokens 8192 --repeat 2 --batch 1,64 \
  --context 1024 --steps 8 --graphs on --json "$OUT/bench-all-120b.json"
echo "final: rc=$rc" | tee -a "$log"
exit $rc
