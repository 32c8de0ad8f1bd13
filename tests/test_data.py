"""Embedded data: stdlib listing, split by file, fingerprint, cache reuse, batches."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from normlab.data import (
    EXCLUDED_DIRS,
    SourceFile,
    TrainBatches,
    list_stdlib_files,
    list_text_files,
    load_tokens,
    path_fraction,
    prepare_tokens,
    read_corpus,
    split_by_file,
    split_single,
    validation_windows,
)
from normlab.data import cache as cache_module

SMALL_CAP = 400_000


def make_folder(root: Path, n: int = 30) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        sub = root / f"pkg{i % 3}"
        sub.mkdir(exist_ok=True)
        (sub / f"mod{i:02d}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * (i + 5))
    (root / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
    (root / ".hidden").write_text("secret")
    return root


def test_stdlib_listing_is_sorted_py_outside_tests() -> None:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = list_stdlib_files()
    rel = [f.relative_to(root).as_posix() for f in files]
    assert rel == sorted(rel) and len(rel) > 100
    assert all(r.endswith(".py") for r in rel)
    for r in rel:
        assert not set(r.split("/")[:-1]) & EXCLUDED_DIRS, r
    assert "os.py" in rel


def test_split_is_by_file_and_by_path_only() -> None:
    files = [SourceFile(f"a/m{i}.py", bytes([i % 256]) * 10) for i in range(200)]
    train, val = split_by_file(files, 0.05)
    tp, vp = {f.rel_path for f in train}, {f.rel_path for f in val}
    assert not tp & vp and len(tp | vp) == 200
    assert vp == {f.rel_path for f in files if path_fraction(f.rel_path) < 0.05}
    assert 2 <= len(val) <= 25
    # adding files never moves an existing one
    more = [*files, *(SourceFile(f"b/n{i}.py", b"x") for i in range(50))]
    _, val_more = split_by_file(more, 0.05)
    assert vp <= {f.rel_path for f in val_more}
    # at least one file on each side
    tiny_train, tiny_val = split_by_file(files[:2], 0.01)
    assert len(tiny_train) == 1 and len(tiny_val) == 1


def test_single_file_split_is_leading_train_trailing_val() -> None:
    data = bytes(range(100))
    train, val = split_single(data, 0.1)
    assert train + val == data and len(val) == 10


def test_stdlib_corpus_fingerprint_is_stable_and_split_by_file() -> None:
    train1, val1, desc1 = read_corpus(None, max_bytes=SMALL_CAP)
    train2, val2, _ = read_corpus("stdlib", max_bytes=SMALL_CAP)
    assert (train1, val1) == (train2, val2)
    assert cache_module.fingerprint(train1, val1) == cache_module.fingerprint(train2, val2)
    assert desc1["split"] == "by_file" and desc1["truncated"] is True
    assert desc1["n_train_files"] >= 1 and desc1["n_val_files"] >= 1
    assert len(train1) + len(val1) <= SMALL_CAP
    assert cache_module.fingerprint(train1, val1) != cache_module.fingerprint(val1, train1)


def test_folder_source_skips_binary_and_hidden(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "corpus")
    files = list_text_files(folder)
    assert all(f.suffix == ".py" for f in files) and len(files) == 30
    train, val, desc = read_corpus(folder)
    assert desc["source_kind"] == "folder" and desc["n_train_files"] + desc["n_val_files"] == 30
    assert b"\x00" not in train + val


def test_cache_is_built_once_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = make_folder(tmp_path / "corpus")
    data_dir = tmp_path / "out" / "data"
    info = prepare_tokens(data_dir, folder)
    tokens_file = data_dir / "tokens.u8"
    assert json.loads((data_dir / "data.json").read_text()) == info
    for key in ("source", "fingerprint", "python_version", "n_train_tokens", "n_val_tokens"):
        assert key in info
    mtime = tokens_file.stat().st_mtime_ns

    def no_reading(*_: object, **__: object) -> None:
        raise AssertionError("the corpus was read again")

    monkeypatch.setattr(cache_module, "read_corpus", no_reading)
    assert prepare_tokens(data_dir, folder) == info
    assert tokens_file.stat().st_mtime_ns == mtime
    loaded = load_tokens(data_dir)
    assert loaded.train.dtype == np.uint8 and isinstance(loaded.train, np.memmap)
    assert loaded.train.shape[0] == info["n_train_tokens"]
    assert loaded.val.shape[0] == info["n_val_tokens"]


def test_cache_refuses_a_different_request(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "corpus")
    data_dir = tmp_path / "data"
    prepare_tokens(data_dir, folder)
    with pytest.raises(ValueError, match="val_fraction"):
        prepare_tokens(data_dir, folder, val_fraction=0.2)
    with pytest.raises(ValueError, match="source"):
        prepare_tokens(data_dir, None)


def test_single_file_source(tmp_path: Path) -> None:
    text = tmp_path / "book.txt"
    text.write_text("hello world\n" * 1000)
    info = prepare_tokens(tmp_path / "data", text, val_fraction=0.1)
    assert info["split"] == "single_file_tail"
    assert info["n_val_tokens"] == 1200 and info["n_train_tokens"] == 10800


def test_bad_sources_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="neither a file nor a folder"):
        read_corpus(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no text files"):
        read_corpus(tmp_path / "empty")
    with pytest.raises(ValueError, match="val_fraction"):
        read_corpus(None, val_fraction=0.9)


def test_validation_windows_are_fixed_and_cover_the_set() -> None:
    val = np.arange(1000, dtype=np.int64).astype(np.uint8)
    w1 = validation_windows(val, 16, 10)
    w2 = validation_windows(val, 16, 10)
    assert w1.shape == (10, 17) and np.array_equal(w1.numpy(), w2.numpy())
    assert w1[0, 0].item() == 0 and w1[-1, -1].item() == val[-1]
    with pytest.raises(ValueError, match="validation tokens"):
        validation_windows(val[:10], 16, 4)


def test_train_batches_are_windows_of_the_data() -> None:
    tokens = np.arange(300, dtype=np.int64).astype(np.uint8)
    x, y = TrainBatches(tokens, 3, 8, seed=0).next()
    assert x.shape == (3, 8) and x.dtype.is_floating_point is False
    assert ((y - x) % 256 == 1).all()  # consecutive bytes of the arange data


def test_a_home_relative_source_reuses_its_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``~/corpus`` is read as $HOME/corpus, so the cache must record that same path: a re-run
    (a resumed compare) with the same ``~`` path was refused as a different source."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    folder = make_folder(tmp_path / "home" / "corpus")
    data_dir = tmp_path / "out" / "data"
    info = prepare_tokens(data_dir, "~/corpus")
    assert info["source"] == str(folder.resolve())
    assert prepare_tokens(data_dir, "~/corpus") == info
    assert prepare_tokens(data_dir, folder) == info
