"""The parameter count N that a training budget of tokens per parameter is counted against.

Every testbed's model declares which of its parameters are embeddings
(``embedding_parameter_names``: :meth:`normlab.models.GPT.embedding_parameter_names`,
:meth:`normlab.models.DiT.embedding_parameter_names`,
:meth:`normlab.models.external.lm.SourceLM.embedding_parameter_names`) beside its
``count_parameters``; :func:`budget_count` counts by ``train.param_count``
(:data:`normlab.run_format.budget.PARAM_COUNTS`).
"""

from __future__ import annotations

from torch import nn

from normlab.run_format.budget import ALL_PARAMS, NON_EMBEDDING, PARAM_COUNTS

__all__ = ["budget_count", "embedding_count"]


def embedding_count(model: nn.Module) -> int:
    """Σ numel of the parameters ``model.embedding_parameter_names()`` names (tied weights
    once); TypeError naming the model when it declares no embeddings."""
    names = getattr(model, "embedding_parameter_names", None)
    if not callable(names):
        raise TypeError(
            f"model: {type(model).__name__} declares no embedding_parameter_names(); expected "
            "a testbed's model"
        )
    wanted = set(names())
    return sum(p.numel() for name, p in model.named_parameters() if name in wanted)


def budget_count(model: nn.Module, param_count: str) -> int:
    """N of ``model`` as ``param_count`` counts it: ``all``, every parameter (tied weights
    once: ``model.count_parameters()[0]``); ``non_embedding``, that minus
    :func:`embedding_count`. ValueError naming ``param_count`` for another value."""
    if param_count not in PARAM_COUNTS:
        raise ValueError(
            f"param_count: expected one of {', '.join(PARAM_COUNTS)}, got {param_count!r}"
        )
    total = int(model.count_parameters()[0])  # type: ignore[operator]
    if param_count == ALL_PARAMS:
        return total
    assert param_count == NON_EMBEDDING
    return total - embedding_count(model)
