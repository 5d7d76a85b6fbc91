"""`servepilot bench`: load generation, metrics, the sweep and its reports."""
