"""Data for the testbeds: byte tokens (vocabulary 256) from the standard library or your files
for the GPT; tiny procedural images of shapes for the DiT.

:func:`prepare_tokens` builds an output folder's token cache once; :func:`load_tokens` maps it;
:class:`TrainBatches` and :func:`validation_windows` cut it into paired batches.
:func:`load_shapes` makes the DiT's images (as patch tokens); :class:`FlowBatches` and
:func:`validation_triples` draw the paired (image, label, noise, time) batches.
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
    check_source,
    fingerprint,
    load_tokens,
    prepare_tokens,
    read_corpus,
    request_key,
)
from normlab.data.flow_batches import FlowBatches, flow_seed, sample_inputs, validation_triples
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
from normlab.data.split import path_fraction, split_by_file, split_single

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_VAL_FRACTION",
    "EXCLUDED_DIRS",
    "INFO_FILE",
    "SHAPES",
    "SHAPE_CLASSES",
    "STDLIB",
    "TOKENS_FILE",
    "VOCAB_SIZE",
    "FlowBatches",
    "ShapeData",
    "SourceFile",
    "TokenData",
    "TrainBatches",
    "batch_seed",
    "check_source",
    "fingerprint",
    "flow_seed",
    "list_stdlib_files",
    "list_text_files",
    "load_shapes",
    "load_tokens",
    "make_shapes",
    "patchify",
    "path_fraction",
    "prepare_shapes",
    "prepare_tokens",
    "read_corpus",
    "read_files",
    "request_key",
    "sample_inputs",
    "split_by_file",
    "split_single",
    "stdlib_root",
    "unpatchify",
    "validation_triples",
    "validation_windows",
]
