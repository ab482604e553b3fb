"""A host's calibration as `specreg calibrate` records it, built by hand."""

from __future__ import annotations

from datetime import datetime, timezone

from specreg.registry.calibration import KIND_BATCH, KIND_GEN, CalibrationRecord, point


def calibration_record(
    model_id: str = "m1", scale: float = 1.0, threads: int = 2
) -> CalibrationRecord:
    batch = [
        point(KIND_BATCH, n, (0.010 * n * scale, 0.011 * n * scale, 0.012 * n * scale))
        for n in (1, 2, 4, 8, 16, 32)
    ]
    return CalibrationRecord(
        host_fingerprint="hostA",
        model_id=model_id,
        model_path=f"/models/{model_id}.gguf",
        role="target",
        threads=threads,
        measured_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
        repetitions=3,
        points=(*batch, point(KIND_GEN, 64, (0.64 * scale, 0.70 * scale), foreign_cpu_s=0.01)),
        model_bytes=123,
        argv=("llama-bench", "-m", "x"),
    )
