"""paracube: plan, simulate and run 1D/2D/2.5D/3D tensor-parallel training of transformers."""

__version__ = "0.1.0"
