"""The durable ledger of one streaming consumer: which messages each micro-batch leased.

    <stateDir>/consumers/<queue>/@<consumer>/
      acked                                   the highest batch sequence number acknowledged
      batches/<seq, 20 digits>/
        part-<n, 5 digits>.json               {"receipts": [...]}: what read partition n leased
                                              (path mode; written by the executor's task)
        rows.arrow                            the leased rows, with a `receipt` column (url
                                              mode; written by the driver)

A batch is recorded *before* any of its rows reaches Spark, and its record is removed only after
its messages were acknowledged, which happens only once Spark has committed the batch. So a batch
that Spark replays (a task retry, or a restart from the checkpoint after a failure) finds its
record and produces exactly the messages it produced before. Records are created with `link`, so
when two attempts of one task race, one record wins and the loser gives its messages back.

`acked` only moves forward. Batch sequence numbers are the `seq` of the source's offsets.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa  # type: ignore[import-untyped]

from dirmq.errors import storage_error
from dirmq.spark import durable

_ROWS = "rows.arrow"


class Ledger:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._batches = os.path.join(directory, "batches")

    # -- the acknowledged mark ---------------------------------------------------------------
    def acked(self) -> int:
        """The highest batch whose messages were all acknowledged (0 before the first)."""
        raw = durable.read_file(os.path.join(self.directory, "acked"))
        return int(raw) if raw else 0

    def set_acked(self, seq: int) -> None:
        if seq > self.acked():
            durable.replace_file(os.path.join(self.directory, "acked"), b"%d\n" % seq)

    # -- batches -----------------------------------------------------------------------------
    def batch_dir(self, seq: int) -> str:
        return os.path.join(self._batches, f"{seq:020d}")

    def seqs(self) -> list[int]:
        """Every batch with a record, in order."""
        try:
            names = os.listdir(self._batches)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise storage_error(exc, f"listing {self._batches}") from exc
        return sorted(int(n) for n in names if n.isdigit())

    def record_part(self, seq: int, part: int, receipts: list[str]) -> bool:
        """Record what partition `part` of batch `seq` leased; False if a record exists."""
        data = json.dumps({"receipts": receipts}).encode()
        return durable.create_file(self._part_path(seq, part), data)

    def part(self, seq: int, part: int) -> list[str] | None:
        raw = durable.read_file(self._part_path(seq, part))
        return None if raw is None else list(json.loads(raw)["receipts"])

    def parts(self, seq: int) -> dict[int, list[str]]:
        """Every partition record of batch `seq`, by partition number."""
        found = {}
        for part in self.part_numbers(seq):
            receipts = self.part(seq, part)
            if receipts is not None:
                found[part] = receipts
        return found

    def _part_path(self, seq: int, part: int) -> str:
        return os.path.join(self.batch_dir(seq), f"part-{part:05d}.json")

    def write_rows(self, seq: int, table: pa.Table) -> None:
        """Record the rows the driver leased for batch `seq` (with their `receipt` column)."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        durable.replace_file(os.path.join(self.batch_dir(seq), _ROWS), sink.getvalue().to_pybytes())

    def rows(self, seq: int) -> pa.Table | None:
        raw = durable.read_file(os.path.join(self.batch_dir(seq), _ROWS))
        return None if raw is None else pa.ipc.open_file(pa.py_buffer(raw)).read_all()

    def receipts(self, seq: int) -> list[str]:
        """Every receipt batch `seq` holds, whichever way it was recorded."""
        found = [r for receipts in self.parts(seq).values() for r in receipts]
        table = self.rows(seq)
        if table is not None:
            found.extend(table.column("receipt").to_pylist())
        return found

    def recorded_at(self, seq: int) -> float | None:
        """When batch `seq` was last recorded (its directory's mtime), or None."""
        try:
            return os.stat(self.batch_dir(seq)).st_mtime
        except FileNotFoundError:
            return None

    def part_numbers(self, seq: int) -> list[int]:
        """The partitions of batch `seq` that have a record."""
        try:
            names = os.listdir(self.batch_dir(seq))
        except FileNotFoundError:
            return []
        return sorted(int(n[5:-5]) for n in names if n.startswith("part-") and n.endswith(".json"))

    def drop_part(self, seq: int, part: int) -> None:
        try:
            os.unlink(self._part_path(seq, part))
        except FileNotFoundError:
            pass

    def drop(self, seq: int) -> None:
        durable.remove_tree(self.batch_dir(seq))
