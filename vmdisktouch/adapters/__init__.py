"""Adapters to the world outside the kernel: libvirt, PNG files, sd_notify, atomic files."""
