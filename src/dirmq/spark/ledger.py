"""The durable ledger of one streaming consumer: which messages each micro-batch leased.

    <stateDir>/consumers/<queue>/@<consumer>/
      acked                                   the highest batch sequence number acknowledged
      batches/<seq, 20 digits>/
        part-<n, 5 digits>.json               {"receipts": [...], "leases": [...]}: what read
                                              partition n leased (path mode; written by the
                                              executor's task). "leases", when present, are
                                              the lease file names, aligned with the receipts:
                                              they acknowledge without the queue's index.
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
import shutil
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped]

from dirmq.errors import storage_error, storage_errors
from dirmq.store import smallfiles
from dirmq.store.filemodes import Access

_ROWS = "rows.arrow"


@dataclass(frozen=True)
class Record:
    """What one record holds: receipts, and the aligned lease names (empty if not recorded)."""

    receipts: list[str]
    leases: list[str]


class Ledger:
    def __init__(self, directory: str, access: Access) -> None:
        self.directory = directory
        self._access = access  # the modes of the records and directories made here
        self._batches = os.path.join(directory, "batches")

    # -- the acknowledged mark ---------------------------------------------------------------
    def acked(self) -> int:
        """The highest batch whose messages were all acknowledged (0 before the first)."""
        path = os.path.join(self.directory, "acked")
        with storage_errors(f"reading {path}"):
            raw = smallfiles.read_file(path)
        return int(raw) if raw else 0

    def set_acked(self, seq: int) -> None:
        if seq > self.acked():
            path = os.path.join(self.directory, "acked")
            with storage_errors(f"writing {path}"):
                smallfiles.replace_file(
                    path, b"%d\n" % seq, durable=True, access=self._access, make_parents=True
                )

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

    def record_part(
        self, seq: int, part: int, receipts: list[str], leases: list[str] | None = None
    ) -> bool:
        """Record what partition `part` of batch `seq` leased (`leases`: their lease names, in
        the same order, when known); False if a record exists."""
        record: dict[str, list[str]] = {"receipts": receipts}
        if leases is not None:
            assert len(leases) == len(receipts)
            record["leases"] = leases
        path = self._part_path(seq, part)
        with storage_errors(f"creating {path}"):
            created = smallfiles.create_file(
                path,
                json.dumps(record).encode(),
                durable=True,
                access=self._access,
                make_parents=True,
            )
        return created

    def part_record(self, seq: int, part: int) -> Record | None:
        path = self._part_path(seq, part)
        with storage_errors(f"reading {path}"):
            raw = smallfiles.read_file(path)
        if raw is None:
            return None
        record = json.loads(raw)
        return Record(list(record["receipts"]), list(record.get("leases") or []))

    def part(self, seq: int, part: int) -> list[str] | None:
        record = self.part_record(seq, part)
        return None if record is None else record.receipts

    def records(self, seq: int) -> list[Record]:
        """Every record of batch `seq`: its partitions' (path mode) or its rows' (url mode)."""
        found = [
            record
            for part in self.part_numbers(seq)
            if (record := self.part_record(seq, part)) is not None
        ]
        table = self.rows(seq)
        if table is not None:
            found.append(Record(table.column("receipt").to_pylist(), []))
        return found

    def _part_path(self, seq: int, part: int) -> str:
        return os.path.join(self.batch_dir(seq), f"part-{part:05d}.json")

    def write_rows(self, seq: int, table: pa.Table) -> None:
        """Record the rows the driver leased for batch `seq` (with their `receipt` column)."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        path = os.path.join(self.batch_dir(seq), _ROWS)
        with storage_errors(f"writing {path}"):
            smallfiles.replace_file(
                path,
                sink.getvalue().to_pybytes(),
                durable=True,
                access=self._access,
                make_parents=True,
            )

    def rows(self, seq: int) -> pa.Table | None:
        path = os.path.join(self.batch_dir(seq), _ROWS)
        with storage_errors(f"reading {path}"):
            raw = smallfiles.read_file(path)
        return None if raw is None else pa.ipc.open_file(pa.py_buffer(raw)).read_all()

    def receipts(self, seq: int) -> list[str]:
        """Every receipt batch `seq` holds, whichever way it was recorded."""
        return [r for record in self.records(seq) for r in record.receipts]

    def recorded_at(self, seq: int) -> float | None:
        """When the oldest record of batch `seq` was written, or None. Not the directory's
        mtime: settling one part moves that, and would delay renewing the others' leases."""
        directory = self.batch_dir(seq)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return None
        times = []
        for name in names:
            try:
                times.append(os.stat(os.path.join(directory, name)).st_mtime)
            except FileNotFoundError:
                continue  # settled meanwhile
        return min(times, default=None)

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
        shutil.rmtree(self.batch_dir(seq), ignore_errors=True)  # gone already is fine
