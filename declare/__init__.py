"""specreg.declare: specreg.yaml, the declarative registry, reconciled with disk and runs.

The names a command line needs before anything runs (option defaults and choices) live here,
so `--help` does not load the YAML library or the registry.
"""

from specreg.terms import DIALECT_CURRENT, DIALECT_LEGACY

SPEC_FILENAME = "specreg.yaml"

__all__ = ["DIALECT_CURRENT", "DIALECT_LEGACY", "EXPORT_FORMATS", "SPEC_FILENAME"]

# What `specreg export --format` writes.
EXPORT_FORMATS = ("llama-server", "llama-swap", "models-preset")
