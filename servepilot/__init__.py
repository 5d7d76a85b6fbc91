"""servepilot: plan, launch, route, load-test, tune and simulate LLM serving on vLLM."""

__version__ = "0.1.0"
