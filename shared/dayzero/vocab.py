"""Resolve the Harmony vocabulary (``o200k_base.tiktoken``) without a network.

openai-harmony reads ``o200k_base.tiktoken`` from the folder named by the environment variable
``TIKTOKEN_ENCODINGS_BASE`` and checks its sha256; without that variable it tries to download the
file. Serving machines are often offline, so :func:`resolve_vocab` looks, in order, at

1. the configured folder (``--vocab-dir``, ``DAYZERO_VOCAB_DIR`` or ``TIKTOKEN_ENCODINGS_BASE``),
2. the cache folder (``DAYZERO_CACHE_DIR``, else ``$XDG_CACHE_HOME/dayzero``, else
   ``~/.cache/dayzero``; the file lives in its ``vocab/`` subfolder),
3. a rebuild from the ``quicktok-v1`` package (``pip install 'dayzero[vocab]'``), whose bundled
   ``o200k.vocab`` holds the same ranks in a binary form; the rebuilt text must hash to the sha256
   harmony expects, and it is written atomically into the cache folder,
4. harmony's own download (only when allowed),

and fails with a message naming every place it tried. :func:`load_harmony_encoding` sets
``TIKTOKEN_ENCODINGS_BASE`` to the resolved folder before harmony loads.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.util
import os
import struct
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

VOCAB_FILE = "o200k_base.tiktoken"
# What openai-harmony checks the file against (it is compiled into harmony's library).
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
QUICKTOK_PACKAGE = "quicktok"  # import name of the `quicktok-v1` distribution
QUICKTOK_VOCAB = "o200k.vocab"


class VocabError(RuntimeError):
    """The vocabulary could not be found, rebuilt or downloaded."""


@dataclass
class VocabResolution:
    """Where the vocabulary came from. ``folder`` is None when harmony downloads it itself."""

    folder: Path | None
    source: str  # "configured" | "cache" | "quicktok" | "download"
    notes: list[str] = field(default_factory=list)


def default_cache_dir() -> Path:
    if os.environ.get("DAYZERO_CACHE_DIR"):
        return Path(os.environ["DAYZERO_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dayzero"


def configured_dir() -> Path | None:
    for var in ("DAYZERO_VOCAB_DIR", "TIKTOKEN_ENCODINGS_BASE"):
        if os.environ.get(var):
            return Path(os.environ[var])
    return None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_folder(folder: Path) -> str | None:
    """None when ``folder/o200k_base.tiktoken`` exists with the right hash, else why not."""
    path = folder / VOCAB_FILE
    if not path.is_file():
        return f"{path}: not found"
    digest = sha256_file(path)
    if digest != VOCAB_SHA256:
        return f"{path}: sha256 {digest} != expected {VOCAB_SHA256}"
    return None


def find_quicktok_vocab() -> Path | None:
    """The bundled ``o200k.vocab`` of the installed quicktok package, found without importing it."""
    spec = importlib.util.find_spec(QUICKTOK_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "data" / QUICKTOK_VOCAB
        if candidate.is_file():
            return candidate
    return None


def tiktoken_text_from_quicktok(data: bytes) -> bytes:
    """quicktok's binary vocabulary -> tiktoken text (``base64(token) rank`` lines, by rank).

    Layout (little endian): u32 count, then per token u16 length, the token's bytes, u32 rank.
    """
    if len(data) < 4:
        raise VocabError("quicktok vocabulary is truncated (no header)")
    (count,) = struct.unpack_from("<I", data, 0)
    offset, entries = 4, []
    for i in range(count):
        if offset + 2 > len(data):
            raise VocabError(f"quicktok vocabulary is truncated at entry {i} of {count}")
        (length,) = struct.unpack_from("<H", data, offset)
        offset += 2
        token = data[offset:offset + length]
        offset += length
        if len(token) != length or offset + 4 > len(data):
            raise VocabError(f"quicktok vocabulary is truncated at entry {i} of {count}")
        (rank,) = struct.unpack_from("<I", data, offset)
        offset += 4
        entries.append((rank, token))
    if offset != len(data):
        raise VocabError(f"quicktok vocabulary has {len(data) - offset} trailing bytes")
    entries.sort()
    return b"".join(base64.b64encode(tok) + b" " + str(rank).encode() + b"\n" for rank, tok in entries)


def write_atomically(folder: Path, name: str, data: bytes) -> Path:
    """Write ``folder/name`` so that readers see either no file or the whole file."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / name)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return folder / name


