"""vmdisktouch: keep the hot parts of QEMU/KVM disk images in the host page cache."""

__version__ = "0.1.0"
