"""``torch.nn`` modules: thin holders of parameters that call :mod:`normlab.functional`."""

from normlab.layers.adaptive import AdaLayerNormZero, AdaRMSNorm
from normlab.layers.dyt import DynamicTanh
from normlab.layers.layer_norm import LayerNorm
from normlab.layers.rms_norm import RMSNorm

__all__ = ["AdaLayerNormZero", "AdaRMSNorm", "DynamicTanh", "LayerNorm", "RMSNorm"]
