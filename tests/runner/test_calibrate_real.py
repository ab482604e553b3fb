"""`specreg calibrate` with the real llama-bench on SmolLM2-135M and its Q4_0 self-draft."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from specreg.host.machine import detect_host
from specreg.registry.calibration import latest_calibration
from specreg.registry.db import opened
from specreg.registry.scan import scan_paths
from specreg.samples.small_models import SmallModels


def test_real_curve_for_target_and_auto_draft(
    tmp_path: Path,
    small_models: SmallModels,
    llama_install,
) -> None:
    target = small_models.smollm2.path
    draft = small_models.draft("smollm2", "Q4_0").path
    db = tmp_path / "registry.duckdb"
    with opened(db) as con:
        scan_paths(con, [target, draft])
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "specreg",
            "calibrate",
            str(target),
            "--db",
            str(db),
            "--llama-bin",
            str(llama_install.bin_dir),
            "--threads",
            "1",
            "--repetitions",
            "2",
            "--gen-tokens",
            "16",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode in (0, 1), r.stderr  # 1: a test stayed disturbed by other processes
    doc = json.loads(r.stdout)
    assert (doc["version"], doc["kind"]) == ("2", "calibration")
    assert doc["contended"] == (r.returncode == 1)
    roles = [(m["role"], Path(m["model_path"]).name) for m in doc["models"]]
    assert roles == [("target", target.name), ("draft", draft.name)]
    host = detect_host()
    with opened(db, read_only=True) as con:
        for m in doc["models"]:
            rec = latest_calibration(con, host.fingerprint, m["model_id"], threads=1)
            assert rec is not None
            assert [p.n_tokens for p in rec.batch] == [1, 2, 4, 8, 16, 32]
            assert all(len(p.samples) == 2 for p in rec.points)
            assert rec.gen is not None and rec.gen.n_tokens == 16
            # one thread on a CPU: a pass over 32 tokens costs many single steps
            assert rec.verify_ratio(31) > 4.0
            assert (
                rec.argv[-12:]
                == (
                    "-m",
                    rec.model_path,
                    "-t",
                    "1",
                    "-r",
                    "2",
                    "-p",
                    "1,2,4,8,16,32",
                    "-n",
                    "16",
                    "-o",
                    "jsonl",
                )[-12:]
            )
