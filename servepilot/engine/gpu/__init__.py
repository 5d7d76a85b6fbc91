"""The node's GPUs: one reader (NVML, else nvidia-smi) behind a one-method seam, and the
device assignment of a fleet's replicas computed from what it reads."""
