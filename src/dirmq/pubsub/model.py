"""The vocabulary of publish/subscribe: delivery modes, outcomes, filters, envelopes, deliveries.

A pub/sub message is a store message file (see FORMAT.md) whose `Dirmq-` system headers carry
its envelope: id, channel, subject, delivery mode, publish time, timeouts, persistence, and the
outcomes its publisher asked to be told about and the queue they go to.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from dirmq.errors import CorruptMessage, InvalidArgument
from dirmq.store.clock import duration_ms, last_ms

MAX_NAME_CHARS = 128
# Message ids and subscriber names end up in file names next to `.`, `+`, `~` separators.
_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")
MAX_TIMEOUT_S = 7 * 24 * 3600.0
DEFAULT_ACCEPT_TIMEOUT_S = 60.0
DEFAULT_PROCESS_TIMEOUT_S = 30.0


class Mode(StrEnum):
    ANYONE = "anyone"  # exactly one matching subscriber (a later one if none is attached)
    EVERYONE = "everyone"  # every matching subscriber attached when it is published
    FUTURE = "future"  # everyone now and future: kept, replayable by sequence number


class Outcome(StrEnum):
    QUEUED = "queued"  # stored at its persistence level
    ACCEPTED = "accepted"  # passed to a subscriber
    DONE = "done"  # the subscriber processed it
    TIMEOUT = "timeout"  # nobody accepted it in time: removed
    ABORTED = "aborted"  # accepted, but no result in time (or the subscriber left): returned
    DISMISSED = "dismissed"  # the subscriber reported it unprocessable: removed


class Persistence(StrEnum):
    WRITETHROUGH = "writethrough"  # on stable storage before publish returns
    WRITEBACK = "writeback"  # flushed in the background within a bounded delay
    NONE = "none"  # never flushed: survives a process crash, not a machine crash


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InvalidArgument(
            f"{kind} {name!r} must be 1-{MAX_NAME_CHARS} characters of A-Z a-z 0-9 _ -"
        )
    return name


def _check_text(kind: str, value: str) -> str:
    if not isinstance(value, str) or len(value.encode()) > 1024:
        raise InvalidArgument(f"{kind} must be a string of at most 1024 bytes")
    if any(c in value for c in "\r\n\x00"):
        raise InvalidArgument(f"{kind} {value!r} contains CR, LF or NUL")
    return value


def check_timeout(kind: str, seconds: float) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidArgument(f"{kind} must be a number of seconds, got {seconds!r}")
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise InvalidArgument(f"{kind} must be > 0 and at most {MAX_TIMEOUT_S:.0f} seconds")
    return float(seconds)


def parse_outcomes(values: Iterable[str] | str) -> frozenset[Outcome]:
    items = values.split(",") if isinstance(values, str) else list(values)
    result: set[Outcome] = set()
    for raw in items:
        item = raw.strip().lower()
        if not item:
            continue
        try:
            result.add(Outcome(item))
        except ValueError:
            names = ", ".join(o.value for o in Outcome)
            raise InvalidArgument(f"unknown outcome {item!r}; expected some of {names}") from None
    return frozenset(result)


@dataclass(frozen=True, slots=True)
class Filter:
    """Channel prefixes and subject prefixes; an empty side accepts everything."""

    channels: tuple[str, ...] = ()
    subjects: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for prefix in (*self.channels, *self.subjects):
            _check_text("filter prefix", prefix)

    def matches(self, channel: str, subject: str) -> bool:
        return (not self.channels or channel.startswith(self.channels)) and (
            not self.subjects or subject.startswith(self.subjects)
        )

    def to_json(self) -> dict[str, list[str]]:
        return {"channels": list(self.channels), "subjects": list(self.subjects)}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Filter:
        channels = data.get("channels") or []
        subjects = data.get("subjects") or []
        if not isinstance(channels, list) or not isinstance(subjects, list):
            raise InvalidArgument("filter channels and subjects must be lists of prefixes")
        return cls(tuple(str(c) for c in channels), tuple(str(s) for s in subjects))


@dataclass(frozen=True, slots=True)
class Envelope:
    """Routing and lifecycle facts of one message, stored in its file's system headers."""

    id: str
    channel: str
    subject: str
    mode: Mode
    published_us: int
    accept_timeout_s: float
    process_timeout_s: float
    persistence: Persistence
    acks: frozenset[Outcome] = frozenset()
    reply_to: str | None = None

    @property
    def key(self) -> str:
        """The message's name in the pool and inboxes: sorts by publish time."""
        return f"{self.published_us:016d}_{self.id}"

    @property
    def accept_deadline_ms(self) -> int:
        return last_ms(self.published_us * 1000, self.accept_timeout_s)

    def wants(self, outcome: Outcome) -> bool:
        return outcome in self.acks and self.reply_to is not None

    def system_headers(self) -> dict[str, str]:
        headers = {
            "Pubsub-Id": self.id,
            "Pubsub-Channel": self.channel,
            "Pubsub-Subject": self.subject,
            "Pubsub-Mode": self.mode.value,
            "Pubsub-Published-Us": str(self.published_us),
            "Pubsub-Accept-Timeout-Ms": str(duration_ms(self.accept_timeout_s)),
            "Pubsub-Process-Timeout-Ms": str(duration_ms(self.process_timeout_s)),
            "Pubsub-Persistence": self.persistence.value,
        }
        if self.acks:
            headers["Pubsub-Acks"] = ",".join(sorted(a.value for a in self.acks))
        if self.reply_to is not None:
            headers["Pubsub-Reply-To"] = self.reply_to
        return headers

    @classmethod
    def from_system(cls, system: Mapping[str, str]) -> Envelope:
        try:
            return cls(
                id=system["Pubsub-Id"],
                channel=system["Pubsub-Channel"],
                subject=system["Pubsub-Subject"],
                mode=Mode(system["Pubsub-Mode"]),
                published_us=int(system["Pubsub-Published-Us"]),
                accept_timeout_s=int(system["Pubsub-Accept-Timeout-Ms"]) / 1000,
                process_timeout_s=int(system["Pubsub-Process-Timeout-Ms"]) / 1000,
                persistence=Persistence(system["Pubsub-Persistence"]),
                acks=parse_outcomes(system.get("Pubsub-Acks", "")),
                reply_to=system.get("Pubsub-Reply-To"),
            )
        except (KeyError, ValueError, InvalidArgument) as exc:
            raise CorruptMessage(f"not a pub/sub message file: {exc}") from exc


