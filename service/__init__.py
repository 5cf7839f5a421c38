"""The domain: topics, their managed ledgers, cursors, compaction commits, settings and metadata."""
