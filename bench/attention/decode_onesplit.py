"""Decode at the batch sizes that take one split (B >= 64 with 8 KV heads), from CUDA-graph replay:
the one-split kernel (BLOCK_N 128, the default) beside the strided split-KV kernel run as one split
(its SINGLE path: each tile's pages read one tile ahead, so its K/V loads double-buffer; BLOCK_N 64 /
128, 2-4 stages); prints the rows and writes $OUT/decode-onesplit.json."""
import json
import os
import sys
import pathlib

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_decode_big as big  # noqa: E402
from attn_common import copy_bandwidth  # noqa: E402

big.PLAN = [(64, 1024), (64, 32768), (256, 8192), (64, 131072), (256, 131072)]
big.SPLITS = (1,)
big.CFGS = {"default": None,
            "strided_n64_s3": dict(MERGE="kernel", STRIDED=True, BLOCK_N=64, num_stages=3),
            "strided_n64_s4": dict(MERGE="kernel", STRIDED=True, BLOCK_N=64, num_stages=4),
            "strided_n128_s2": dict(MERGE="kernel", STRIDED=True, BLOCK_N=128, num_stages=2),
            "strided_n128_s3": dict(MERGE="kernel", STRIDED=True, BLOCK_N=128, num_stages=3)}
rows: list[str] = []
res = big.bench_decode_big(rows, copy_bandwidth())
print("\n".join(rows))
meta = dict(commit=os.environ.get("DAYZERO_COMMIT", "unknown"), gpu=torch.cuda.get_device_name(0),
            date_utc=__import__("datetime").datetime.now(__import__("datetime").timezone.utc).isoformat())
out = pathlib.Path(os.environ.get("OUT", "."))
(out / "decode-onesplit.json").write_text(json.dumps(dict(meta=meta, results=res), indent=1) + "\n")
