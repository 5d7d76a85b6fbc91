"""What the server core raises to a handler.

Its own module, outside the modules `make gateway-fast` compiles (core/accel.py): mypyc
cannot compile a subclass of a builtin exception other than Exception itself.
"""

from __future__ import annotations


class Disconnected(ConnectionError):
    """The client went away; nothing more can be written to it."""
