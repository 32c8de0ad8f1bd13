"""Callbacks that log a Hugging Face ``Trainer`` or a Lightning ``Trainer`` run in normlab's run
format through :mod:`normlab.track`, so that ``normlab compare --script`` can pair, check and
judge it (docs/own-loop.md).

- :class:`normlab.integrations.hf.NormlabCallback`: a ``transformers.TrainerCallback``
  (extra ``normlab[hf]``);
- :class:`normlab.integrations.lightning.NormlabCallback`: a ``lightning.pytorch.Callback``
  (extra ``normlab[lightning]``).

Importing this package imports neither library; importing one of its modules imports that
module's library, and says which extra to install when it is missing.
"""
