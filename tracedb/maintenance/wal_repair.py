"""Repairing a damaged WAL: the plain cut, its dry run, and salvage.

A plain repair (`tracedb wal repair`) stays fail-closed: the log is cut at its first damage, every
file it changes is copied to `.broken` first, and nothing after the damage is applied. Its dry
run says what the cut would drop: the records after the damage that still have a valid CRC, the
LSNs the damaged bytes held, and the executions those records belong to. A cut below the
database's applied LSN would leave a log that ends before the database: the log then continues
after the applied LSN instead (those records are in the database already), so the data directory
always opens again.

Salvage (`tracedb wal repair --salvage`) keeps every record whose CRC is valid. It reads every
segment and every `.broken` copy in the WAL directory record by record, resyncing after damage on
the next valid record header (the segment's salt, an LSN that continues the chain; a damaged
segment header's salt is found from the records), cuts the live log at its first damage as a
plain repair does, opens the store (which compacts what is before the cut), and then appends
again, as new WAL records, every salvaged record the database does not hold yet, and compacts
them. Records are applied by content, so a record already in the database is never applied
twice, and salvage can run again, or after a plain repair already cut the log. Every execution
that lost an event is marked not replayable, `record_corrupted`, with the missing seqs in its
status note; what survived is kept.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Callable, Optional

import orjson
import sqlalchemy as sa

import wal
from wal import salvage_file, segment_of

from tracedb.projection import db
from tracedb.records.codec import OP_EVENT, OP_FINISH, OP_INCOMPLETE, OP_INVALIDATE, OP_RECORDING_FAILURE, OP_START, is_event
from tracedb.config import Config
from tracedb.errors import StoreInUseError, StoreNotFoundError, path_exists
from tracedb.records.fold import read_record, record_time
from tracedb.projection.models import compaction_checkpoint, trace_steps, traces
from tracedb.reads.wal_tail import recorder_id_of
from tracedb.records.record import REASON_RECORD_CORRUPTED, REASON_RECORDING_FAILURE, STATUS_INVALIDATED, STATUS_RUNNING, compute_envelope_hash

_CHUNK = 500
_APPEND_CHUNK = 1000


@dataclass(frozen=True)
class LostRange:
    """A damaged range of a WAL file: where, how long, and the LSNs it held."""

    file: str
    offset: int
    length: int
    first_lsn: Optional[int]
    last_lsn: Optional[int]  # None: unknown (damage running to the end of the log)
    torn_tail: bool
    # Its LSNs lie in a gap a cut left (the log went on above the records it removed): they
    # were never applied, whatever the applied LSN.
    cut_off: bool = False

    def held(self, applied_lsn: int) -> bool:
        """True when the database holds what the range held (it lies below the applied LSN)."""
        return not self.cut_off and self.last_lsn is not None and 0 < self.last_lsn <= applied_lsn

    def to_dict(self) -> dict:
        return {"file": self.file, "offset": self.offset, "length": self.length,
                "first_lost_lsn": self.first_lsn, "last_lost_lsn": self.last_lsn, "torn_tail": self.torn_tail}

    def describe(self, applied_lsn: int = 0) -> str:
        """One line; `applied_lsn`: what the database holds (a range below it is not lost)."""
        if self.first_lsn is None:
            lost = "no record lost"
        elif self.last_lsn is None:
            lost = f"LSN {self.first_lsn} on lost (how many is unknown)"
        elif self.first_lsn == self.last_lsn:
            lost = f"LSN {self.first_lsn} lost"
        else:
            lost = f"LSN {self.first_lsn}..{self.last_lsn} lost ({self.last_lsn - self.first_lsn + 1} records)"
        kind = "torn tail (never acknowledged)" if self.torn_tail else "damage"
        held = " (in the database already)" if self.held(applied_lsn) else ""
        return f"{kind}: {self.file} at offset {self.offset}, {self.length} byte(s): {lost}{held}"


@dataclass(frozen=True)
class RepairReport:
    """What `wal repair` did (or, with `dry_run`, would do)."""

    salvage: bool
    dry_run: bool
    damaged: tuple[LostRange, ...]
    applied_lsn: int
    cut_segment: Optional[str] = None
    cut_offset: Optional[int] = None
    last_lsn: int = 0
    dropped_records: int = 0  # records with a valid CRC the cut drops (not kept by a plain repair)
    dropped_executions: tuple[str, ...] = ()
    below_applied: bool = False  # the cut is below the applied LSN (those records are in the database)
    kept_records: int = 0  # salvage: records found again after the damage
    relogged_records: int = 0  # salvage: of those, appended again (the database lacked them)
    corrupted: tuple[tuple[str, tuple[int, ...]], ...] = ()  # salvage: (execution id, missing seqs)
    broken_copies: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def repaired(self) -> bool:
        return bool(self.damaged) or self.cut_segment is not None

    @property
    def lost_records(self) -> Optional[int]:
        """LSNs the damaged bytes held (None when a range's end is unknown)."""
        total = 0
        for r in self.damaged:
            if r.torn_tail or r.first_lsn is None or r.held(self.applied_lsn):
                continue
            if r.last_lsn is None:
                return None
            total += r.last_lsn - r.first_lsn + 1
        return total

    def to_dict(self) -> dict:
        return {
            "salvage": self.salvage, "dry_run": self.dry_run, "repaired": self.repaired,
            "damaged": [r.to_dict() for r in self.damaged], "applied_lsn": self.applied_lsn,
            "truncated_segment": self.cut_segment, "truncated_at": self.cut_offset, "last_lsn": self.last_lsn,
            "lost_records": self.lost_records, "dropped_records": self.dropped_records,
            "dropped_executions": list(self.dropped_executions), "below_applied": self.below_applied,
            "kept_records": self.kept_records, "relogged_records": self.relogged_records,
            "corrupted_executions": [{"execution_id": e, "missing_seqs": list(m)} for e, m in self.corrupted],
            "broken_copies": list(self.broken_copies), "notes": list(self.notes),
        }


def _execution_id(payload: bytes) -> Optional[str]:
    try:
        return read_record(payload)[1]
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def _applied_lsn(config: Config) -> tuple[int, str]:
    """The database's applied LSN for this data directory's recorder (0: nothing applied), and
    the recorder id."""
    rid = recorder_id_of(config)
    if not db.is_url(config.database) and not os.path.exists(config.database):
        return 0, rid
    engine = db.open_store_engine(config.database, busy_timeout_ms=config.busy_timeout_ms)
    try:
        cp = compaction_checkpoint
        q = sa.select(sa.func.max(cp.c.applied_lsn))
        if rid:
            q = q.where(cp.c.recorder_id == rid)
        with engine.connect() as conn:
            return int(conn.execute(q).scalar() or 0), rid
    finally:
        engine.dispose()


def _check_free(config: Config, dry_run: bool) -> bool:
    """Whether a recorder runs on the WAL; a repair that would change it refuses then. A dry run
    changes nothing and takes no lock, so it goes on next to one."""
    if not path_exists(config.wal_dir, config.data_dir) or not os.path.isdir(config.wal_dir):
        raise StoreNotFoundError(config.wal_dir)
    live = wal.is_locked(config.wal_dir)
    if live and not dry_run:
        raise StoreInUseError(
            f"the WAL in {config.data_dir} is in use by a running recorder",
            hint="stop the recorder first (`tracedb wal repair --dry-run` reads next to it)",
        )
    return live


# What a dry run next to a running recorder says of the end of the log.
LIVE_NOTE = (
    "a recorder is running: the end of the log it is writing is not judged (a group being written "
    "reads as a torn tail); stop it before repairing"
)


def _next_to_recorder(read: Callable[[set], RepairReport], config: Config, live: bool) -> RepairReport:
    """`read(live_tail)`, where `live_tail` holds the paths of the segments a running recorder may
    be writing or sealing (none when it is stopped): their damage is not judged. Next to a
    recorder that deletes a compacted segment, or renames a new one in, while it is read, the
    read starts again."""
    attempts = 3
    while True:
        tail = {s.path for s in wal.list_segments(config.wal_dir)[-2:]} if live else set()
        try:
            report = read(tail)
        except (FileNotFoundError, wal.WalCorruptionError):
            attempts -= 1
            if not live or not attempts:
                raise
            continue
        if live:
            report = dataclasses.replace(report, notes=(*report.notes, LIVE_NOTE))
        return report


def _ranges(damages, gaps: dict, *, torn: bool = False) -> list[LostRange]:
    """The damaged ranges as reported; `torn`: they are of a kept torn tail (the writer judged
    them the end of an unacknowledged group when it cut them)."""
    return [
        LostRange(
            os.path.basename(d.path), d.offset, d.length, d.first_lost_lsn, d.last_lost_lsn, torn or d.torn_tail,
            d.first_lost_lsn is not None and any(a < d.first_lost_lsn < b for a, b in gaps.items()),
        )
        for d in damages
    ]


def _tail_files(wal_dir: str) -> list:
    """Salvage reads of the torn tails the writer kept when it cut them (`<segment>.tail-<offset>`)."""
    names = sorted(n for n in os.listdir(wal_dir) if wal.tail_of(os.path.join(wal_dir, n)) is not None)
    return [wal.salvage_tail(os.path.join(wal_dir, n)) for n in names]


def _live_files(wal_dir: str) -> list:
    """Salvage reads of the live segments, in order."""
    segs = wal.list_segments(wal_dir)
    out = []
    for i, s in enumerate(segs):
        nxt = segs[i + 1].first_lsn if i + 1 < len(segs) else None
        out.append(salvage_file(s.path, next_first_lsn=nxt, last=i + 1 == len(segs)))
    return out


def _broken_files(wal_dir: str) -> list:
    """Salvage reads of the `.broken` copies repairs kept, by segment number."""
    found = []
    for name in os.listdir(wal_dir):
        if ".wal.broken" in name:
            info = segment_of(os.path.join(wal_dir, name))
            if info is not None:
                found.append(info)
    found.sort(key=lambda s: (s.number, s.name))
    return [salvage_file(s.path, last=True) for s in found]


def repair(config: Config, *, dry_run: bool = False) -> RepairReport:
    """The plain repair: cut the log at its first damage (see the module doc); with `dry_run`,
    only say what the cut would drop (read-only, without the lock: next to a recorder too)."""
    live = _check_free(config, dry_run)
    return _next_to_recorder(lambda tail: _repair(config, dry_run, tail), config, live)


def _repair(config: Config, dry_run: bool, live_tail: set) -> RepairReport:
    applied, _rid = _applied_lsn(config)
    scan = wal.scan(config.wal_dir, mode="point_in_time")
    damages = [d for d in scan.damages if d.path not in live_tail]
    if not damages:
        return RepairReport(False, dry_run, (), applied, last_lsn=scan.last_lsn)
    first = damages[0]
    files = _live_files(config.wal_dir)
    dropped = []
    ranges: list[LostRange] = []
    for f in files:
        if f.path < first.path or f.path in live_tail:
            continue
        dropped += [r for r in f.records if f.path > first.path or r.offset >= first.offset]
        ranges += _ranges((d for d in f.damages if f.path > first.path or d.offset + d.length > first.offset), {})
    if not ranges:
        ranges = [LostRange(os.path.basename(first.path), first.offset, 0, None, None, first.torn_tail)]
    below = scan.last_lsn < applied
    notes = []
    if below:
        in_db = sum(1 for r in dropped if r.lsn <= applied)
        notes.append(
            f"the damage is below the applied LSN {applied}: every record up to it is in the database "
            f"already ({in_db} of the records after the damage); the log continues after it"
        )
    # Records the database holds are not lost by cutting them from the log.
    dropped = [r for r in dropped if r.lsn > applied]
    executions = sorted({e for e in (_execution_id(r.payload) for r in dropped) if e is not None})
    if dropped:
        notes.append(
            f"{len(dropped)} record(s) with a valid CRC after the damage are dropped from the log (kept in "
            "the .broken copies): `tracedb wal repair --salvage` keeps them"
        )
    if dry_run:
        return RepairReport(
            False, True, tuple(ranges), applied, os.path.basename(first.path), first.offset,
            max(scan.last_lsn, applied), len(dropped), tuple(executions), below, notes=tuple(notes),
        )
    r = wal.repair(config.wal_dir, applied_lsn=applied + 1)
    if r.continues_at is not None:
        notes.append(
            f"new records continue at LSN {r.continues_at}: the records cut held LSNs up to "
            f"{r.continues_at - 1}, and no LSN is given twice"
        )
    return RepairReport(
        False, False, tuple(ranges), applied,
        os.path.basename(r.truncated_segment) if r.truncated_segment else os.path.basename(first.path),
        r.truncated_at, r.last_lsn, len(dropped), tuple(executions), below,
        broken_copies=tuple(os.path.basename(c) for c in r.broken_copies), notes=tuple(notes),
    )


@dataclass(frozen=True)
class KeptTailReport:
    """A torn tail the writer kept when it cut it: how many records with a valid CRC it holds,
    and how many of those the database does not reflect (`wal repair --salvage` applies them)."""

    file: str
    records: int
    not_in_database: int

    def to_dict(self) -> dict:
        return {"file": self.file, "records": self.records, "not_in_database": self.not_in_database}


def kept_tails(config: Config) -> tuple[KeptTailReport, ...]:
    """Every kept torn tail of the data directory's WAL (read-only, no lock)."""
    if not os.path.isdir(config.wal_dir):
        return ()
    tails = _tail_files(config.wal_dir)
    if not tails:
        return ()
    engine = None
    if db.is_url(config.database) or os.path.exists(config.database):
        engine = db.open_store_engine(config.database, busy_timeout_ms=config.busy_timeout_ms)
    try:
        out = []
        for f in tails:
            records = _decoded(f.records)
            ids = sorted({r[2][1] for r in records if r[2][1] is not None})
            rows, steps = ({}, set())
            if engine is not None and ids:
                with engine.connect() as conn:
                    rows, steps = _db_state(conn, ids)
            need, _orphans = _needed(records, rows, steps)
            out.append(KeptTailReport(os.path.basename(f.path), len(f.records), len(need)))
        return tuple(out)
    finally:
        if engine is not None:
            engine.dispose()


def _decoded(recs) -> list:
    """(lsn, payload, decoded) of each tracedb record of `recs` (others are skipped)."""
    out = []
    for r in recs:
        try:
            out.append((r.lsn, r.payload, _decode(r.payload)))
        except (ValueError, KeyError, TypeError):
            continue  # not a tracedb record: nothing to apply it to
    return out


def _decode(payload: bytes) -> tuple:
    """(op, execution id, seq or None, document or None) of a record (`fold.read_record`)."""
    return read_record(payload)


def _db_state(conn, ids: list[str]) -> tuple[dict, set]:
    """{id: (status, replayable_reason)} and {(id, seq)} of the database, for `ids`."""
    rows: dict = {}
    steps: set = set()
    for i in range(0, len(ids), _CHUNK):
        chunk = ids[i : i + _CHUNK]
        for r in conn.execute(
            sa.select(traces.c.execution_id, traces.c.status, traces.c.replayable_reason)
            .where(traces.c.execution_id.in_(chunk))
        ):
            rows[r[0]] = (r[1], r[2])
        steps.update(
            (r[0], r[1]) for r in conn.execute(
                sa.select(trace_steps.c.execution_id, trace_steps.c.seq).where(trace_steps.c.execution_id.in_(chunk))
            )
        )
    return rows, steps


def _needed(records: list, rows: dict, steps: set) -> tuple[list, set]:
    """The records the database does not reflect yet, and the ids that need a start made up
    (events survived, the start did not, the database has none)."""
    out = []
    started = set()
    seen_ids = set()
    for lsn, payload, (op, eid, seq, _d) in records:
        if eid is None:
            continue
        seen_ids.add(eid)
        state = rows.get(eid)
        if op == OP_START:
            if state is not None or eid in started:
                continue
            started.add(eid)
        elif op in (OP_EVENT, OP_FINISH):
            if (eid, seq) in steps:
                continue
            steps.add((eid, seq))
        elif state is not None and (
            (op == OP_INVALIDATE and state[0] == STATUS_INVALIDATED)
            or (op == OP_INCOMPLETE and state[0] != STATUS_RUNNING)
            or (op == OP_RECORDING_FAILURE and state[1] == REASON_RECORDING_FAILURE)
        ):
            continue
        out.append((lsn, payload, (op, eid, seq, _d)))
    orphans = {eid for _l, _p, (op, eid, _s, _d) in out if eid not in rows and eid not in started}
    return out, orphans


def _made_up_start(eid: str, t: int) -> bytes:
    """A start for an execution whose start record was lost: no intent, an empty envelope."""
    return orjson.dumps({"op": OP_START, "id": eid, "intent": None, "envelope": {},
                         "hash": compute_envelope_hash({}), "t": t})


def _gaps(conn, ids: list[str]) -> dict:
    """{id: missing seqs} for the executions of `ids` whose seqs have gaps below the last."""
    out: dict = {}
    for i in range(0, len(ids), _CHUNK):
        chunk = ids[i : i + _CHUNK]
        have: dict = {}
        for eid, seq in conn.execute(
            sa.select(trace_steps.c.execution_id, trace_steps.c.seq).where(trace_steps.c.execution_id.in_(chunk))
        ):
            have.setdefault(eid, set()).add(seq)
        for eid, seqs in have.items():
            top = max(seqs)
            if len(seqs) != top:
                out[eid] = tuple(s for s in range(1, top + 1) if s not in seqs)
    return out


def salvage(config: Config, *, dry_run: bool = False, open_store: Optional[Callable] = None) -> RepairReport:
    """Keep every record with a valid CRC (see the module doc). `open_store(config)` opens the
    store that recovers and re-appends (the caller's; it takes the lock). `dry_run` reads
    without the lock, next to a recorder too."""
    running = _check_free(config, dry_run)
    return _next_to_recorder(lambda tail: _salvage(config, dry_run, open_store, tail), config, running)


def _salvage(config: Config, dry_run: bool, open_store: Optional[Callable], live_tail: set) -> RepairReport:
    applied, _rid = _applied_lsn(config)
    gaps = wal.read_gaps(config.wal_dir)
    live = _live_files(config.wal_dir)
    broken = _broken_files(config.wal_dir)
    tails = _tail_files(config.wal_dir)
    ranges: list[LostRange] = []
    for f in live + broken:
        if f.path not in live_tail:
            ranges += _ranges(f.damages, gaps)
    for f in tails:
        ranges += _ranges(f.damages, gaps, torn=True)
    # Every record found, once (a live segment and its copy hold the same ones), in LSN order.
    # Records of the live log at or below the applied LSN are the database's (or were pruned
    # from it on purpose); the copies' records are applied by content, whatever their LSN.
    found: dict = {}
    for f in live:
        for r in f.records:
            if r.lsn > applied:
                found.setdefault((r.lsn, r.payload), r)
    for f in broken + tails:
        for r in f.records:
            found.setdefault((r.lsn, r.payload), r)
    records = _decoded(found[k] for k in sorted(found, key=lambda k: k[0]))
    scan = wal.scan(config.wal_dir, mode="point_in_time")
    live_damaged = any(d.path not in live_tail for d in scan.damages)
    below = live_damaged and scan.last_lsn < applied
    notes = []
    if below:
        notes.append(
            f"the damage is below the applied LSN {applied}: those records are in the database already"
        )
    # What the live log keeps (up to its first damage); the rest was found after damage, in
    # copies a repair kept, or in torn tails the writer kept.
    kept_live = {(r.lsn, r.payload) for f in live for r in f.records if r.lsn <= scan.last_lsn}
    lost_from = min((r.first_lsn for r in ranges if not r.torn_tail and r.first_lsn is not None), default=None)
    after_cut = [r for r in records if (r[0], r[1]) not in kept_live and (lost_from is None or r[0] > lost_from)]
    # Executions a recovery closed after an earlier cut (above its gap): the cut bytes may hold
    # the rest of their events, as for one still running now.
    closed_after_cut = _closed_after_cut(live, gaps)
    if dry_run:
        ids = sorted({r[2][1] for r in records if r[2][1] is not None})
        engine = None
        if db.is_url(config.database) or os.path.exists(config.database):
            engine = db.open_store_engine(config.database, busy_timeout_ms=config.busy_timeout_ms)
        try:
            if engine is not None:
                with engine.connect() as conn:
                    rows, steps = _db_state(conn, ids)
            else:
                rows, steps = {}, set()
        finally:
            if engine is not None:
                engine.dispose()
        # What the database would hold: its steps, the live log's records before the cut, the rest.
        prefix = [r for r in records if (r[0], r[1]) in kept_live and r[0] > applied]
        need, orphans = _needed(prefix + after_cut, rows, set(steps))
        seqs: dict = {}
        for eid, seq in steps:
            seqs.setdefault(eid, set()).add(seq)
        for _l, _p, (op, eid, seq, _d) in prefix + after_cut:
            if op in (OP_EVENT, OP_FINISH):
                seqs.setdefault(eid, set()).add(seq)
        corrupted = tuple(
            (eid, tuple(x for x in range(1, max(s) + 1) if x not in s))
            for eid, s in sorted(seqs.items()) if len(s) != max(s)
        )
        finished = {eid for _l, _p, (op, eid, _s, _d) in prefix + after_cut if op == OP_FINISH}
        closed = {eid for eid, st in rows.items() if st[0] != STATUS_RUNNING}
        unfinished = {eid for _l, _p, (op, eid, _s, _d) in prefix + after_cut} - finished - closed
        unfinished |= {eid for eid, st in rows.items() if st[0] == STATUS_RUNNING}
        windows = {**closed_after_cut, **{eid: _ANY_LSN for eid in unfinished}}
        cut = set(_cut_off(prefix + after_cut, windows, ranges))
        have = dict(corrupted)
        corrupted = tuple(sorted({*corrupted, *((o, ()) for o in (orphans | cut) if o not in have)}))
        relog = len([r for r in need if (r[0], r[1]) not in kept_live or r[0] <= applied])
        return RepairReport(
            True, True, tuple(ranges), applied, last_lsn=max(scan.last_lsn, applied),
            below_applied=below, kept_records=len(after_cut), relogged_records=relog,
            corrupted=corrupted, notes=tuple(notes),
        )
    copies: tuple = ()
    cut_segment = cut_offset = None
    if live_damaged:
        r = wal.repair(config.wal_dir, applied_lsn=applied + 1)
        copies = tuple(os.path.basename(c) for c in r.broken_copies)
        cut_segment = os.path.basename(r.truncated_segment) if r.truncated_segment else None
        cut_offset = r.truncated_at
    store = open_store(config)
    try:
        ids = sorted({r[2][1] for r in records if r[2][1] is not None})
        with store.engine.connect() as conn:
            rows, steps = _db_state(conn, ids)
        need, orphans = _needed(records, rows, steps)
        payloads = []
        first_t: dict = {}
        for _l, payload, (op, eid, _s, d) in need:
            if eid in orphans and eid not in first_t:
                t = record_time(payload, d)
                first_t[eid] = t
                payloads.append(_made_up_start(eid, t))
            payloads.append(payload)
        for i in range(0, len(payloads), _APPEND_CHUNK):
            store.wal.append_many(payloads[i : i + _APPEND_CHUNK])
        store.compact()
        again = store.recover()  # executions started again above and never finished: incomplete
        with store.engine.connect() as conn:
            gaps = _gaps(conn, ids)
        corrupted = dict(gaps)
        notes_of = {}
        for eid in orphans:
            corrupted.setdefault(eid, ())
        unfinished = {*store.last_recovery.incomplete_ids, *again.incomplete_ids}
        windows = {**closed_after_cut, **{eid: _ANY_LSN for eid in unfinished}}
        for eid, note in _cut_off(records, windows, ranges).items():
            if eid not in corrupted:
                corrupted[eid] = ()
                notes_of[eid] = note
        _mark_corrupted(store.engine, corrupted, store.clock(), notes_of)
        last = store.durable_lsn
    finally:
        store.close()
    return RepairReport(
        True, False, tuple(ranges), applied, cut_segment, cut_offset, last, 0, (), below,
        kept_records=len(after_cut), relogged_records=len(payloads),
        corrupted=tuple(sorted(corrupted.items())), broken_copies=copies, notes=tuple(notes),
    )


_ANY_LSN = (0, float("inf"))


def _closed_after_cut(live: list, gaps: dict) -> dict:
    """{id: (a, b)} for the executions marked incomplete by a record above a gap a cut left
    (a: the last LSN kept, b: where the log went on): a `recover` run after a plain repair
    closed them, while the LSNs between may hold more of their events."""
    out: dict = {}
    if not gaps:
        return out
    for f in live:
        for r in f.records:
            gap = max(((a, b) for a, b in gaps.items() if b <= r.lsn), default=None)
            if gap is None or is_event(r.payload):
                continue
            try:
                op, eid, _seq, _d = _decode(r.payload)
            except (ValueError, KeyError, TypeError):
                continue
            if op == OP_INCOMPLETE:
                out.setdefault(eid, gap)
    return out


def _cut_off(records: list, windows: dict, ranges: list) -> dict:
    """{id: note} for the executions that never finished (`windows`: id -> the LSNs, as
    (above, below), where a damaged range may have cut them off) and whose last surviving record
    comes before a damaged range there: the rest of their events may have been in it (no gap
    shows it)."""
    last: dict = {}
    for lsn, _p, (_op, eid, _s, _d) in records:
        last[eid] = lsn
    lost = [r for r in ranges if not r.torn_tail and r.first_lsn is not None]
    out = {}
    for eid, (lo, hi) in windows.items():
        at = last.get(eid, 0)
        after = [r for r in lost if r.first_lsn > at and lo < r.first_lsn < hi]
        if after:
            r = min(after, key=lambda x: x.first_lsn)
            span = f"LSN {r.first_lsn}.." + (str(r.last_lsn) if r.last_lsn is not None else "")
            out[eid] = (
                f"WAL damage: no record of it after LSN {at} survived; the damaged range "
                f"{span} may have held the rest of its events"
            )
    return out


def _mark_corrupted(engine, corrupted: dict, now_ns: int, notes: Optional[dict] = None) -> None:
    """Not replayable, record_corrupted, with what was lost in the status note."""
    for eid, missing in sorted(corrupted.items()):
        note = (notes or {}).get(eid) or (
            "WAL damage: events lost, seqs " + ", ".join(map(str, missing)) if missing
            else "WAL damage: the start record was lost (intent and envelope unknown)"
        )
        with engine.begin() as conn:
            conn.execute(
                sa.update(traces).where(traces.c.execution_id == eid).values(
                    replayable=False, replayable_reason=REASON_RECORD_CORRUPTED, status_note=note,
                    updated_at_ns=now_ns,
                )
            )
