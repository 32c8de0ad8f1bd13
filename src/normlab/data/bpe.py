"""Train a byte-level BPE tokenizer with ``tokenizers``, deterministically, and cache it.

The vocabulary is the 256 byte symbols plus ``n_merges`` merges (fewer if the corpus runs out of
pairs seen at least ``min_frequency`` times); no special tokens. The same texts and settings
give the same ``tokenizer.json``, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from normlab._io import write_text_atomic
from normlab.data import documents as docs_mod
from normlab.data.sources import stdlib_root
from normlab.data.split import validation_mask
from normlab.data.token_cache import plan_documents, source_format, utf8_cut

TOKENIZER_FILE = "tokenizer.json"


def _check_merges(n_merges: object) -> int:
    if isinstance(n_merges, bool) or not isinstance(n_merges, int) or n_merges < 1:
        raise ValueError(f"n_merges: expected an int >= 1, got {n_merges!r}")
    return n_merges


def train_bpe(texts: Iterable[str], n_merges: int, path: Path, min_frequency: int = 2) -> Path:
    """Train a byte-level BPE (vocabulary 256 + up to ``n_merges``) on ``texts`` and write its
    ``tokenizer.json`` atomically to ``path``; returns ``path``."""
    n_merges = _check_merges(n_merges)
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise ValueError(
            "tokenizer: training a BPE needs tokenizers; pip install 'normlab[hf]'"
        ) from None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + n_merges,
        min_frequency=min_frequency,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    write_text_atomic(path, tok.to_str())
    return Path(path)


def training_texts(
    source: str | Path | None,
    *,
    text_field: str = "text",
    data_format: str | None = None,
    max_bytes: int,
    val_fraction: float,
) -> Iterator[str]:
    """The texts of a source's training side, chosen exactly as the token cache splits it
    (:func:`normlab.data.token_cache.prepare_token_cache`), so a BPE never sees validation text.
    A single document gives its leading ``1 − val_fraction`` of bytes."""
    fmt = source_format(source, data_format)
    if fmt not in docs_mod.TEXT_FORMATS:
        raise ValueError(f"data: a BPE is trained on text; {str(source)!r} holds {fmt} tokens")
    path = stdlib_root() if fmt == docs_mod.STDLIB else Path(source).expanduser().resolve()
    fractions, cut, _ = plan_documents(path, fmt, text_field, max_bytes)
    if not fractions:
        raise ValueError(f"data: no documents found in {str(path)!r}")
    stream = docs_mod.iter_documents(path, fmt, text_field, limit=max_bytes + 1)
    if len(fractions) == 1:
        data = next(stream).data
        data = utf8_cut(data, cut) if cut is not None else data
        keep = len(data) - max(1, round(len(data) * val_fraction))
        yield utf8_cut(data, keep).decode("utf-8", errors="replace")
        return
    mask = validation_mask(np.asarray(fractions), val_fraction)
    for is_val, doc in zip(mask, stream, strict=False):
        if not is_val:
            yield doc.data.decode("utf-8", errors="replace")


def corpus_bpe(
    source: str | Path | None,
    n_merges: int,
    cache_dir: Path,
    *,
    text_field: str = "text",
    data_format: str | None = None,
    max_bytes: int,
    val_fraction: float,
) -> Path:
    """A byte-level BPE trained on the training side of ``source`` (:func:`training_texts`),
    cached as ``cache_dir/bpe-<fingerprint>/tokenizer.json``; returns that path.

    fingerprint = first 16 hex digits of sha256(settings JSON ‖ each training text's sha256),
    settings = n_merges, min_frequency, the tokenizers version; a second call with the same
    corpus and settings reads the texts once (to hash them) and trains nothing."""
    n_merges = _check_merges(n_merges)
    try:
        import tokenizers
    except ImportError:
        raise ValueError(
            "tokenizer: training a BPE needs tokenizers; pip install 'normlab[hf]'"
        ) from None
    settings = {"n_merges": n_merges, "min_frequency": 2, "tokenizers": tokenizers.__version__}

    def texts() -> Iterator[str]:
        return training_texts(
            source,
            text_field=text_field,
            data_format=data_format,
            max_bytes=max_bytes,
            val_fraction=val_fraction,
        )

    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode("utf-8"))
    for text in texts():
        h.update(hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).digest())
    path = Path(cache_dir) / f"bpe-{h.hexdigest()[:16]}" / TOKENIZER_FILE
    if path.is_file():
        return path
    return train_bpe(texts(), n_merges, path)
