"""What is on disk: GGUF headers, the DuckDB registry, scans, migrations, and every store
(runs, calibration, quality, audits, lookup caches).

Imports only specreg's core modules (terms, errors, jsonout, text, home, sources, stacks).
"""
