#!/usr/bin/env bash
# The lead's closing device call: every GPU test file on the tree as it is, in parallel processes
# (Triton compiles on the host's cores; the tests are small on the GPU), then the engine numbers
# (20B and 120B prefill 8192 tokens, decode batch 1 and 64 in CUDA graphs, 20B decode with three
# q/k/v GEMMs beside the stacked one). Writes under $OUT: <test file>.xml / .log, tests.txt,
# final.log, bench-*.json.
#   FINAL_STEPS   steps (default: tests,prefill20,decode20,qkv3,prefill120,decode120)
#   FINAL_TEST_S  cap of the parallel test phase (default 200 s)
#   DAYZERO_DEADLINE (epoch seconds) shortens every bench step so the call ends by then.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="shared${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export DAYZERO_COMMIT="${DAYZERO_COMMIT:-$(cat .devmeta/commit 2>/dev/null || echo unknown)}"
OUT="${OUT:-out}"
mkdir -p "$OUT"
log="$OUT/final.log"
steps=",${FINAL_STEPS:-tests,prefill20,decode20,qkv3,prefill120,decode120},"
rc=0
source bench/steps.sh

run_tests() {
  local pids=() f n
  for f in tests/kernels/test_*_gpu.py; do
    n=$(basename "$f" .py)
    timeout "${FINAL_TEST_S:-200}" python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" \
      --junitxml="$OUT/$n.xml" "$f" >"$OUT/$n.log" 2>&1 &
    pids+=($!)
  done
  local bad=0 p
  for p in "${pids[@]}"; do wait "$p" || bad=1; done
  for f in tests/kernels/test_*_gpu.py; do
    n=$(basename "$f" .py)
    echo "$n: $(tail -n 1 "$OUT/$n.log")"
  done | tee "$OUT/tests.txt"
  return $bad
}

export OUT FINAL_TEST_S="${FINAL_TEST_S:-200}"
export -f run_tests
step tests $(( FINAL_TEST_S + 10 )) bash -c run_tests
step prefill20 70 python3 -m dayzero bench prefill --model 20b --tokens 8192 --repeat 5 --breakdown \
  --json "$OUT/bench-prefill-20b.json"
step decode20 80 python3 -m dayzero bench decode --model 20b --batch 1,64 --context 1024 --steps 32 --graphs on \
  --breakdown --json "$OUT/bench-decode-20b.json"
step qkv3 60 env DAYZERO_FUSED_QKV=0 python3 -m dayzero bench decode --model 20b --batch 1,64 --context 1024 \
  --steps 32 --graphs on --json "$OUT/bench-decode-20b-qkv3.json"
step prefill120 80 python3 -m dayzero bench prefill --model 120b --tokens 8192 --repeat 3 \
  --json "$OUT/bench-prefill-120b.json"
step decode120 80 python3 -m dayzero bench decode --model 120b --batch 1,64 --context 1024 --steps 16 --graphs on \
  --json "$OUT/bench-decode-120b.json"
echo "final: rc=$rc" | tee -a "$log"
exit $rc
