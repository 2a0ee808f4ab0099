"""The operators' web console at `/ui/` on the native port (docs/console.md), and the samples
behind its charts (`samples*.py`).

A dialect (`app.ConsoleApp`) like the APIs, registered first on the native listener; it keeps
its own signed session (`session.py`), asks `server/access.py` what each page and action needs
exactly as the API would (`permissions.py`), shows messages only through `Queue.browse` and
`Queue.peek`, which lease nothing, and mounts the samples' JSON API (`samples_api.py`) under
`/ui/api/` with the session's principal.
"""
