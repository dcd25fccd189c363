#!/usr/bin/env bash
# One device call for the closing numbers: FlashInfer's JIT builds start in the background (CPU),
# the GPU tests run meanwhile (final_run.sh step tests), then, once the builds are done, the same-run
# FlashInfer / SDPA attention comparison from the cache and the engine numbers (steps b20, b120;
# DAYZERO_DEADLINE shortens or skips what does not fit).
# Only 8 files come back from a call: the per-file test logs and junit files are packed into
# $OUT/final-tests.tgz. Needs .whl carried (bench/peers_install.sh) for the FlashInfer part.
#   FINAL_FI_BUILD_S  cap of the background builds (default 300 s); FINAL_FI_S cap of the comparison (150 s)
#   FINAL_EXTRA       a command run after the tests, beside the builds (FINAL_EXTRA_S cap, default 100 s)
set -u
cd "$(dirname "$0")/.."
real_out="${OUT:-out}"
mkdir -p "$real_out"
work=$(mktemp -d)
export PYTHONPATH="shared${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
source bench/peers_install.sh >"$real_out/call.log" 2>&1
fi_ok=0
python3 -c "import flashinfer" 2>/dev/null && fi_ok=1
if [ "$fi_ok" = 1 ]; then
  mkdir -p "$work/fi"
  timeout "${FINAL_FI_BUILD_S:-300}" python3 bench/attention/flashinfer_compare.py --out "$work/fi" --build-only \
    --budget-s "${FINAL_FI_BUILD_S:-300}" --build-s $(( ${FINAL_FI_BUILD_S:-300} - 10 )) --jit-workers 4 \
    >"$work/fi/build.log" 2>&1 &
  build_pid=$!
fi
OUT="$work/final" FINAL_STEPS=tests bash bench/final_run.sh >>"$real_out/call.log" 2>&1
rc=$?
# FINAL_EXTRA: one more command (e.g. an area's run.sh) while the FlashInfer builds go on, capped at
# FINAL_EXTRA_S (default 100 s), its $OUT packed into final-tests.tgz (extra/); it does not change rc
if [ -n "${FINAL_EXTRA:-}" ]; then
  mkdir -p "$work/extra"
  echo "extra: $FINAL_EXTRA ($(date -u +%T))" >>"$real_out/call.log"
  OUT="$work/extra" timeout "${FINAL_EXTRA_S:-100}" bash -c "$FINAL_EXTRA" >"$work/extra/extra.log" 2>&1
  echo "extra rc=$? ($(date -u +%T))" >>"$real_out/call.log"
  tail -n 30 "$work/extra/extra.log" >>"$real_out/call.log"
fi
if [ "$fi_ok" = 1 ]; then
  echo "waiting for the FlashInfer builds ($(date -u +%T))" >>"$real_out/call.log"
  wait "$build_pid"; echo "builds rc=$? ($(date -u +%T))" >>"$real_out/call.log"
  tail -n 6 "$work/fi/build.log" >>"$real_out/call.log"
fi
if [ "$fi_ok" = 1 ]; then
  timeout "${FINAL_FI_S:-150}" python3 bench/attention/flashinfer_compare.py --out "$real_out" \
    --budget-s $(( ${FINAL_FI_S:-150} - 15 )) --build-s 60 --decode "${FINAL_FI_DECODE:-1:8192,1:32768,1:131072,8:1024,256:131072}" >>"$real_out/call.log" 2>&1 || rc=1
fi
OUT="$work/final" FINAL_STEPS=b20,b120 bash bench/final_run.sh >>"$real_out/call.log" 2>&1 || rc=1
cp "$work"/final/bench-all-*.json "$real_out"/ 2>/dev/null
cp "$work/final/final.log" "$real_out/final.log" 2>/dev/null
tar czf "$real_out/final-tests.tgz" -C "$work" final fi extra 2>/dev/null
echo "final_call rc=$rc" >>"$real_out/call.log"
exit $rc
