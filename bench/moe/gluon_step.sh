#!/usr/bin/env bash
# The gluon step of bench/moe/run.sh (MOE_STEPS=gluon): GPU tests, then up to three bench_gluon.py runs,
# each capped (timeout -k: a hung kernel must not eat the call). $1 = OUT.
#   MOE_GLUON_TESTS   pytest selection (default: tests/kernels/test_moe_gluon_gpu.py); MOE_GLUON_TEST_S cap
#   MOE_GLUON_ARGS / MOE_GLUON_NAME / MOE_GLUON_BENCH_S           first bench run (always)
#   MOE_GLUON_ARGS2 / MOE_GLUON_NAME2 / MOE_GLUON_BENCH2_S        second, MOE_GLUON_ARGS3 / ... third (if set)
#   MOE_GLUON_SMI=1   log the GPU's SM clock, power and temperature every 200 ms (nvidia-smi queries only)
#                     into gluon-smi.csv while the step runs (are long GEMM runs power-capped?)
out=$1
r=0
smi=""
if [ "${MOE_GLUON_SMI:-0}" = 1 ] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,utilization.gpu \
    --format=csv -lms 200 >"$out/gluon-smi.csv" 2>&1 &
  smi=$!
fi
timeout -k 3 "${MOE_GLUON_TEST_S:-150}" python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" \
  --timeout 60 --timeout-method thread ${MOE_GLUON_TESTS:-tests/kernels/test_moe_gluon_gpu.py} >"$out/gluon-tests.log" 2>&1 || r=1
cat "$out/gluon-tests.log"
grep -q Timeout "$out/gluon-tests.log" && r=1
bench() {  # ARGS NAME CAP
  MOE_GLUON_NAME="$2" timeout -k 3 "$3" python3 bench/moe/bench_gluon.py --out "$out" $1 || r=1
}
bench "${MOE_GLUON_ARGS:-}" "${MOE_GLUON_NAME:-moe-gluon}" "${MOE_GLUON_BENCH_S:-170}"
[ -n "${MOE_GLUON_ARGS2:-}" ] && bench "$MOE_GLUON_ARGS2" "${MOE_GLUON_NAME2:-moe-gluon-2}" "${MOE_GLUON_BENCH2_S:-120}"
[ -n "${MOE_GLUON_ARGS3:-}" ] && bench "$MOE_GLUON_ARGS3" "${MOE_GLUON_NAME3:-moe-gluon-3}" "${MOE_GLUON_BENCH3_S:-120}"
[ -n "$smi" ] && kill "$smi"
exit $r
