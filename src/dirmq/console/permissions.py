"""What each console page and action needs, in the API's terms: the console asks
`server/access.py` exactly what the native API asks for the same thing (its `NEEDS`; a test
keeps the two tables in step), so a principal can do nothing here it could not do with curl.
Schedules are judged on their queue (`SCHEDULE_NEEDS`). The fsck panel has no native route:
`fsck_panel.py` asks for admin on every name to check now.
"""

from __future__ import annotations

from dirmq.server.credentials import ADMIN, BROWSE, READ, SEE, WRITE

# console action -> (permission, the native route (kind, method) that does the same)
NEEDS: dict[str, tuple[str, tuple[str, str]]] = {
    "queue": (SEE, ("queue", "GET")),  # counts, configuration, disk, charts
    "browse": (BROWSE, ("peek", "GET")),  # messages of a state, without leasing
    "message": (BROWSE, ("message", "GET")),  # one message, its raw file
    "configure": (ADMIN, ("queue", "PUT")),
    "pause": (ADMIN, ("queue", "PUT")),  # pause or resume: `PUT /{queue} {"paused": ...}`
    "publish": (WRITE, ("messages", "POST")),
    "purge": (ADMIN, ("messages", "DELETE")),  # live messages, or the dead area
    "delete": (READ, ("message", "DELETE")),  # a message (a dead letter too) by id
    "lease": (READ, ("action", "POST")),  # extend or release an in-flight lease
    "redrive": (ADMIN, ("redrive", "POST")),
    "task": (SEE, ("task", "GET")),
    "cancel": (ADMIN, ("task", "DELETE")),
}


# Schedules have no queue in their path: the native API judges them in
# dialects/native/schedules.py, on the schedule's queue, and so does the console.
SCHEDULE_NEEDS: dict[str, str] = {
    "see": BROWSE,  # a schedule, its last and next tick (GET /@schedules[/{name}])
    "change": ADMIN,  # pause, resume, delete (PUT, DELETE /@schedules/{name})
}


def permission(action: str) -> str:
    return NEEDS[action][0]
