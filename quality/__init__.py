"""What a configuration costs in output and how often a draft agrees: KL divergence against
the lossless reference (llama-perplexity) and per-token draft agreement.

Imports runner and every part below it.
"""
