"""Streaming safetensors I/O: write sharded checkpoints tensor by tensor, read headers with checks.

The writer never holds a whole checkpoint (or even a whole tensor) in memory: every tensor is
declared up front (name, shape, dtype) so each shard's header can be written first, then the data
is produced chunk by chunk (along dim 0) and appended. The reader parses a shard's header itself so
that a truncated or corrupt file gives a ``CheckpointError`` naming the file and the tensor instead
of a traceback from inside the safetensors/torch extension.
"""

from __future__ import annotations

import json
import math
import os
import queue
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch


class CheckpointError(ValueError):
    """A checkpoint directory or file that is missing, truncated, corrupt or does not match its config."""


ST_DTYPES: dict[str, torch.dtype] = {
    "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
    "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in ST_DTYPES.items()}
INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 * 1024 * 1024


def dtype_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass
class TensorSource:
    """One tensor to write: ``produce()`` yields chunks that concatenate (along dim 0) to ``shape``."""
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    produce: Callable[[], Iterable[torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtype_size(self.dtype)


def _raw_bytes(t: torch.Tensor) -> memoryview:
    t = t.contiguous()
    # numpy has no bf16/fp8: reinterpret as same-width integers (a view, no copy)
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return memoryview(t.view(width).numpy()).cast("B")


def shard_names(n: int) -> list[str]:
    return [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def plan_shards(sources: list[TensorSource], max_shard_bytes: int) -> list[list[TensorSource]]:
    """Greedy split in order; a tensor larger than the limit gets a shard of its own."""
    shards: list[list[TensorSource]] = [[]]
    size = 0
    for s in sources:
        if shards[-1] and size + s.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += s.nbytes
    return shards


def write_sharded(out_dir: str | os.PathLike, sources: list[TensorSource], max_shard_bytes: int,
                  metadata: dict[str, str] | None = None, progress: str | None = None) -> list[str]:
    """Write ``sources`` as ``model-0000x-of-0000y.safetensors`` + ``model.safetensors.index.json``."""
    from tqdm.auto import tqdm

    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    shards = plan_shards(sources, max_shard_bytes)
    names = shard_names(len(shards))
    total = sum(s.nbytes for s in sources)
    weight_map: dict[str, str] = {}
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=progress, disable=progress is None)
    try:
        for fname, shard in zip(names, shards):
            _write_one(os.path.join(out_dir, fname), shard, metadata or {"format": "pt"}, bar)
            weight_map.update({s.name: fname for s in shard})
    finally:
        bar.close()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out_dir, INDEX_FILE), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2)
    return names


def _write_one(path: str, shard: list[TensorSource], metadata: dict[str, str], bar) -> None:
    header: dict[str, object] = {"__metadata__": metadata}
    off = 0
    for s in shard:
        header[s.name] = {"dtype": DTYPE_NAMES[s.dtype], "shape": list(s.shape), "data_offsets": [off, off + s.nbytes]}
        off += s.nbytes
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for s in shard:
            written = 0
            for chunk in prefetch(s.produce()):
                if chunk.dtype != s.dtype or tuple(chunk.shape[1:]) != tuple(s.shape[1:]):
                    raise RuntimeError(f"{s.name}: chunk {tuple(chunk.shape)} {chunk.dtype} does not fit "
                                       f"{s.shape} {s.dtype}")
                buf = _raw_bytes(chunk.cpu())
                f.write(buf)
                written += len(buf)
                bar.update(len(buf))
            if written != s.nbytes:
                raise RuntimeError(f"{s.name}: produced {written} bytes, expected {s.nbytes}")
    os.replace(tmp, path)


def prefetch(chunks: Iterable[torch.Tensor], depth: int = 2) -> Iterator[torch.Tensor]:
    """Run a chunk producer one or two chunks ahead in a thread, so generating (torch/numpy release
    the GIL) overlaps with writing. Exceptions reach the consumer."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for c in chunks:
                if not put(c):
                    return
            put(done)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            put(e)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        t.join()


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offsets: tuple[int, int]  # absolute byte range inside the file

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_header(path: str) -> dict[str, TensorInfo]:
    """Parse and check one safetensors file's header against the file's size."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            (hlen,) = struct.unpack("<Q", head)
            if hlen > MAX_HEADER_BYTES or 8 + hlen > size:
                raise CheckpointError(f"{path}: corrupt or truncated safetensors header "
                                      f"(header claims {hlen} bytes, file has {size})")
            raw = f.read(hlen)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt safetensors header (not JSON: {e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not an object)")
    data_size = size - 8 - hlen
    out: dict[str, TensorInfo] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = ST_DTYPES[meta["dtype"]]
            shape = tuple(int(d) for d in meta["shape"])
            b, e = (int(x) for x in meta["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: tensor {name}: corrupt header entry {meta!r}") from None
        if e - b != math.prod(shape) * dtype_size(dtype) or b < 0:
            raise CheckpointError(f"{path}: tensor {name}: header byte range {b}..{e} does not match "
                                  f"shape {list(shape)} {meta['dtype']}")
        if e > data_size:
            raise CheckpointError(f"{path}: truncated file: tensor {name} needs bytes {b}..{e} of the data "
                                  f"section but the file holds only {data_size}")
        out[name] = TensorInfo(name, path, dtype, shape, (8 + hlen + b, 8 + hlen + e))
    return out


def load_tensor(info: TensorInfo, rows: tuple[int, int] | None = None) -> torch.Tensor:
    """Read one tensor (or rows r0:r1 of dim 0) from disk into a fresh CPU tensor."""
    b, e = info.offsets
    shape = list(info.shape)
    if rows is not None:
        row_bytes = (e - b) // max(1, shape[0]) if shape else 0
        r0, r1 = rows
        b, e = b + r0 * row_bytes, b + r1 * row_bytes
        shape[0] = r1 - r0
    try:
        with open(info.file, "rb") as f:
            f.seek(b)
            buf = bytearray(e - b)
            n = f.readinto(buf)
    except OSError as err:
        raise CheckpointError(f"{info.file}: tensor {info.name}: cannot read ({err.strerror or err})") from None
    if n != e - b:
        raise CheckpointError(f"{info.file}: truncated file: tensor {info.name} ends at byte {e}, file is shorter")
    if not buf:
        return torch.empty(shape, dtype=info.dtype)
    return torch.frombuffer(buf, dtype=info.dtype).reshape(shape)


def iter_chunks(t: torch.Tensor, max_elems: int = 1 << 24) -> Iterator[torch.Tensor]:
    """Split along dim 0 into pieces of at most ~max_elems elements (for producers)."""
    rows = max(1, max_elems // max(1, math.prod(t.shape[1:])))
    for r in range(0, t.shape[0], rows):
        yield t[r:r + rows]
