"""Tokenizers: bytes (vocabulary 256, the default) or a local Hugging Face tokenizer.

``tokenizer`` is ``None``/``"bytes"``, a ``tokenizer.json`` file, or a local folder holding one
(or loadable by ``transformers.AutoTokenizer`` with ``local_files_only=True``). Nothing is ever
downloaded. ``tokenizers`` and ``transformers`` are imported only when such a tokenizer is used.

Every tokenizer turns one document's bytes into token ids and the UTF-8 byte count of each token,
so that bits per byte can be computed for any window (:mod:`normlab.data.bpb`). The byte counts of
one document always add up to the UTF-8 length of the text the tokenizer saw.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

BYTES = "bytes"
HF_EXTRA = "pip install 'normlab[hf]'"
MAX_TOKEN_BYTES = 2**16 - 1


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype holding ids below ``vocab_size``: uint8 (≤ 256), uint16
    (≤ 65,536) or uint32."""
    if vocab_size <= 2**8:
        return np.dtype(np.uint8)
    if vocab_size <= 2**16:
        return np.dtype(np.uint16)
    return np.dtype(np.uint32)


class ByteTokenizer:
    """One token per byte: id = the byte's value, each token covers 1 byte."""

    name = BYTES
    vocab_size = 256
    content_hash = BYTES
    is_bytes = True

    def encode(self, data: bytes) -> tuple[np.ndarray, np.ndarray | None]:
        """The document's bytes as uint8 ids; ``None`` byte counts (each token is one byte)."""
        return np.frombuffer(data, dtype=np.uint8), None

    def byte_table(self) -> np.ndarray:
        """Bytes covered by each id: all ones."""
        return np.ones(256, dtype=np.uint16)


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` (truncation and padding switched off; no special tokens are
    added): ``encode`` gives its ids and per-token UTF-8 byte counts.

    A document's bytes are decoded as UTF-8 (invalid sequences become U+FFFD) before encoding;
    the byte counts are those of that text's UTF-8.
    """

    is_bytes = False

    def __init__(self, backend: Any, name: str) -> None:
        backend.no_truncation()
        backend.no_padding()
        self.backend = backend
        self.name = name
        self.vocab_size = int(backend.get_vocab_size(with_added_tokens=True))
        text = backend.to_str()
        self.content_hash = "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    @cached_property
    def _table(self) -> np.ndarray | None:
        from tokenizers import decoders, pre_tokenizers

        if not isinstance(self.backend.decoder, decoders.ByteLevel):
            return None
        alphabet = set(pre_tokenizers.ByteLevel.alphabet())  # 256 characters, one per byte
        added = {i: t.content for i, t in self.backend.get_added_tokens_decoder().items()}
        table = np.zeros(self.vocab_size, dtype=np.int64)
        for i in range(self.vocab_size):
            token = added.get(i) if i in added else self.backend.id_to_token(i)
            if token is None:
                continue
            if i in added or not all(ch in alphabet for ch in token):
                table[i] = len(token.encode("utf-8"))
            else:
                table[i] = len(token)  # one byte-level character per byte
        return np.minimum(table, MAX_TOKEN_BYTES).astype(np.uint16)

    def byte_table(self) -> np.ndarray | None:
        """Bytes covered by each id, for a byte-level tokenizer (``decoder`` ByteLevel: a token's
        characters are bytes); ``None`` for others, whose ids alone do not say their bytes."""
        return self._table

    def encode(self, data: bytes) -> tuple[np.ndarray, np.ndarray]:
        return self.encode_batch([data])[0]

    def encode_batch(self, docs: list[bytes]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each document's ids (uint32) and byte counts (uint16).

        Byte counts: for a byte-level tokenizer, each id's bytes from :meth:`byte_table` when
        they add up to the document's length; otherwise from the offsets the tokenizer returns,
        token i covering the bytes from the end of token i − 1 to its own end (the last token
        also takes any trailing bytes), so bytes no token covers (dropped spaces) and bytes of a
        character split over several tokens are counted once.
        """
        texts = [d.decode("utf-8", errors="replace") for d in docs]
        encodings = self.backend.encode_batch(texts, add_special_tokens=False)
        table = self.byte_table()
        out = []
        for text, enc in zip(texts, encodings, strict=True):
            raw = text.encode("utf-8", errors="surrogatepass")
            ids = np.asarray(enc.ids, dtype=np.uint32)
            lengths = None
            if table is not None:
                lengths = table[ids]
                if int(lengths.sum(dtype=np.int64)) != len(raw):
                    lengths = None
            if lengths is None:
                lengths = _lengths_from_offsets(raw, enc.offsets)
            out.append((ids, lengths))
        return out


def _lengths_from_offsets(raw: bytes, offsets: list[tuple[int, int]]) -> np.ndarray:
    """Byte counts from character offsets: cut_i = max over j ≤ i of end_j in bytes, the last cut
    at len(raw); count_i = cut_i − cut_{i−1} (cut_{−1} = 0)."""
    if not offsets:
        return np.zeros(0, dtype=np.uint16)
    codes = np.frombuffer(raw, dtype=np.uint8)
    char_to_byte = np.append(np.flatnonzero((codes & 0xC0) != 0x80), len(raw))
    char_ends = np.asarray(offsets, dtype=np.int64)[:, 1]
    ends = char_to_byte[np.minimum(char_ends, len(char_to_byte) - 1)]
    cuts = np.maximum.accumulate(ends)
    cuts[-1] = len(raw)
    lengths = np.diff(cuts, prepend=0)
    if lengths.max(initial=0) > MAX_TOKEN_BYTES:
        raise ValueError(
            f"tokenizer: one token covers {int(lengths.max())} bytes; at most "
            f"{MAX_TOKEN_BYTES} are supported"
        )
    return lengths.astype(np.uint16)


Tokenizer = ByteTokenizer | HFTokenizer


def _import_tokenizers(spec: str) -> Any:
    try:
        import tokenizers
    except ImportError:
        raise ValueError(f"tokenizer: {spec!r} needs the tokenizers package; {HF_EXTRA}") from None
    return tokenizers


def load_tokenizer(spec: str | Path | None) -> Tokenizer:
    """The tokenizer named by ``spec``: ``None`` or ``"bytes"`` → :class:`ByteTokenizer`; a
    ``tokenizer.json`` file, or a folder holding one, → ``tokenizers.Tokenizer.from_file``; any
    other folder → ``transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)``
    (a fast tokenizer). Raises ``FileNotFoundError`` naming ``tokenizer`` for a missing path and
    ``ValueError`` for one that cannot be loaded."""
    if spec is None or str(spec) == BYTES:
        return ByteTokenizer()
    path = Path(spec).expanduser().resolve()
    if not path.exists():
        raise FileNotFoundError(
            f"tokenizer: no such file or folder {str(spec)!r}; expected a tokenizer.json file, "
            "a local tokenizer folder or 'bytes' (tokenizers are never downloaded)"
        )
    file = path / "tokenizer.json" if path.is_dir() else path
    if file.is_file():
        tokenizers = _import_tokenizers(str(spec))
        try:
            backend = tokenizers.Tokenizer.from_file(str(file))
        except Exception as err:
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ValueError(
                f"tokenizer: {str(file)!r} is not a tokenizers JSON file ({first})"
            ) from None
        return HFTokenizer(backend, str(path))
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError(
            f"tokenizer: the folder {str(spec)!r} has no tokenizer.json; loading it with "
            f"transformers needs that package: {HF_EXTRA}"
        ) from None
    try:
        auto = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(
            f"tokenizer: cannot load the folder {str(spec)!r} with transformers' AutoTokenizer "
            f"offline ({first})"
        ) from None
    if not getattr(auto, "is_fast", False):
        raise ValueError(
            f"tokenizer: {str(spec)!r} loads only as a slow transformers tokenizer; expected a "
            "fast one (a tokenizer.json)"
        )
    return HFTokenizer(auto.backend_tokenizer, str(path))
