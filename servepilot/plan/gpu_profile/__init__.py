"""GPU operator profiles: the shapes of a model's engine step (shapes.py), the stand-alone
profiler that times them on a GPU (profiler.py: PyTorch and the standard library only), the
profile read back as tables (table.py), and step times composed from it (compose.py) behind
the cost model's interface (source.py)."""
