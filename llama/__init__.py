"""llama.cpp adapters: install and build, child processes, llama-server, the argv of a
configuration, perplexity and logits files, speculative statistics.

Imports host, registry and the core modules; nothing that measures or decides.
"""
