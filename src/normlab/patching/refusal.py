"""Why a norm module is kept: the exceptions the replacement and its checks raise."""

from __future__ import annotations


class Refused(Exception):
    """A module normlab will not replace; the message says why."""


class HoldsNorms(Refused):
    """A module that holds norm modules of its own: they are handled one by one."""


class Unverifiable(Refused):
    """The original itself cannot be checked (whatever the candidate): no other is tried."""
