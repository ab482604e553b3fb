"""specreg.declare: specreg.yaml, the declarative registry, reconciled with disk and runs.

The names a command line needs before anything runs (option defaults and choices) live here,
so `--help` does not load the YAML library or the registry.
"""

SPEC_FILENAME = "specreg.yaml"
# specreg.yaml's names for llama.cpp's flag dialects (specreg.terms: spec-type, draft-max).
DIALECT_CURRENT = "current"
DIALECT_LEGACY = "legacy"
# What `specreg export --format` writes.
EXPORT_FORMATS = ("llama-server", "llama-swap", "models-preset")
