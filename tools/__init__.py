"""Harnesses outside the installed package: the demo and the fio/QEMU workloads."""
