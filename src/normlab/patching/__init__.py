"""Replace the norm modules of a model by normlab's, each one verified before it is swapped.

:func:`replace_norms` walks a model and, for every norm module (see
:func:`normlab.audit.is_norm_module`), builds the normlab layer that computes the same function:

- ``torch.nn.LayerNorm`` → :class:`normlab.LayerNorm` with the same arguments;
- ``torch.nn.RMSNorm`` → :class:`normlab.RMSNorm` with ``casting="gemma"`` (torch rounds once,
  at the end);
- any other module that holds a ``weight`` over the last dimension (and optionally a ``bias``),
  or no parameters and a one-dimensional ``normalized_shape`` attribute: Hugging Face's
  ``LlamaRMSNorm``, ``GemmaRMSNorm``, ``T5LayerNorm``, OLMo's ``OlmoLayerNorm`` and their many
  copies, or your own. The black-box audit (:func:`normlab.audit.audit_norm`) says what it
  computes: with the mean subtracted and the biased variance, y = γ ⊙ (x − μ)·rsqrt(σ² + ε) + β
  (LayerNorm); without, y = (o + w) ⊙ x·rsqrt(mean(x²) + ε) with o = 0 or 1 (RMSNorm). ε must
  sit inside the root; it is read from an attribute (``eps``, ``variance_epsilon`` or
  ``epsilon``), or else is the audit's estimate rounded to one significant digit. The audit runs
  on a copy of the module with stand-in parameter values, once per class and configuration (the
  same class, attributes, parameter shapes, dtypes and devices).

A candidate replaces the original only after it reproduced it on random rows whose scales span
1e-3 to 10 (so that ε shows), shaped [B, T, D] and [B, T, H, D] (a norm that takes neither is
kept; one that normalises another axis of them does not match), in each probe dtype (the
parameters' dtype; for float32 parameters also bfloat16 and float16 input, for 16-bit
parameters also float32 input): the same output dtype, values equal within float32 rounding (at
most 2 ulps apart and at least 99 % bit-identical in 16-bit), and the same gradients of x and
of every parameter, frozen or not (within 1e-4 of the largest value; for 16-bit parameters, in
their dtype, within 8 units of its rounding). The checks run on a copy whose parameters are
clones of the original's (stand-in values for parameters on the meta device), so the original
is never written, torch's random number generators are left as they were, and they also run
under ``torch.no_grad`` or ``torch.inference_mode``. For an RMS-family module several 16-bit
roundings are tried (LLaMA, LLaMA with a promoted output dtype, Gemma, float32 output), and the
first that matches in every dtype wins.

The replacement takes over the original's ``Parameter`` objects, so parameter names, the state
dict, weight tying and an optimizer built beforehand all stay valid. A module is kept, with the
reason in its report, when a replacement could change more than its function: it has hooks
(forward, backward or state dict), a ``forward`` set on the instance (as accelerate's device
hooks do), a forward that takes more than the input (``residual``, …) or returns something
other than a tensor, parametrized parameters, buffers, sub-modules or state dict entries the
normlab layer lacks. So is one whose function normlab does not implement. A module without
parameters of its own that holds norm modules (one LayerNorm per head) is left as it is, and
each norm inside it is handled on its own.

``replace_norms(model, to=kind)`` instead puts *another* norm, the registered kind ``kind`` (or
``"none"``, the identity), into every norm slot of the model that can take it
(:func:`~normlab.patching.slots.norm_slots`: the slot's width and ε; :mod:`.swap` and
:mod:`.arm`, the same code that builds each arm's model for ``normlab compare --model``). Nothing
is verified against the original's function there (it is meant to change); what is checked is
that the slot can take a per-vector norm without losing anything else, and the slots that
cannot are held and reported with the reason.
"""

from normlab.patching.replace import NormReplacement, replace_norms

__all__ = ["NormReplacement", "replace_norms"]
