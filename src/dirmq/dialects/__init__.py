"""The HTTP dialects on the server runtime: the native API, yaq and pub/sub (SQS, the largest,
has its own package, `dirmq.sqs`). Each is a `dirmq.server.dialect.Dialect`; `dirmq.service`
puts them on listeners."""
