"""Jobs: entry points that wire llog's parts together (argument parsing and wiring only)."""
