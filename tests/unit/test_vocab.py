"""Harmony vocabulary resolution: configured folder, cache, quicktok rebuild, download, errors."""

from __future__ import annotations

import base64
import hashlib
import os
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from dayzero import vocab


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ("TIKTOKEN_ENCODINGS_BASE", "DAYZERO_VOCAB_DIR", "DAYZERO_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory) -> Path:
    """A verified o200k_base.tiktoken rebuilt once from the installed quicktok package."""
    if vocab.find_quicktok_vocab() is None:
        pytest.skip("quicktok-v1 is not installed")
    cache = tmp_path_factory.mktemp("vocab-cache")
    return vocab.rebuild_from_quicktok(cache)


def quicktok_bytes(entries: list[tuple[bytes, int]]) -> bytes:
    out = [struct.pack("<I", len(entries))]
    for token, rank in entries:
        out.append(struct.pack("<H", len(token)) + token + struct.pack("<I", rank))
    return b"".join(out)


def test_expected_name_and_hash_are_the_ones_harmony_checks():
    import openai_harmony

    lib_dir = Path(openai_harmony.__file__).parent
    libs = [p for p in lib_dir.iterdir() if p.suffix in (".so", ".pyd", ".dylib")]
    assert libs, "openai_harmony has no compiled library"
    blob = b"".join(p.read_bytes() for p in libs)
    assert vocab.VOCAB_SHA256.encode() in blob
    assert vocab.VOCAB_FILE.encode() in blob
    assert b"TIKTOKEN_ENCODINGS_BASE" in blob


def test_quicktok_format_converts_to_rank_sorted_base64_lines():
    rng = random.Random(0)
    ranks = rng.sample(range(1000), 50)
    entries = [(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9))), r) for r in ranks]
    text = vocab.tiktoken_text_from_quicktok(quicktok_bytes(entries))
    lines = text.decode().splitlines()
    assert len(lines) == len(entries)
    parsed = [(base64.b64decode(line.split(" ")[0]), int(line.split(" ")[1])) for line in lines]
    assert parsed == sorted(entries, key=lambda e: e[1])


@pytest.mark.parametrize("cut", [2, 9, -3])
def test_truncated_quicktok_data_is_a_clear_error(cut):
    data = quicktok_bytes([(b"ab", 0), (b"cd", 1)])
    with pytest.raises(vocab.VocabError, match="truncated"):
        vocab.tiktoken_text_from_quicktok(data[:cut])


def test_trailing_bytes_are_an_error():
    with pytest.raises(vocab.VocabError, match="trailing"):
        vocab.tiktoken_text_from_quicktok(quicktok_bytes([(b"ab", 0)]) + b"x")


def test_rebuild_matches_harmony_hash_and_leaves_no_temp_files(rebuilt):
    assert rebuilt.name == vocab.VOCAB_FILE
    assert hashlib.sha256(rebuilt.read_bytes()).hexdigest() == vocab.VOCAB_SHA256
    assert sorted(os.listdir(rebuilt.parent)) == [vocab.VOCAB_FILE]
    assert os.stat(rebuilt).st_mode & 0o444 == 0o444


def test_rebuild_with_wrong_content_is_refused_and_not_cached(tmp_path):
    bogus = tmp_path / "o200k.vocab"
    bogus.write_bytes(quicktok_bytes([(b"a", 0), (b"b", 1)]))
    cache = tmp_path / "cache"
    with pytest.raises(vocab.VocabError, match="sha256"):
        vocab.rebuild_from_quicktok(cache, bogus)
    assert not (cache / vocab.VOCAB_FILE).exists()


def test_configured_folder_wins(rebuilt, tmp_path):
    res = vocab.resolve_vocab(vocab_dir=rebuilt.parent, cache_dir=tmp_path, allow_download=False)
    assert (res.folder, res.source) == (rebuilt.parent, "configured")
    assert not (tmp_path / "vocab").exists()


def test_configured_folder_from_env(rebuilt, tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(rebuilt.parent))
    res = vocab.resolve_vocab(cache_dir=tmp_path, allow_download=False)
    assert res.source == "configured"


def test_corrupt_configured_file_falls_back_to_cache(rebuilt, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / vocab.VOCAB_FILE).write_bytes(rebuilt.read_bytes()[:-10])
    cache = tmp_path / "c"
    shutil.copytree(rebuilt.parent, cache / "vocab")
    res = vocab.resolve_vocab(vocab_dir=bad, cache_dir=cache, allow_download=False)
    assert res.source == "cache"
    assert any("sha256" in n for n in res.notes)


def test_empty_cache_is_filled_from_quicktok_then_reused(tmp_path):
    if vocab.find_quicktok_vocab() is None:
        pytest.skip("quicktok-v1 is not installed")
    first = vocab.resolve_vocab(cache_dir=tmp_path, allow_download=False)
    assert first.source == "quicktok"
    assert vocab.check_folder(first.folder) is None
    second = vocab.resolve_vocab(cache_dir=tmp_path, allow_download=False)
    assert (second.source, second.folder) == ("cache", first.folder)


def test_nothing_found_offline_names_every_attempt(tmp_path, monkeypatch):
    monkeypatch.setattr(vocab, "find_quicktok_vocab", lambda: None)
    with pytest.raises(vocab.VocabError) as info:
        vocab.resolve_vocab(vocab_dir=tmp_path / "nope", cache_dir=tmp_path, allow_download=False)
    message = str(info.value)
    assert "configured folder" in message and "cache" in message and "quicktok" in message
    assert "--vocab-dir" in message


def test_nothing_found_online_defers_to_harmony_download(tmp_path, monkeypatch):
    monkeypatch.setattr(vocab, "find_quicktok_vocab", lambda: None)
    res = vocab.resolve_vocab(cache_dir=tmp_path, allow_download=True)
    assert (res.folder, res.source) == (None, "download")


def test_load_harmony_encoding_sets_the_env_and_encodes(rebuilt, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", "placeholder-restored-after-the-test")
    encoding, res = vocab.load_harmony_encoding(vocab_dir=rebuilt.parent, allow_download=False)
    assert os.environ["TIKTOKEN_ENCODINGS_BASE"] == str(rebuilt.parent)
    ids = encoding.encode("hello world")
    assert ids and encoding.decode(ids) == "hello world"
    assert res.source == "configured"


def test_run_reports_failure_with_exit_code(tmp_path, monkeypatch, capsys):
    import argparse

    monkeypatch.setattr(vocab, "find_quicktok_vocab", lambda: None)
    parser = argparse.ArgumentParser()
    vocab.add_arguments(parser)
    args = parser.parse_args(["--cache-dir", str(tmp_path), "--offline"])
    assert vocab.run(args) == 1
    assert "o200k_base.tiktoken not found" in capsys.readouterr().err


def test_cli_subcommand_rebuilds_then_uses_cache(tmp_path):
    if vocab.find_quicktok_vocab() is None:
        pytest.skip("quicktok-v1 is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("TIKTOKEN_ENCODINGS_BASE", "DAYZERO_VOCAB_DIR")}
    env["DAYZERO_CACHE_DIR"] = str(tmp_path)
    cmd = [sys.executable, "-m", "dayzero", "vocab", "--offline", "--check"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "source: quicktok" in first.stdout
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0 and "source: cache" in second.stdout
    assert f"TIKTOKEN_ENCODINGS_BASE={tmp_path / 'vocab'}" in second.stdout
