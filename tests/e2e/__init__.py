"""End to end: the daemon and the CLI as child processes, real QEMU, real libvirtd."""
