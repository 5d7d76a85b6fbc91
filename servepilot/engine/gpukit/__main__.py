"""`python -m servepilot.engine.gpukit`: build the GPU wheelhouse (see build.py)."""

import sys

from servepilot.engine.gpukit.build import main

sys.exit(main())
