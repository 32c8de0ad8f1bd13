"""Data formats, tokenizers, the general token cache and bits per byte (normlab.data)."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from normlab.data import (
    BpbTally,
    bits_per_byte,
    corpus_bpe,
    document_fraction,
    is_cache_entry,
    load_tokenizer,
    load_tokens,
    path_fraction,
    prepare_token_cache,
    prepare_tokens,
    split_by_file,
    train_bpe,
    uses_byte_corpus,
    validation_mask,
    validation_offsets,
    validation_windows,
    window_bytes,
)
from normlab.data import bpe as bpe_module
from normlab.data import token_cache as token_cache_module
from normlab.data.sources import SourceFile

CAP = 1 << 20
DOCS = [
    f"def f{i}(x):\n    # héllo wörld ✓ {'é' * (i % 4)}\n    return x * {i}\n" * (i % 5 + 1)
    for i in range(60)
]


def tokenizers_module():
    return pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def bpe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny byte-level BPE trained on DOCS."""
    tokenizers_module()
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    return train_bpe(DOCS, 120, path)


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def ids_and_bytes(tokenizer: str | None, text: str) -> tuple[np.ndarray, np.ndarray]:
    """A document's ids and byte counts, straight from the tokenizer."""
    tok = load_tokenizer(tokenizer)
    ids, counts = tok.encode(text.encode("utf-8"))
    return ids.astype(np.int64), (np.ones(len(ids), np.int64) if counts is None else counts)


def expected_by_document(tokenizer: str | None, docs: list[str], keys: list[float]):
    """train ids, val ids, val byte counts for a split by document with these fractions."""
    mask = validation_mask(np.asarray(keys), 0.05)
    parts = [ids_and_bytes(tokenizer, d) for d in docs]
    train = np.concatenate([p[0] for p, m in zip(parts, mask, strict=True) if not m])
    val = np.concatenate([p[0] for p, m in zip(parts, mask, strict=True) if m])
    val_bytes = np.concatenate([p[1] for p, m in zip(parts, mask, strict=True) if m])
    return train, val, val_bytes


def cache(tmp_path: Path, name: str, source: Path | str | None, **kwargs: object):
    info = prepare_tokens(tmp_path / name, source, CAP, 0.05, **kwargs)
    return info, load_tokens(tmp_path / name)


