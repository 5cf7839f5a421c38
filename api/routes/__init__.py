"""One router per area: health, topics admin, compaction admin, messages."""
