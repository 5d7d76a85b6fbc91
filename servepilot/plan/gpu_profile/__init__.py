"""GPU operator profiles, read: the shapes of a model's engine step (shapes.py), a profile
read back as tables (table.py), and step times composed from it (compose.py) behind the cost
model's interface (source.py). Timing them on a GPU is I/O on a device, so the profiler that
runs PyTorch lives in servepilot/engine/gpu/ (profiler.py, profile.py)."""