def make_envelope(
    *,
    message_id: str,
    channel: str,
    subject: str,
    mode: Mode | str,
    published_us: int,
    accept_timeout_s: float,
    process_timeout_s: float,
    persistence: Persistence | str,
    acks: Iterable[str] | str,
    reply_to: str | None,
) -> Envelope:
    """Validate what a publisher gave and build the envelope (InvalidArgument on bad input)."""
    try:
        mode = Mode(mode)
    except ValueError:
        raise InvalidArgument(f"mode must be one of {', '.join(Mode)}; got {mode!r}") from None
    try:
        persistence = Persistence(persistence)
    except ValueError:
        choices = ", ".join(Persistence)
        raise InvalidArgument(
            f"persistence must be one of {choices}; got {persistence!r}"
        ) from None
    wanted = parse_outcomes(acks)
    if wanted and not reply_to:
        raise InvalidArgument("acknowledgements were requested but no reply_to queue was given")
    return Envelope(
        id=check_name("message id", message_id),
        channel=_check_text("channel", channel),
        subject=_check_text("subject", subject),
        mode=mode,
        published_us=published_us,
        accept_timeout_s=check_timeout("accept timeout", accept_timeout_s),
        process_timeout_s=check_timeout("process timeout", process_timeout_s),
        persistence=persistence,
        acks=wanted,
        reply_to=reply_to or None,
    )


@dataclass(frozen=True, slots=True)
class Published:
    id: str
    mode: Mode
    seq: int | None = None  # the retained log position (mode `future`)
    subscribers: int | None = None  # how many attached subscribers got it (mode `everyone`)


@dataclass(slots=True)
class Delivery:
    """A message accepted by a subscription; settle it with done/dismiss, or heartbeat it."""

    key: str  # the subscription's handle for it (stable across heartbeats)
    envelope: Envelope
    body: bytes
    headers: dict[str, str]
    deadline_ms: int  # aborted (returned) if not settled or extended by then
    seq: int | None = None  # retained log position, for mode `future`

    @property
    def id(self) -> str:
        return self.envelope.id

    @property
    def channel(self) -> str:
        return self.envelope.channel

    @property
    def subject(self) -> str:
        return self.envelope.subject

    @property
    def mode(self) -> Mode:
        return self.envelope.mode