def rebuild_from_quicktok(cache: Path, vocab_path: Path | None = None) -> Path:
    """Rebuild the tiktoken file from quicktok into ``cache``; returns the written path."""
    source = vocab_path or find_quicktok_vocab()
    if source is None:
        raise VocabError("quicktok-v1 is not installed (pip install 'dayzero[vocab]')")
    text = tiktoken_text_from_quicktok(source.read_bytes())
    digest = hashlib.sha256(text).hexdigest()
    if digest != VOCAB_SHA256:
        raise VocabError(f"vocabulary rebuilt from {source} has sha256 {digest}, expected {VOCAB_SHA256}")
    return write_atomically(cache, VOCAB_FILE, text)


def resolve_vocab(vocab_dir: str | Path | None = None, cache_dir: str | Path | None = None,
                  allow_download: bool = True, quicktok_vocab: Path | None = None) -> VocabResolution:
    """Find a folder holding a verified ``o200k_base.tiktoken`` (see the module docstring)."""
    notes: list[str] = []
    configured = Path(vocab_dir) if vocab_dir else configured_dir()
    if configured is not None:
        why = check_folder(configured)
        if why is None:
            return VocabResolution(configured, "configured", notes)
        notes.append(f"configured folder: {why}")
    cache = (Path(cache_dir) if cache_dir else default_cache_dir()) / "vocab"
    why = check_folder(cache)
    if why is None:
        return VocabResolution(cache, "cache", notes)
    notes.append(f"cache: {why}")
    try:
        rebuild_from_quicktok(cache, quicktok_vocab)
        return VocabResolution(cache, "quicktok", notes)
    except (VocabError, OSError) as e:
        notes.append(f"quicktok rebuild: {e}")
    if allow_download:
        return VocabResolution(None, "download", notes)
    raise VocabError("Harmony vocabulary o200k_base.tiktoken not found (download disabled):\n  "
                     + "\n  ".join(notes)
                     + "\nPut the file in a folder and pass --vocab-dir (or set TIKTOKEN_ENCODINGS_BASE),"
                     " or install quicktok-v1.")


def load_harmony_encoding(vocab_dir: str | Path | None = None, cache_dir: str | Path | None = None,
                          allow_download: bool = True):
    """Resolve the vocabulary, point harmony at it and load HARMONY_GPT_OSS.

    Returns ``(encoding, resolution)``. Raises :class:`VocabError` with every attempt listed.
    """
    resolution = resolve_vocab(vocab_dir, cache_dir, allow_download)
    if resolution.folder is not None:
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(resolution.folder)
    else:
        os.environ.pop("TIKTOKEN_ENCODINGS_BASE", None)
    import openai_harmony

    try:
        encoding = openai_harmony.load_harmony_encoding(openai_harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    except openai_harmony.HarmonyError as e:
        raise VocabError("Harmony vocabulary could not be loaded:\n  " + "\n  ".join(resolution.notes + [
            f"harmony ({resolution.source}): {e}"])) from e
    return encoding, resolution


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vocab-dir", default=None,
                        help="folder holding o200k_base.tiktoken (default: DAYZERO_VOCAB_DIR or "
                             "TIKTOKEN_ENCODINGS_BASE)")
    parser.add_argument("--cache-dir", default=None,
                        help="cache folder (default: DAYZERO_CACHE_DIR, XDG_CACHE_HOME/dayzero or ~/.cache/dayzero)")
    parser.add_argument("--offline", action="store_true", help="never let harmony download the file")
    parser.add_argument("--check", action="store_true", help="also load the Harmony encoding with it")


def run(args: argparse.Namespace) -> int:
    try:
        if args.check:
            _, resolution = load_harmony_encoding(args.vocab_dir, args.cache_dir, not args.offline)
        else:
            resolution = resolve_vocab(args.vocab_dir, args.cache_dir, not args.offline)
    except VocabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for note in resolution.notes:
        print(f"skipped {note}", file=sys.stderr)
    where = resolution.folder if resolution.folder is not None else "(downloaded by harmony)"
    print(f"{VOCAB_FILE}: {where} (source: {resolution.source})")
    if resolution.folder is not None:
        print(f"export TIKTOKEN_ENCODINGS_BASE={resolution.folder}")
    return 0
