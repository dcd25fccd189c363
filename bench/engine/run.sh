#!/usr/bin/env bash
# Engine on the GPU in one go: the norm/rope and CUDA-graph GPU tests, then `dayzero bench prefill`
# (20B, 120B at 8192 tokens) and `dayzero bench decode` (batch 1 and 64, graph and eager rows).
# Writes under $OUT: engine.log, engine-tests.xml, bench-{prefill,decode}-{20b,120b}.json.
# ENGINE_STEPS selects steps (default: all): tests,prefill20,decode20,prefill120,decode120; the
# decode20gemv / decode120gemv steps (not in the default) repeat decode with the small-M linear
# through triton_gemv (DAYZERO_SMALL_M_LINEAR=gemv), written to bench-decode-<model>-gemv.json; decode20qkv3
# (not in the default) repeats decode with three q/k/v GEMMs (DAYZERO_FUSED_QKV=0) -> bench-decode-20b-qkv3.json.
# DAYZERO_DEADLINE (epoch seconds, optional) shortens every step's time cap so the run ends by then.
# .devmeta/commit (git-excluded; name .devmeta in the device call's `carry`) gives the commit.
set -u
cd "$(dirname "$0")/../.."
source bench/steps.sh
bench_env engine.log
steps=",${ENGINE_STEPS:-tests,prefill20,decode20,prefill120,decode120},"
step tests 150 python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" --junitxml="$OUT/engine-tests.xml" \
  tests/kernels/test_norm_rope_gpu.py tests/kernels/test_cuda_graph_gpu.py tests/kernels/test_engine_triton_gpu.py
step prefill20 60 python3 -m dayzero bench prefill --model 20b --tokens 8192 --repeat 5 --breakdown \
  --json "$OUT/bench-prefill-20b.json"
step decode20 80 python3 -m dayzero bench decode --model 20b --batch 1,64 --context 1024 --steps 32 --graphs both \
  --breakdown --json "$OUT/bench-decode-20b.json"
step decode20gemv 80 env DAYZERO_SMALL_M_LINEAR=gemv python3 -m dayzero bench decode --model 20b --batch 1,64 \
  --context 1024 --steps 32 --graphs both --json "$OUT/bench-decode-20b-gemv.json"
step decode20qkv3 80 env DAYZERO_FUSED_QKV=0 python3 -m dayzero bench decode --model 20b --batch 1,64 \
  --context 1024 --steps 32 --graphs on --json "$OUT/bench-decode-20b-qkv3.json"
step prefill120 80 python3 -m dayzero bench prefill --model 120b --tokens 8192 --repeat 3 \
  --json "$OUT/bench-prefill-120b.json"
step decode120 90 python3 -m dayzero bench decode --model 120b --batch 1,64 --context 1024 --steps 16 --graphs both \
  --json "$OUT/bench-decode-120b.json"
step decode120gemv 90 env DAYZERO_SMALL_M_LINEAR=gemv python3 -m dayzero bench decode --model 120b --batch 1,64 \
  --context 1024 --steps 16 --graphs both --json "$OUT/bench-decode-120b-gemv.json"
echo "engine: rc=$rc" | tee -a "$log"
exit $rc
