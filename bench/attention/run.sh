#!/usr/bin/env bash
# Attention on the GPU in one go: the GPU tests, then the benchmark.
# Writes $OUT/attention.json (results + meta) and $OUT/attention.log (test + bench output).
# Extra arguments go to bench_attention.py (e.g. --quick, --skip decode).
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env attention.log
# tests compile dozens of kernel variants: spread them over 8 workers when pytest-xdist is there
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" $xdist tests/kernels/test_attention_gpu.py 2>&1 | tee "$log"
tests_rc=${PIPESTATUS[0]}
python3 bench/attention/bench_attention.py --out "$OUT" "$@" 2>&1 | tee -a "$log"
bench_rc=${PIPESTATUS[0]}
python3 -c "import flashinfer" 2>/dev/null && python3 bench/attention/flashinfer_compare.py --out "$OUT" ${FLASHINFER_ARGS:-} 2>&1 | tee -a "$log"  # FlashInfer beside ours (source bench/peers_install.sh first)
echo "attention: tests rc=$tests_rc bench rc=$bench_rc" | tee -a "$log"
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
