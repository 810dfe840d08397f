"""Run by tests/test_fork_reads.py in a fresh process: a torch DataLoader with forked workers over
one lading dataset, as a training script would build it. Prints one JSON line: what was read and
which process read it. Usage: forked_loader.py KIND URI [--parent-reads-first]"""

from __future__ import annotations

import json
import logging
import os
import sys


def build(kind: str, uri: str):
    from lading.datasets import PackedDataset, ShardDataset, StoreDataset

    if kind == "store":
        return StoreDataset(uri)
    if kind == "packed":
        return PackedDataset(uri, use_cache=False)
    return ShardDataset(uri, batch_size=4, rank=0, world_size=1)


def main() -> None:
    kind, uri = sys.argv[1], sys.argv[2]
    logging.basicConfig(level=logging.WARNING, format="%(process)d %(name)s %(levelname)s %(message)s")
    import torch.utils.data as tud

    dataset = build(kind, uri)
    if "--parent-reads-first" in sys.argv:
        next(iter(dataset)) if kind == "shards" else dataset[0]  # obstore starts in the parent
    loader = tud.DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=lambda batch: (os.getpid(), batch))
    samples, pids = [], set()
    for pid, batch in loader:
        pids.add(pid)
        for sample in batch:
            samples.append(sample["__key__"] if isinstance(sample, dict) else len(sample))
    print(json.dumps({"samples": samples, "workers": sorted(pids), "parent": os.getpid()}))


if __name__ == "__main__":
    main()
