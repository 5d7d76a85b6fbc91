"""servepilot: plan, launch, route, load-test, tune and simulate LLM serving on vLLM."""

# First, before any module of ours: the finder that serves the compiled builds of the
# simulator's and the gateway's hot modules where one matches their sources (core/accel.py).
from servepilot.core import accel as _accel

_accel.install()

__version__ = "0.1.0"
