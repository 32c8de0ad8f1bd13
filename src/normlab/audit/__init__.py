"""Black-box audits: what a norm implementation computes, and where a model's norms sit."""

from normlab.audit.findings import Finding
from normlab.audit.model import ModelAudit, NormSite, audit_model, is_norm_module, takes_condition
from normlab.audit.probe import NormAudit, audit_norm

__all__ = [
    "Finding",
    "ModelAudit",
    "NormAudit",
    "NormSite",
    "audit_model",
    "audit_norm",
    "is_norm_module",
    "takes_condition",
]
