"""specreg: a registry for speculative decoding with llama.cpp."""

__version__ = "0.1.0"
