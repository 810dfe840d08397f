"""SortedRuns: rows added in any order come back in key order, stably, whether they fit in one
in-memory chunk or spill into several run files that are merged."""

from __future__ import annotations

import random

import pytest
from lading.selection import runs
from lading.selection.runs import SortedRuns


def rows(count: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(f"key-{rng.randrange(count // 2 + 1):06d}", index) for index in range(count)]


def expected(added: list[tuple[str, int]]) -> list[tuple[str, int]]:
    return sorted(added, key=lambda row: row[0])  # stable: equal keys keep the order they came in


@pytest.mark.parametrize("count", [0, 1, 999])
def test_rows_within_one_chunk_come_back_sorted_and_can_be_read_twice(count: int) -> None:
    added = rows(count, seed=count)
    with SortedRuns() as sorted_runs:
        sorted_runs.extend(added)
        sorted_runs.finish()
        assert list(sorted_runs) == expected(added)
        assert list(sorted_runs) == expected(added)
        assert sorted_runs.count == count


def test_rows_over_several_chunks_spill_into_runs_and_merge_stably(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "CHUNK_ROWS", 100)
    added = rows(2_050, seed=7)
    with SortedRuns() as sorted_runs:
        sorted_runs.extend(added)
        sorted_runs.finish()
        assert list(sorted_runs) == expected(added)


def test_a_listing_in_key_order_reads_back_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs, "CHUNK_ROWS", 64)
    added = [(f"k{index:05d}", index) for index in range(1_000)]
    with SortedRuns() as sorted_runs:
        sorted_runs.extend(added)
        assert list(sorted_runs.finish()) == added


def test_reading_before_finish_is_refused() -> None:
    with SortedRuns() as sorted_runs:
        sorted_runs.add(("a", 1))
        with pytest.raises(RuntimeError, match="before finish"):
            iter(sorted_runs)
