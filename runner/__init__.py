"""Single measurements with real llama.cpp: workloads, the protocol, one run (llama-server or
a legacy engine), its recording lifecycle, verification, lookup caches, calibration.

Imports recommender, llama, host, auditor, registry and the core modules.
"""
