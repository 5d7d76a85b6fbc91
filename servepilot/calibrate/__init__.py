"""`servepilot calibrate`: probes of a real replica, their samples, and the cost-model fit."""