# --- formats give the token stream of their text ------------------------------------------------


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_jsonl_and_parquet_match_their_documents(
    tmp_path: Path, bpe_path: Path, tokenizer: str
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    tok = None if tokenizer == "bytes" else str(bpe_path)
    jsonl = write_jsonl(tmp_path / "c.jsonl", DOCS)
    parquet = tmp_path / "c.parquet"
    pq.write_table(
        pa.table({"id": list(range(len(DOCS))), "body": DOCS}), parquet, row_group_size=7
    )
    keys = [document_fraction(d.encode()) for d in DOCS]
    train, val, val_bytes = expected_by_document(tok, DOCS, keys)
    info_j, data_j = cache(tmp_path, "j", jsonl, tokenizer=tok)
    info_p, data_p = cache(tmp_path, "p", parquet, tokenizer=tok, text_field="body")
    for info, data in ((info_j, data_j), (info_p, data_p)):
        assert info["split"] == "by_document" and info["n_val_docs"] >= 1
        np.testing.assert_array_equal(np.asarray(data.train, np.int64), train)
        np.testing.assert_array_equal(np.asarray(data.val, np.int64), val)
        assert info["n_val_bytes"] == int(val_bytes.sum())
        assert info["n_train_bytes"] + info["n_val_bytes"] == sum(len(d.encode()) for d in DOCS)
    assert info_j["fingerprint"] == info_p["fingerprint"]
    if tok is None:
        assert data_j.val_bytes is None and data_j.train.dtype == np.uint8
    else:
        np.testing.assert_array_equal(np.asarray(data_j.val_bytes, np.int64), val_bytes)


def test_save_to_disk_folder_matches_jsonl(tmp_path: Path, bpe_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "ds"
    datasets.Dataset.from_dict({"text": DOCS}).save_to_disk(str(folder))
    info_h, data_h = cache(tmp_path, "h", folder, tokenizer=str(bpe_path))
    info_j, data_j = cache(
        tmp_path, "j", write_jsonl(tmp_path / "c.jsonl", DOCS), tokenizer=str(bpe_path)
    )
    assert info_h["source_format"] == "hf_disk" and info_h["fingerprint"] == info_j["fingerprint"]
    np.testing.assert_array_equal(data_h.train, data_j.train)
    np.testing.assert_array_equal(data_h.val_bytes, data_j.val_bytes)


def test_bytes_of_one_document_equal_the_text_file_corpus(tmp_path: Path) -> None:
    text = "".join(DOCS)
    (tmp_path / "book.txt").write_text(text)
    old, old_data = cache(tmp_path, "old", tmp_path / "book.txt")
    assert "tokenizer" not in old  # the byte corpus keeps its data.json and fingerprint
    _, new_data = cache(tmp_path, "new", write_jsonl(tmp_path / "one.jsonl", [text]))
    np.testing.assert_array_equal(old_data.train, new_data.train)
    np.testing.assert_array_equal(old_data.val, new_data.val)


def test_folder_with_a_tokenizer_splits_by_file_like_the_byte_corpus(
    tmp_path: Path, bpe_path: Path
) -> None:
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i, d in enumerate(DOCS):
        (folder / f"m{i:02d}.py").write_text(d)
    old, old_data = cache(tmp_path, "old", folder)
    general = prepare_token_cache(
        tmp_path / "gen", folder, data_format="folder", max_bytes=CAP, val_fraction=0.05
    )
    gen_data = load_tokens(tmp_path / "gen")
    np.testing.assert_array_equal(old_data.train, gen_data.train)
    np.testing.assert_array_equal(old_data.val, gen_data.val)
    assert general["n_val_docs"] == old["n_val_files"]
    files = [SourceFile(f"m{i:02d}.py", d.encode()) for i, d in enumerate(DOCS)]
    _, val_files = split_by_file(files, 0.05)
    keys = [path_fraction(f.rel_path) for f in files]
    train, val, _ = expected_by_document(str(bpe_path), DOCS, keys)
    info, data = cache(tmp_path, "bpe", folder, tokenizer=str(bpe_path))
    assert info["n_val_docs"] == len(val_files)
    np.testing.assert_array_equal(np.asarray(data.train, np.int64), train)
    np.testing.assert_array_equal(np.asarray(data.val, np.int64), val)


@pytest.mark.parametrize("kind", ["bin16", "bin32", "npy"])
def test_pretokenized_ids_match_the_text(tmp_path: Path, bpe_path: Path, kind: str) -> None:
    text = "".join(DOCS)
    (tmp_path / "book.txt").write_text(text)
    _, from_text = cache(tmp_path, "text", tmp_path / "book.txt", tokenizer=str(bpe_path))
    ids, _ = ids_and_bytes(str(bpe_path), text)
    if kind == "npy":
        source = tmp_path / "ids.npy"
        np.save(source, ids.astype(np.int32))
        kwargs = {"tokenizer": str(bpe_path)}
    else:
        source = tmp_path / "train.bin"
        dtype = "uint16" if kind == "bin16" else "uint32"
        ids.astype(dtype).tofile(source)
        (tmp_path / "train.bin.json").write_text(
            json.dumps({"dtype": dtype, "tokenizer": bpe_path.name})
        )
        (tmp_path / bpe_path.name).write_bytes(bpe_path.read_bytes())
        kwargs = {}
    info, data = cache(tmp_path, "pre", source, **kwargs)
    assert info["split"] == "contiguous_tail"
    np.testing.assert_array_equal(data.train, from_text.train)
    np.testing.assert_array_equal(data.val, from_text.val)
    np.testing.assert_array_equal(data.val_bytes, from_text.val_bytes)


def test_pretokenized_documents_split_by_document(tmp_path: Path, bpe_path: Path) -> None:
    parts = [ids_and_bytes(str(bpe_path), d)[0] for d in DOCS]
    starts = np.cumsum([0] + [len(p) for p in parts[:-1]])
    np.concatenate(parts).astype(np.uint16).tofile(tmp_path / "all.bin")
    np.save(tmp_path / "starts.npy", starts)
    (tmp_path / "all.json").write_text(
        json.dumps({"dtype": "uint16", "tokenizer": str(bpe_path), "doc_starts": "starts.npy"})
    )
    info, data = cache(tmp_path, "pre", tmp_path / "all.bin")
    keys = [document_fraction(p.astype("<u4").tobytes()) for p in parts]
    mask = validation_mask(np.asarray(keys), 0.05)
    assert info["split"] == "by_document" and info["n_val_docs"] == int(mask.sum())
    val = np.concatenate([p for p, m in zip(parts, mask, strict=True) if m])
    np.testing.assert_array_equal(np.asarray(data.val, np.int64), val)
    assert info["n_val_bytes"] == sum(len(d.encode()) for d, m in zip(DOCS, mask, strict=True) if m)


# --- tokenizers ------------------------------------------------------------------------------


def test_bpe_training_is_deterministic_and_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizers_module()
    a = train_bpe(DOCS, 80, tmp_path / "a" / "tokenizer.json")
    b = train_bpe(DOCS, 80, tmp_path / "b" / "tokenizer.json")
    assert a.read_bytes() == b.read_bytes()
    assert 256 < load_tokenizer(a).vocab_size <= 256 + 80
    jsonl = write_jsonl(tmp_path / "c.jsonl", DOCS)
    first = corpus_bpe(jsonl, 80, tmp_path / "cache", max_bytes=CAP, val_fraction=0.05)

    def no_training(*_: object, **__: object) -> None:
        raise AssertionError("trained again")

    monkeypatch.setattr(bpe_module, "train_bpe", no_training)
    assert corpus_bpe(jsonl, 80, tmp_path / "cache", max_bytes=CAP, val_fraction=0.05) == first
    # trained on the training side only: no validation document's text reached it
    mask = validation_mask(np.asarray([document_fraction(d.encode()) for d in DOCS]), 0.05)
    val_docs = [d for d, m in zip(DOCS, mask, strict=True) if m]
    seen = list(bpe_module.training_texts(jsonl, max_bytes=CAP, val_fraction=0.05))
    assert val_docs and not set(val_docs) & set(seen) and len(seen) == len(DOCS) - len(val_docs)


def test_tokenizer_folder_and_byte_counts(tmp_path: Path, bpe_path: Path) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(bpe_path.read_bytes())
    from_folder, from_file = load_tokenizer(folder), load_tokenizer(bpe_path)
    assert from_folder.content_hash == from_file.content_hash
    text = "x = 'é✓😀'  \n\tdef f(): pass"
    ids, counts = from_file.encode(text.encode())
    assert int(counts.sum()) == len(text.encode())
    assert from_file.backend.decode(ids.tolist()) == text
    # offsets path (used when a tokenizer is not byte-level) counts every byte once too
    from normlab.data.tokenizer import _lengths_from_offsets

    enc = from_file.backend.encode(text, add_special_tokens=False)
    assert int(_lengths_from_offsets(text.encode(), enc.offsets).sum()) == len(text.encode())
    assert load_tokenizer(None).vocab_size == 256 and load_tokenizer("bytes").is_bytes


# --- bits per byte ---------------------------------------------------------------------------


def _byte_level_bytes(tokenizer: Path) -> dict[int, int]:
    """Each id's byte length by the GPT-2 byte ↔ character table, written out here."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = {chr(b) for b in printable} | {chr(256 + n) for n in range(256 - len(printable))}
    vocab = json.loads(tokenizer.read_text())["model"]["vocab"]
    assert all(set(tok) <= chars for tok in vocab)
    return {i: len(tok) for tok, i in vocab.items()}


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_bits_per_byte_equals_a_direct_computation(
    tmp_path: Path, bpe_path: Path, tokenizer: str
) -> None:
    tok = None if tokenizer == "bytes" else str(bpe_path)
    _, data = cache(tmp_path, "d", write_jsonl(tmp_path / "c.jsonl", DOCS), tokenizer=tok)
    context, n_windows = 16, 5
    windows = validation_windows(data.val, context, n_windows)
    counts = window_bytes(data.val_bytes, data.val.shape[0], context, n_windows)
    vocab = data.vocab_size
    logits = torch.randn(n_windows, context, vocab, generator=torch.Generator().manual_seed(0))
    tally = BpbTally()
    for lo in range(0, n_windows, 2):
        tally.add(logits[lo : lo + 2], windows[lo : lo + 2, 1:], counts[lo : lo + 2])
    logp = torch.log_softmax(logits.double(), -1)
    nats = -logp.gather(-1, windows[:, 1:, None]).squeeze(-1)
    if tok is None:
        n_bytes = windows[:, 1:].numel()
    else:
        table = _byte_level_bytes(bpe_path)
        n_bytes = sum(table[int(i)] for i in windows[:, 1:].flatten())
    assert tally.n_bytes == n_bytes
    assert tally.bpb == pytest.approx(nats.sum().item() / n_bytes / math.log(2), rel=1e-6)
    assert tally.loss == pytest.approx(nats.mean().item(), rel=1e-6)
    if tok is None:  # bytes: exactly today's (mean nats) / ln 2
        from normlab.experiment.measure.evaluate import bits_per_byte as old_bpb

        assert tally.bpb == old_bpb(tally.total_nats / tally.n_tokens)
    offsets = validation_offsets(data.val.shape[0], context, n_windows)
    assert offsets[0] == 0 and offsets[-1] == data.val.shape[0] - context - 1


def test_bits_per_byte_formula() -> None:
    assert bits_per_byte(2 * math.log(2), 2) == 1.0
    assert bits_per_byte(10.0, 4) == 10.0 / 4 / math.log(2)
    with pytest.raises(ValueError, match="n_bytes"):
        bits_per_byte(1.0, 0)


# --- memmap, streaming, fingerprints ---------------------------------------------------------


def test_cache_is_memmapped_and_chunking_does_not_change_it(
    tmp_path: Path, bpe_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jsonl = write_jsonl(tmp_path / "c.jsonl", DOCS)
    info, data = cache(tmp_path, "big", jsonl, tokenizer=str(bpe_path))
    assert isinstance(data.train, np.memmap) and isinstance(data.val_bytes, np.memmap)
    assert data.train.dtype == np.uint16 and data.val_bytes.dtype == np.uint16
    assert (tmp_path / "big" / "tokens.u16").stat().st_size == 2 * (
        info["n_train_tokens"] + info["n_val_tokens"]
    )
    assert not list((tmp_path / "big").glob(".*.tmp"))
    assert all(is_cache_entry(p.name) for p in (tmp_path / "big").iterdir())
    (tmp_path / "book.txt").write_text("".join(DOCS))
    book, _ = cache(tmp_path, "book", tmp_path / "book.txt", tokenizer=str(bpe_path))
    monkeypatch.setattr(token_cache_module, "BATCH_BYTES", 64)
    monkeypatch.setattr(token_cache_module, "PIECE_BYTES", 50)
    monkeypatch.setattr(token_cache_module, "CHUNK_TOKENS", 7)
    small, small_data = cache(tmp_path, "small", jsonl, tokenizer=str(bpe_path))
    assert small["fingerprint"] == info["fingerprint"]
    np.testing.assert_array_equal(small_data.val, data.val)
    # one long document, tokenized in pieces, gives the tokens and byte counts of one encoding
    pieces, _ = cache(tmp_path, "pieces", tmp_path / "book.txt", tokenizer=str(bpe_path))
    assert pieces["fingerprint"] == book["fingerprint"]
    assert (pieces["n_val_tokens"], pieces["n_val_bytes"]) == (
        book["n_val_tokens"],
        book["n_val_bytes"],
    )


def test_text_pieces_cut_after_a_newline_starting_a_non_blank_line() -> None:
    data = b"ab\n  cd\n\nef\ngh\n"
    pieces = list(token_cache_module.text_pieces(data, 2))
    assert b"".join(pieces) == data
    assert pieces == [b"ab\n  cd\n\n", b"ef\n", b"gh\n"]
    assert list(token_cache_module.text_pieces(b"no newline at all", 3)) == [b"no newline at all"]


def test_a_damaged_cache_is_rebuilt_only_from_the_same_data(tmp_path: Path, bpe_path: Path) -> None:
    jsonl = write_jsonl(tmp_path / "c.jsonl", DOCS)
    info, _ = cache(tmp_path, "d", jsonl, tokenizer=str(bpe_path))
    (tmp_path / "d" / "token_bytes.u16").unlink()
    assert cache(tmp_path, "d", jsonl, tokenizer=str(bpe_path))[0] == info
    (tmp_path / "d" / "tokens.u16").write_bytes(b"")
    write_jsonl(jsonl, [*DOCS, "one more document"])
    with pytest.raises(ValueError, match=r"missing or damaged .* use another --out"):
        prepare_tokens(tmp_path / "d", jsonl, CAP, 0.05, tokenizer=str(bpe_path))
    assert (tmp_path / "d" / "tokens.u16").stat().st_size == 0  # left as it was


def test_fingerprint_follows_data_and_tokenizer(tmp_path: Path, bpe_path: Path) -> None:
    jsonl = write_jsonl(tmp_path / "c.jsonl", DOCS)
    base, _ = cache(tmp_path, "a", jsonl, tokenizer=str(bpe_path))
    again, _ = cache(tmp_path, "a2", jsonl, tokenizer=str(bpe_path))
    assert again["fingerprint"] == base["fingerprint"]
    edited = write_jsonl(tmp_path / "d.jsonl", [*DOCS[:-1], DOCS[-1] + "#"])
    edited_info, _ = cache(tmp_path, "b", edited, tokenizer=str(bpe_path))
    assert edited_info["fingerprint"] != base["fingerprint"]
    other = train_bpe(DOCS, 60, tmp_path / "other" / "tokenizer.json")
    changed, _ = cache(tmp_path, "c", jsonl, tokenizer=str(other))
    assert changed["fingerprint"] != base["fingerprint"]
    assert changed["tokenizer_hash"] != base["tokenizer_hash"]
    with pytest.raises(ValueError, match="tokenizer"):
        prepare_tokens(tmp_path / "a", jsonl, CAP, 0.05, tokenizer=str(other))
    with pytest.raises(ValueError, match="tokenizer"):
        prepare_tokens(tmp_path / "a", jsonl, CAP, 0.05)
    assert uses_byte_corpus(None, None, None) and uses_byte_corpus(jsonl.parent, "bytes", None)
    assert not uses_byte_corpus(jsonl, None, None)


# --- errors ----------------------------------------------------------------------------------


def one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_bad_inputs_give_one_line_errors(
    tmp_path: Path, bpe_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jsonl = write_jsonl(tmp_path / "c.jsonl", DOCS[:3])
    with pytest.raises(FileNotFoundError, match=r"tokenizer: no such file .*nowhere") as err:
        prepare_tokens(tmp_path / "x", jsonl, CAP, 0.05, tokenizer=str(tmp_path / "nowhere"))
    one_line(err)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"tokenizer: .*bad\.json") as err:
        load_tokenizer(tmp_path / "bad.json")
    one_line(err)

    lines = jsonl.read_text().splitlines()
    lines[1] = json.dumps({"body": "no text here"})
    (tmp_path / "nofield.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"text_field: line 2 of .*nofield\.jsonl") as err:
        prepare_tokens(tmp_path / "y", tmp_path / "nofield.jsonl", CAP, 0.05)
    one_line(err)

    pytest.importorskip("pyarrow")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(
        ValueError, match=r"data: .*broken\.parquet.* not a readable Parquet"
    ) as err:
        prepare_tokens(tmp_path / "z", tmp_path / "broken.parquet", CAP, 0.05)
    one_line(err)

    np.arange(10, dtype=np.uint16).tofile(tmp_path / "lone.bin")
    with pytest.raises(FileNotFoundError, match=r"data: .*lone\.bin.* no sidecar") as err:
        prepare_tokens(tmp_path / "w", tmp_path / "lone.bin", CAP, 0.05)
    one_line(err)
    (tmp_path / "lone.bin.json").write_text(json.dumps({"dtype": "float32"}))
    with pytest.raises(ValueError, match=r"data: .*lone\.bin\.json.* dtype 'float32'") as err:
        prepare_tokens(tmp_path / "w", tmp_path / "lone.bin", CAP, 0.05)
    one_line(err)
    (tmp_path / "lone.bin.json").write_text(json.dumps({"dtype": "uint16"}))
    np.arange(300, dtype=np.uint16).tofile(tmp_path / "lone.bin")
    with pytest.raises(ValueError, match=r"data: .*lone\.bin.* outside the tokenizer 'bytes'"):
        prepare_tokens(tmp_path / "w", tmp_path / "lone.bin", CAP, 0.05)

    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "state.json").write_text("{}")
    (folder / "dataset_info.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets → ImportError
    with pytest.raises(ValueError, match=r"data: .*ds.*normlab\[hf\]") as err:
        prepare_tokens(tmp_path / "v", folder, CAP, 0.05)
    one_line(err)


def test_cache_entry_names(tmp_path: Path, bpe_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every name written in the data folder, also while writing, is a cache entry."""
    seen: list[str] = []
    copy = token_cache_module._copy

    def spy(parts: list[Path], out: object) -> None:  # runs while a final file is written
        seen.extend(p.name for p in parts[0].parent.iterdir())
        copy(parts, out)

    monkeypatch.setattr(token_cache_module, "_copy", spy)
    jsonl = write_jsonl(tmp_path / "c.jsonl", DOCS)
    corpus_bpe(jsonl, 40, tmp_path / "data", max_bytes=CAP, val_fraction=0.05)
    prepare_tokens(tmp_path / "data", jsonl, CAP, 0.05, tokenizer=str(bpe_path))
    seen += [p.name for p in (tmp_path / "data").iterdir()]
    assert any(name.endswith(".tmp") for name in seen) and "token_bytes.u16" in seen
    assert all(is_cache_entry(name) for name in seen), seen
    for name in ("my_corpus.txt", "tokens.u8.bak", ".data.json.tmp", "bpe-xyz"):
        assert not is_cache_entry(name)


def test_document_split_rule() -> None:
    """A record's fraction is pinned to its content; the mask chooses as split_by_file does."""
    digest = hashlib.sha256(b"document\0hello").digest()
    assert document_fraction(b"hello") == int.from_bytes(digest[:8], "big") / 2.0**64
    files = [SourceFile(f"a/m{i}.py", b"x") for i in range(300)]
    _, val = split_by_file(files, 0.05)
    mask = validation_mask(np.asarray([path_fraction(f.rel_path) for f in files]), 0.05)
    assert {f.rel_path for f in val} == {f.rel_path for f, m in zip(files, mask, strict=True) if m}
    assert validation_mask(np.asarray([0.9, 0.8]), 0.05).tolist() == [False, True]
    assert validation_mask(np.asarray([0.01, 0.02]), 0.05).tolist() == [True, False]
    with pytest.raises(ValueError, match="at least 2 documents"):
        validation_mask(np.asarray([0.5]), 0.05)
