"""The node's GPUs: one reader (NVML, else nvidia-smi) behind a one-method seam, the device
assignment of a fleet's replicas computed from what it reads, and the operator profiler that
times a model's step on the GPU with PyTorch (profiler.py, stand-alone; profile.py, what
`servepilot profile` runs)."""
