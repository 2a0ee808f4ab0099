"""What the tests share: servers, worker processes, fixtures, waits, the browser and GlusterFS
harnesses, fault-injecting filesystems. Helpers, not collected (no `test_` prefix)."""
