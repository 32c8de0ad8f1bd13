"""Embedded data: stdlib listing, split by file, fingerprint, cache reuse, batches."""

from __future__ import annotations

import json
import os
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from normlab.cli import app
from normlab.cli.errors import EXIT_REFUSED
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
    read_files,
    split_by_file,
    split_single,
    validation_windows,
)
from normlab.data import cache as cache_module
from normlab.data import sources as sources_module
from normlab.data.cache import check_source

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
    with pytest.raises(ValueError, match=r"data: no such file or folder .*missing"):
        read_corpus(tmp_path / "missing")
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ValueError, match="neither a file nor a folder"):
        read_corpus(tmp_path / "pipe")
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


# --- the max_bytes cap: a folder honours it like a single file -----------------------------------


def corpus_bytes(n: int) -> bytes:
    """``n`` bytes of numbered text lines."""
    return b"".join(b"line %06d of some text\n" % i for i in range(n // 20 + 1))[:n]


def test_a_folder_caps_its_first_file_like_a_single_file(tmp_path: Path) -> None:
    data = corpus_bytes(240_001)
    single = tmp_path / "corpus.txt"
    single.write_bytes(data)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "corpus.txt").write_bytes(data)
    train_f, val_f, desc_f = read_corpus(single, max_bytes=200_000)
    train_d, val_d, desc_d = read_corpus(tmp_path / "folder", max_bytes=200_000)
    assert (len(train_f), len(val_f)) == (190_000, 10_000)
    assert (train_d, val_d) == (train_f, val_f)
    assert train_d + val_d == data[:200_000]
    assert desc_f["truncated"] is True and desc_d["truncated"] is True
    assert desc_d["split"] == "single_file_tail" and desc_d["n_files_available"] == 1


def test_read_files_cuts_the_first_file_and_keeps_later_ones_whole(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"a" * 500)
    (tmp_path / "b.txt").write_bytes(b"b" * 300)
    (tmp_path / "c.txt").write_bytes(b"c" * 100)
    paths = list_text_files(tmp_path)
    files, truncated = read_files(tmp_path, paths, 200)
    assert [(f.rel_path, f.data) for f in files] == [("a.txt", b"a" * 200)] and truncated
    files, truncated = read_files(tmp_path, paths, 850)
    assert [f.rel_path for f in files] == ["a.txt", "b.txt"] and truncated  # c would pass it
    assert sum(len(f.data) for f in files) == 800
    files, truncated = read_files(tmp_path, paths, 900)
    assert [len(f.data) for f in files] == [500, 300, 100] and not truncated


def test_no_more_than_the_cap_is_read_into_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = corpus_bytes(50_000)
    (tmp_path / "folder").mkdir()
    for name in ("a.txt", "b.txt"):
        (tmp_path / "folder" / name).write_bytes(big)
    (tmp_path / "one.txt").write_bytes(big)
    sizes: list[int] = []

    def counting_open(path: object, mode: str = "r", *args: object, **kwargs: object) -> object:
        f = open(path, mode, *args, **kwargs)  # noqa: SIM115  (returned to the caller)
        read = f.read

        def counted(n: int = -1) -> bytes:
            data = read(n)
            sizes.append(len(data))
            return data

        f.read = counted  # type: ignore[method-assign]
        return f

    monkeypatch.setattr(sources_module, "open", counting_open, raising=False)
    for source in (tmp_path / "folder", tmp_path / "one.txt"):
        sizes.clear()
        train, val, desc = read_corpus(source, max_bytes=10_000)
        assert len(train) + len(val) == 10_000 and desc["truncated"] is True
        assert sizes and max(sizes) <= 10_001, (source, sizes)


def test_a_missing_source_is_named_before_an_old_cache_is_compared(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "corpus")
    data_dir = tmp_path / "out" / "data"
    prepare_tokens(data_dir, folder)
    with pytest.raises(ValueError, match="data: no such file or folder") as info:
        prepare_tokens(data_dir, tmp_path / "nonexistent")
    assert "was built with" not in str(info.value)
    with pytest.raises(ValueError, match="data: no such file or folder"):
        check_source(tmp_path / "nonexistent")
    assert check_source(None) is None and check_source("stdlib") is None
    assert check_source(folder) == folder.resolve()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read any file")
def test_an_unreadable_source_is_named(tmp_path: Path) -> None:
    text = tmp_path / "secret.txt"
    text.write_text("hello world\n" * 100)
    text.chmod(0)
    try:
        with pytest.raises(ValueError, match=r"data: cannot read the file .*permission denied"):
            check_source(text)
    finally:
        text.chmod(0o644)


# ----------------------------------------------------------------------------------------------
# Found in review: --data is checked before the folder's cache
# ----------------------------------------------------------------------------------------------
def invoke(*args: str, columns: int | None = None) -> tuple[int, str]:
    """Exit code and output (line breaks folded to spaces unless ``columns`` is given)."""
    env = {"COLUMNS": str(columns)} if columns else None
    result = CliRunner().invoke(app, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    output = result.output if columns else " ".join(result.output.split())
    return result.exit_code, output


# --- --data is checked before the folder's cache -------------------------------------------------
def test_missing_data_is_named_even_with_an_old_cache(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_tokens(out / "data", None, max_bytes=200_000)  # a stdlib cache, as a compare leaves
    (out / "experiment.json").write_text("{}")
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    missing = tmp_path / "nonexistent"
    code, output = invoke(
        "compare", "--config", str(config), "--data", str(missing), "--out", str(out), columns=1000
    )
    assert code == EXIT_REFUSED, output
    assert f"data: no such file or folder '{missing}'" in " ".join(output.split())
    assert "was built with" not in output
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.name != ".lock"} == {
        p: t for p, t in before.items() if p.name != ".lock"
    }
