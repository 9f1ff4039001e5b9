"""ATen -> IR lowerings. Importing this package fills :data:`registry.GENERIC`."""
from . import (depthwise, indexing, misc, pointwise, pool_offsets, pooling, random,  # noqa: F401  (registration)
               reductions, views)
from .context import FallbackRecord, LoweringContext
from .registry import GENERIC, LoweringRegistry, lowering
from .values import Lazy, Realized, TensorValue

__all__ = ["GENERIC", "LoweringRegistry", "lowering", "LoweringContext", "FallbackRecord",
           "Lazy", "Realized", "TensorValue"]
