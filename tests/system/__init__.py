"""The OS layer against the real kernel, in process: real files, page cache, loop devices, cgroups."""
