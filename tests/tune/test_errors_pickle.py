"""Errors a Ray worker raises reach the driver pickled: each must come back whole, or Ray
reports "Failed to deserialize exception" instead of what went wrong (tune/test_ray_sweep.py)."""

from __future__ import annotations

import pickle
from pathlib import Path

from specreg.host.load import BusyHost, LoadSample
from specreg.llama.process import ServerFailed


def test_server_failed_survives_pickling() -> None:
    err = ServerFailed("oom", "llama-server ran out of memory", "ggml: alloc failed", Path("/x"))
    back = pickle.loads(pickle.dumps(err))
    assert (back.kind, back.summary, back.llama_message, back.log_path) == (
        "oom", "llama-server ran out of memory", "ggml: alloc failed", Path("/x"),
    )  # fmt: skip
    assert str(back) == str(err)


def test_busy_host_survives_pickling() -> None:
    sample = LoadSample(window_s=0.5, foreign_cores=1.5, logical_cpus=2, consumers=())
    err = BusyHost("host busy: others used 1.5 of 2 cores", sample)
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.sample == sample
