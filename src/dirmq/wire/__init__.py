"""HTTP wire formats shared by the server and the client: framing (chunked, multipart),
durations, and how messages map to HTTP headers and batch bodies. Pure functions; no sockets."""
