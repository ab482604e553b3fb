"""Models to try specreg on: the sparse demo collection, the small real models from PyPI
(SmolLM2, Gemma 3, Qwen2.5-Coder), and synthetic MoE/MTP models.

Imports auditor, registry and the core modules; llama.cpp tools are passed in as paths.
"""
