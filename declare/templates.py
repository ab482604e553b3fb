"""The commented skeleton `specreg init` writes."""

INIT_TEMPLATE = """\
# specreg.yaml: what this model collection is for. specreg keeps it true (`specreg plan`).
# Units: acceptance is a fraction (0.70), speeds are tokens/s, K is spelled draft_max.
version: 1

llama:
  # bin_dir: /opt/llama.cpp/build/bin   # the llama.cpp binaries to use
  dialect: auto                        # auto | current (--spec-type) | legacy (--draft-max)
  # threads: 96
  # numa: interleave=all               # numactl policy put in front of llama-server

roots: []                              # folders to scan, e.g. [/mnt/models]
stores: []                             # lmstudio | huggingface | llama-cpp | ollama
exclude: []                            # glob patterns, e.g. ["*/scratch/*"]

# Models by fingerprint (`specreg show PATH` prints the id), with names to refer to them by.
models: {}
#  3f9c...e1:
#    path: lmstudio/Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf
#    aliases: [qwen3-coder-30b]

# Roles bind a target model, a policy and pinned configurations per task.
roles: {}
#  coder:
#    target: qwen3-coder-30b
#    policy: quality                   # quality: all experts, lossless | speed: fewer experts ok
#    configs:
#      default:
#        draft: qwen3-coder-draft
#        draft_max: 16
"""
