"""Data for the testbeds: tokens for the GPT (bytes, vocabulary 256, from the standard library or
your files by default; or your corpus — text, JSON Lines, Parquet, a ``datasets`` folder,
pre-tokenized ids — with your tokenizer); tiny procedural images of shapes for the DiT.

:func:`prepare_tokens` builds an output folder's token cache once; :func:`load_tokens` maps it;
:class:`TrainBatches` and :func:`validation_windows` cut it into paired batches;
:func:`window_bytes` and :class:`BpbTally` give bits per byte for any tokenizer;
:func:`corpus_bpe` trains (and caches) a byte-level BPE on a corpus's training side.
:func:`load_shapes` makes the DiT's images (as patch tokens); the paired (image, label, noise,
time) batches drawn from them are the flow model's (:mod:`normlab.models.flow_batches`).
"""

from normlab.data.batches import (
    OffsetWindows,
    TrainBatches,
    batch_seed,
    split_offsets,
    validation_offsets,
    validation_windows,
)
from normlab.data.bpb import BpbTally, bits_per_byte, token_nats, window_bytes
from normlab.data.bpe import corpus_bpe, train_bpe, training_texts
from normlab.data.cache import (
    DEFAULT_MAX_BYTES,
    DEFAULT_VAL_FRACTION,
    INFO_FILE,
    STDLIB,
    TOKENS_FILE,
    VOCAB_SIZE,
    TokenData,
    check_source,
    fingerprint,
    load_tokens,
    prepare_tokens,
    read_corpus,
    request_key,
    uses_byte_corpus,
)
from normlab.data.documents import Document, detect_format, iter_documents
from normlab.data.pretokenized import TokenSource, open_token_source
from normlab.data.shapes import (
    SHAPE_CLASSES,
    SHAPES,
    ShapeData,
    load_shapes,
    make_shapes,
    patchify,
    prepare_shapes,
    unpatchify,
)
from normlab.data.sources import (
    EXCLUDED_DIRS,
    SourceFile,
    list_stdlib_files,
    list_text_files,
    read_files,
    stdlib_root,
)
from normlab.data.split import (
    document_fraction,
    path_fraction,
    split_by_file,
    split_single,
    validation_mask,
)
from normlab.data.token_cache import (
    CACHE_ENTRY,
    FORMATS,
    is_cache_entry,
    prepare_token_cache,
    source_format,
)
from normlab.data.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer, token_dtype

__all__ = [
    "CACHE_ENTRY",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_VAL_FRACTION",
    "EXCLUDED_DIRS",
    "FORMATS",
    "INFO_FILE",
    "SHAPES",
    "SHAPE_CLASSES",
    "STDLIB",
    "TOKENS_FILE",
    "VOCAB_SIZE",
    "BpbTally",
    "ByteTokenizer",
    "Document",
    "HFTokenizer",
    "OffsetWindows",
    "ShapeData",
    "SourceFile",
    "TokenData",
    "TokenSource",
    "TrainBatches",
    "batch_seed",
    "bits_per_byte",
    "check_source",
    "corpus_bpe",
    "detect_format",
    "document_fraction",
    "fingerprint",
    "is_cache_entry",
    "iter_documents",
    "list_stdlib_files",
    "list_text_files",
    "load_shapes",
    "load_tokenizer",
    "load_tokens",
    "make_shapes",
    "open_token_source",
    "patchify",
    "path_fraction",
    "prepare_shapes",
    "prepare_token_cache",
    "prepare_tokens",
    "read_corpus",
    "read_files",
    "request_key",
    "source_format",
    "split_by_file",
    "split_offsets",
    "split_single",
    "stdlib_root",
    "token_dtype",
    "token_nats",
    "train_bpe",
    "training_texts",
    "unpatchify",
    "uses_byte_corpus",
    "validation_mask",
    "validation_offsets",
    "validation_windows",
    "window_bytes",
]
