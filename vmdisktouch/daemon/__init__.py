"""The daemon: one runtime for 1..N disks (the host drives every cycle)."""
