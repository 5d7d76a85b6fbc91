"""Capacity planning: model specs, the hardware catalog, memory, layout, knobs, cost.

Pure functions of data: nothing here starts a process or opens a socket, so `tune` and `sim`
call the same code `servepilot plan` prints.
"""
