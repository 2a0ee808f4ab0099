"""The native HTTP API: routes, handlers, query-parameter table, OpenAPI document."""
