"""JAX (CPU): gradients averaged with `lax.pmean` across processes, per tensor or fused.

adapter.py is the registered framework; weights.py gives a zoo model's layer tree, its
initial weights and BatchNorm state (shared with the Theano / PyTensor adapter); layers.py writes the model as a
pure JAX function of its weights; blocks.py does so for the transformers (fused attention,
bf16 mixed precision); exchange.py averages and times every gradient message."""

from hpcbench.frameworks.jax.adapter import JaxFramework

__all__ = ["JaxFramework"]
