#!/usr/bin/env bash
# Gluon ping-pong causal prefill (gluon_attention_prefill, opt-in) on the GPU in one device call (issue 5):
# per configuration of RUN_CONFIGS (or GLUON_CONFIGS=a,b), in its own processes so that one that hangs or
# faults is cut by its own timeout: the GPU tests of tests/kernels/test_attention_gluon_gpu.py for it
# (GLUON_TEST_S, default 150 s), then, if they passed, its timing beside the shipped Triton prefill at
# 8k / 32k / 128k (gluon_prefill_bench.py, GLUON_BENCH_S, default 180 s). First the configuration-free
# tests (bad input, schedule emulation). Writes $OUT/gluon_prefill.log, $OUT/gluon_prefill.json (every
# configuration's rows; meta: commit, GPU, date) and $OUT/gluon_prefill_parts.tgz (per-configuration
# JSONs and pytest logs). Copy gluon_prefill.json to bench/results/gluon-prefill-<date>.json afterwards.
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env gluon_prefill.log
cfgs="${GLUON_CONFIGS:-$(python3 -c 'from dayzero.kernels.gluon_attention_prefill import RUN_CONFIGS as c; print(",".join(c))')}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv | tee "$log"
parts="$OUT/parts"
mkdir -p "$parts"
# pytest on the test file, quiet, no cache, the repository's conftest not needed (an array: timeout runs it)
pt=(python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" tests/kernels/test_attention_gluon_gpu.py)
echo "=== tests without a configuration" | tee -a "$log"
DAYZERO_GLUON_CFGS=pp2 timeout 120 "${pt[@]}" -k "schedule or tile_plan or protocol or unsupported or run_configs" 2>&1 | tee -a "$log"
for c in ${cfgs//,/ }; do
  echo "=== $c: tests ($(date -u +%H:%M:%S))" | tee -a "$log"
  DAYZERO_GLUON_CFGS=$c timeout "${GLUON_TEST_S:-150}" "${pt[@]}" -k "ragged or long or emulation_bitwise" > "$parts/test-$c.log" 2>&1
  trc=$?
  tail -n 15 "$parts/test-$c.log" | tee -a "$log"
  echo "=== $c: tests rc=$trc" | tee -a "$log"
  if [ "$trc" != 0 ]; then rc=1; continue; fi
  mkdir -p "$parts/$c"
  timeout "${GLUON_BENCH_S:-180}" python3 bench/attention/gluon_prefill_bench.py --out "$parts/$c" --configs "$c" 2>&1 | tee -a "$log"
  brc=${PIPESTATUS[0]}
  echo "=== $c: bench rc=$brc" | tee -a "$log"
  [ "$brc" = 0 ] || rc=1
done
python3 - "$parts" "$OUT/gluon_prefill.json" <<'PY' 2>&1 | tee -a "$log"
import json, pathlib, sys
docs = [json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*/gluon_prefill.json"))]
if docs:
    merged = dict(meta=docs[0]["meta"], shape=docs[0]["shape"], rows=[r for d in docs for r in d["rows"]],
                  errors=[e for d in docs for e in d["errors"]])
    pathlib.Path(sys.argv[2]).write_text(json.dumps(merged, indent=1) + "\n")
    print(f"merged {len(docs)} configurations, {len(merged['rows'])} rows")
else:
    print("no timing rows")
PY
tar czf "$OUT/gluon_prefill_parts.tgz" -C "$OUT" parts && rm -rf "$parts"
echo "gluon prefill: rc=$rc" | tee -a "$log"
exit "$rc"
