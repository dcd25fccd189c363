#!/usr/bin/env bash
# Gluon MoE run 10 (folded tails, GluonConfig.fold): one device call of <= 150 s. GPU tests of the fold
# kernel (tests/kernels/test_moe_gluon_mixed_gpu.py, 3 workers, capped at 60 s), then bench_gluon.py at
# 8192 tokens x top-4 for 120B (128 experts) and 20B (32): each variant's CUDA-graph layer time, random and
# balanced routing, and the layer graphs replayed in turns (interleaved): fold16 (tails <= 64 rows), fold16_all
# (any tail that fits) against the shipped op (BM128) and
# BM128 at the fold's register split (gluon128_r240: the register split alone). Writes under $OUT: moe.log,
# gluon-tests.log, gluon-smi.csv, moe-gluon-run10.json. Carry .devmeta (git rev-parse HEAD > .devmeta/commit).
set -u
cd "$(dirname "$0")/../.."
V=op,gluon128_fold16,gluon128_fold16_all,gluon128_r240
MOE_STEPS=gluon MOE_GLUON_TIMEOUT=148 MOE_GLUON_SMI=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
MOE_GLUON_TEST_S=60 MOE_GLUON_TESTS="-n 3 tests/kernels/test_moe_gluon_mixed_gpu.py" \
MOE_GLUON_NAME=moe-gluon-run10 MOE_GLUON_BENCH_S=84 \
MOE_GLUON_ARGS="--experts 128,32 --variants $V --balanced-variants op,gluon128_fold16 --interleave $V --interleave-reps 24" \
  exec bash bench/moe/run.sh
