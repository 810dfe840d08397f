"""Sample data for the demo: ``demo_data.py context DIR`` (more kinds as features land)."""

import os
import sys
from pathlib import Path


def make_context(root: Path) -> None:
    """A det model directory with code, a checkpoint and a dataset that push it over 95 MiB."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "checkpoints").mkdir(exist_ok=True)
    (root / "model_def.py").write_text("import torch\n\nclass Trial:\n    pass\n")
    (root / "const.yaml").write_text("name: demo\nentrypoint: model_def:Trial\n")
    for i in range(8):
        (root / "data" / f"train-{i:02d}.bin").write_bytes(os.urandom(12 << 20))
    (root / "checkpoints" / "epoch-1.pt").write_bytes(os.urandom(3 << 20))
    (root / "__pycache__").mkdir(exist_ok=True)
    (root / "__pycache__" / "model_def.cpython-311.pyc").write_bytes(b"\0" * 2048)
    (root / "data" / ".detignore").write_text("*.bin\n")  # det ignores nested .detignore files
    (root / ".env").write_text("WANDB_API_KEY=not-a-real-key\n")


if __name__ == "__main__":
    kind, target = sys.argv[1], Path(sys.argv[2])
    {"context": make_context}[kind](target)
