"""This machine and the ones you ask about: one `Host` (cores, memory, NUMA, stated facts),
its memory bandwidth, CPU accounting, and `doctor`'s diagnosis of its llama.cpp settings.

Imports registry and the core modules; never llama.cpp adapters or anything above.
"""
