"""Put one arm's norm into every norm slot of a model that can take it; hold the rest.

The one implementation is :func:`normlab.patching.swap.swap_norms`, shared with
``normlab.replace_norms(model, to=kind)``; the model sources call it from here."""

from normlab.patching.swap import module_repr, swap_norms

__all__ = ["module_repr", "swap_norms"]
