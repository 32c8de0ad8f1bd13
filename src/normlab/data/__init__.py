"""Data for the testbeds: byte tokens (vocabulary 256) from the standard library or your files.

:func:`prepare_tokens` builds an output folder's token cache once; :func:`load_tokens` maps it;
:class:`TrainBatches` and :func:`validation_windows` cut it into paired batches.
"""

from normlab.data.batches import TrainBatches, batch_seed, validation_windows
from normlab.data.cache import (
    DEFAULT_MAX_BYTES,
    DEFAULT_VAL_FRACTION,
    INFO_FILE,
    STDLIB,
    TOKENS_FILE,
    VOCAB_SIZE,
    TokenData,
    fingerprint,
    load_tokens,
    prepare_tokens,
    read_corpus,
    request_key,
)
from normlab.data.sources import (
    EXCLUDED_DIRS,
    SourceFile,
    list_stdlib_files,
    list_text_files,
    read_files,
    stdlib_root,
)
from normlab.data.split import path_fraction, split_by_file, split_single

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_VAL_FRACTION",
    "EXCLUDED_DIRS",
    "INFO_FILE",
    "STDLIB",
    "TOKENS_FILE",
    "VOCAB_SIZE",
    "SourceFile",
    "TokenData",
    "TrainBatches",
    "batch_seed",
    "fingerprint",
    "list_stdlib_files",
    "list_text_files",
    "load_tokens",
    "path_fraction",
    "prepare_tokens",
    "read_corpus",
    "read_files",
    "request_key",
    "split_by_file",
    "split_single",
    "stdlib_root",
    "validation_windows",
]
