#!/usr/bin/env bash
# The CPU-built candidates of sessions 6 and 7, tested and timed on the GPU in one call per area (attention <= ~545 s, moe <= ~500 s, peers ~250 s warm):
#   bash bench/candidates.sh attention   decode TMA presets (attention/run_s6b.sh), then the Gluon window's
#                                        K/V group ring pk3sr* beside pk3s (attention/gluon_window_run.sh), then
#                                        the small-M linear's product modes (linear/run.sh)
#   bash bench/candidates.sh moe         the decode-MoE tensor-core tiles at T = 1-8 (moe/run_wg.sh: the slot
#                                        kernels beside the shipped tiles, tests, pick -> engine graph tests and
#                                        decode rows); MOE_PARTS=wg,x16 adds session 8's x16 part
#   bash bench/candidates.sh peers       the HF transformers peer beside the engine (peers_run.sh, ~240 s)
#   bash bench/candidates.sh fi          FlashInfer's fa2 / fa3 JIT builds alone, into .fi-ws (carry .whl; run it
#                                        right before bench/closing_call.sh on the same warm machine, which then loads them)
#   bash bench/candidates.sh tables      the issues' target tables at one commit (shipped kernels only, FlashInfer
#                                        fa2 / fa3 and SDPA on the whole decode grid; carry .whl): bench/targets_table.py
# Each part runs in its own $OUT/<part> folder under its own deadline; at the end every part's files are
# packed into $OUT/<part>.tgz (at most 8 files come back from a call: candidates.log and one .tgz a part).
# Carry .devmeta (git rev-parse HEAD > .devmeta/commit). Decision rules: bench/NOTES.md, per candidate;
# python3 bench/candidates_summary.py <the .tgz files> puts each case's times beside the shipped one.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="shared${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-out}"
mkdir -p "$OUT"
area="${1:?usage: bench/candidates.sh attention|moe|peers|fi|fi10|s9a|s9b|s11a|tables}"
rc=0
part() {  # part NAME DEADLINE_S CMD...
  local name=$1 cap=$2; shift 2
  mkdir -p "$OUT/$name"
  echo "=== $name ($(date -u +%H:%M:%S), cap ${cap}s)" | tee -a "$OUT/candidates.log"
  OUT="$OUT/$name" DEADLINE_S=$cap DAYZERO_DEADLINE=$(( $(date +%s) + cap )) timeout -k 5 $(( cap + 10 )) "$@" \
    > "$OUT/$name/part.log" 2>&1
  local r=$?
  tail -n 15 "$OUT/$name/part.log" >> "$OUT/candidates.log"
  echo "=== $name rc=$r ($(date -u +%H:%M:%S))" | tee -a "$OUT/candidates.log"
  [ "$r" = 0 ] || rc=1
  tar czf "$OUT/$name.tgz" -C "$OUT" "$name" && rm -rf "${OUT:?}/$name"
}
fi_build_start() {  # fi_build_start CAP_S WORKERS: FlashInfer's fa2 / fa3 JIT builds into .fi-ws in the background
  # (niced under the GPU parts; carry .whl); FI_BUILD_S overrides the cap
  local cap=${FI_BUILD_S:-$1}
  source bench/peers_install.sh >> "$OUT/candidates.log" 2>&1
  mkdir -p "$OUT/fi-build"
  nice -n 19 timeout -k 5 "$cap" python3 bench/attention/flashinfer_compare.py --out "$OUT/fi-build" --build-only \
    --budget-s "$cap" --build-s $(( cap - 10 )) --jit-workers "$2" > "$OUT/fi-build/build.log" 2>&1 &
  fi_pid=$!
}
fi_build_wait() {
  wait "$fi_pid"; echo "FlashInfer builds rc=$? ($(date -u +%H:%M:%S))" | tee -a "$OUT/candidates.log"
  tail -n 6 "$OUT/fi-build/build.log" >> "$OUT/candidates.log"
  tar czf "$OUT/fi-build.tgz" -C "$OUT" fi-build && rm -rf "$OUT/fi-build"
}
case "$area" in
  attention)
    # FlashInfer's JIT builds (fa2 / fa3, causal and window 128) in the background meanwhile, into the repository's
    # .fi-ws (kept on a warm machine; niced under the candidates): the closing call's same-run comparison then loads them (.whl carried)
    fi_pid=""
    if ls .whl/*.whl >/dev/null 2>&1; then fi_build_start 380 4; fi
    part decode-tma 145 bash bench/attention/run_s6b.sh
    part window-ring 200 env GLUON_WINDOW_CONFIGS=pk3s,pk3sr,pk3sr6,pk3sr3d,pk3s3d \
      GLUON_WINDOW_REG_CFGS=pk3s,pk3sr,pk3sr6 GLUON_WINDOW_DIAG=pkL3,pkLr,pkL33d,pk3s_ns \
      bash bench/attention/gluon_window_run.sh
    # small-M dense linear (decode q/k/v, o, lm_head): the product modes of session 7 (bf16 shipped, dot16, swap),
    # bench_gemv.py --sweep modes, then tests/kernels/test_gemv_gpu.py
    part gemv 170 bash bench/linear/run.sh
    if [ -n "$fi_pid" ]; then fi_build_wait; fi ;;
  s9a)
    # session 9: decode attention loads before the PDL wait (EARLY_KV / EARLY_TRIGGER presets; NOTES "Session 9,
    # lead"), then the window ring with the consumers' group waits fixed (NOTES "Session 9, helper: the window ring")
    part decode-ekv 170 env PRESET=kernel_strided_n64_hm_ekv2t \
      TEST_K="(decode and not variants) or other_shapes or long_sequences or random_batches or ekv" \
      CONFIGS=default,kernel_strided_n64_hm_ekv1,kernel_strided_n64_hm_ekv2,kernel_strided_n64_hm_ekv1t,kernel_strided_n64_hm_ekv2t \
      PLAN=1:8192,8:1024,1:32768,1:131072,8:8192 DEADLINE_S=165 TEST_CAP_S=75 BENCH_CAP_S=85 bash bench/attention/run_s6b.sh
    part window-ring 190 env GLUON_WINDOW_TEST_S=45 GLUON_WINDOW_CONFIGS=pk3s,pk3sr,pk3sr6 \
      GLUON_WINDOW_REG_CFGS=pk3s,pk3sr,pk3sr6 GLUON_WINDOW_DIAG=pkLr bash bench/attention/gluon_window_run.sh ;;
  s9b)
    # session 9, CPU only (NOTES "Session 9, lead (CPU only ...)"): the decode-MoE wg per-program trace, then the
    # rope early trigger under the shipped and the EARLY_KV decode presets (tests, engine decode rows at 8k context)
    part moe-trace 150 env WG_STEPS=trace,tests bash bench/moe/run_wg.sh
    part rope-trigger 260 bash -c 'set -u; r=0
      python3 -m pytest -q -n 3 -p no:cacheprovider --noconftest -o addopts="" tests/kernels/test_attention_gpu.py \
        -k "triggering or ekv or pdl" || r=1
      for e in 0 1; do DAYZERO_ROPE_TRIGGER=$e DAYZERO_DECODE_ATTENTION=kernel_strided_n64_hm_ekv2t python3 -m pytest \
        -q -p no:cacheprovider --noconftest -o addopts="" tests/kernels/test_cuda_graph_gpu.py || r=1; done
      for a in "DAYZERO_ROPE_TRIGGER=0" "DAYZERO_ROPE_TRIGGER=1" \
               "DAYZERO_ROPE_TRIGGER=1 DAYZERO_DECODE_ATTENTION=kernel_strided_n64_hm_ekv2t"; do
        echo "== $a"; env $a python3 -m dayzero bench decode --model 20b --batch 1,8 --context 8192 --steps 16 \
          2>&1 | grep -E "^decode" || r=1
      done; exit $r' ;;
  fi10)
    # session 10's closing pair, first call: FlashInfer's fa2 / fa3 JIT builds into .fi-ws (niced, carry .whl) while
    # the decode-MoE tiles run on the GPU: the new defaults (T = 2 wg2_d64_s2_qtp_st3, 20B T = 4 wg8_d64_qtp_st2)
    # beside the tiles they replaced, at T = 1, 2, 4, 8 (the session's issue-6 decode table); then bench/closing_call.sh
    fi_build_start 300 8
    part moe-confirm 200 env WG_STEPS=bench WG_BENCH_S=150 WG_T2=wg2_d64_s2_qtp_st3,wg2_d64_s2_qtp \
      WG_T4=wg8_d64_qtp_st2,wg8_d64_qtp bash bench/moe/run_wg.sh
    fi_build_wait ;;
  s11a)
    # built in session 10 after the device time (NOTES "Session 10, lead (CPU only, after the device time)"): the slot
    # kernels of T = 5-8 with shallower rings beside the shipped wgs8_d64_qt, tests, pick (-> engine tests, rows)
    part moe-wgs-st 300 env WG_STEPS=bench,tests,pick WG_TS=8 WG_BENCH_S=90 WG_TEST_S=100 \
      WG_T8=wgs8_d64_qt,wgs8_d64_qt_st3,wgs8_d64_qt_st2 bash bench/moe/run_wg.sh ;;
  tables)
    # the issue-5 / issue-6 target tables at one commit, one call (326 s from a cold start in session 12; carry .whl, .devmeta): FlashInfer's
    # JIT builds (niced) while the GPU times the shipped decode-MoE tiles at T = 1-64, the MoE prefill layer (both
    # routings, 20B and 120B), the dense FP8 linears and the window layer (graphs vs the QKVO floor); then FlashInfer
    # fa2 / fa3 and SDPA beside ours on the whole decode grid (B 1-256 x 1k-128k) and prefill 8k / 32k / 128k.
    # python3 bench/targets_table.py <the files> turns them into the tables of the closing notes
    fi_build_start 300 8
    part moe-small 130 python3 bench/moe/bench_small.py --out "$OUT/moe-small" --shipped --jobs 8
    part moe-gluon 100 python3 bench/moe/bench_gluon.py --out "$OUT/moe-gluon" --experts 128,32 --variants op \
      --balanced-variants op
    part linear 60 python3 bench/moe/bench_kernels.py --out "$OUT/linear" --sections ceilings,linear --quick
    part window 60 python3 bench/attention/gluon_window_bench.py --out "$OUT/window" --configs pk3s
    fi_build_wait
    part fi-compare "${FI_S:-200}" python3 bench/attention/flashinfer_compare.py --out "$OUT/fi-compare" \
      --budget-s $(( ${FI_S:-200} - 15 )) --build-s 60 --decode all ;;
  fi)
    source bench/peers_install.sh >> "$OUT/candidates.log" 2>&1
    part fi-build "${FI_BUILD_S:-300}" python3 bench/attention/flashinfer_compare.py --out "$OUT/fi-build" --build-only \
      --budget-s "${FI_BUILD_S:-300}" --build-s $(( ${FI_BUILD_S:-300} - 10 )) --jit-workers 8 ;;
  moe)
    # session 8 measured the wg tiles and x16 (taken; the fold tails lost and were removed): `MOE_PARTS=wg,x16` runs
    # x16 again; by default the wg call with the slot kernels (session 8, CPU only) and the pick -> engine rows step
    parts=",${MOE_PARTS:-wg},"
    case "$parts" in *,wg,*) part moe-wg 330 env WG_STEPS=bench,tests,pick bash bench/moe/run_wg.sh ;; esac
    case "$parts" in *,x16,*) part moe-x16 170 bash bench/moe/run_x16.sh ;; esac ;;
  peers)
    # HF transformers at its fastest beside the engine on the same 20B weights (logits at 2048 tokens: cosine and
    # top-1; prefill 8192; decode batch 1 / 64; per-op breakdown), on this commit's defaults
    part peers-hf 240 env PEERS_FI=0 PEERS_HF_S=230 bash bench/peers_run.sh ;;
  *) echo "unknown area $area (attention|moe|peers|fi|fi10|s9a|s9b|s11a|tables)"; exit 2 ;;
esac
sed -i -E "s#$(pwd)/#<repo>/#g; s#/(root|tmp|opt|work)/[^ :]*#<path>#g" "$OUT/candidates.log"
echo "candidates $area: rc=$rc" | tee -a "$OUT/candidates.log"
exit $rc
