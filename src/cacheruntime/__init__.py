"""cacheruntime: the boundary between LLM-serving control and the GPU cache runtime.

`protocol` is the shared vocabulary, `model` the executable spec, `runtime` the physical
side, `control` the policy side; `tlc`, `z3check` and `conformance` are the checkers.
"""

__version__ = "0.1.0"
