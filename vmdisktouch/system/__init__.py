"""The one OS layer: every system call vmdisktouch makes, the clock passed in."""
