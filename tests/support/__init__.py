"""What the tests, the tools (``python -m tools.demo`` ...) and the benchmarks share.

Outside the installed package. Imports only ``vmdisktouch`` and itself: never a
test module, ``tools`` or ``benchmarks`` (tests/unit/test_support_layers.py).
Each module usable alone. The harness (the demo's, the benchmarks'):

* ``cgroup``: ``MemoryCgroup``, a cgroup v1 memory group with a limit (start
  processes in it, read usage / failcnt / OOM kills / unevictable bytes, tear
  it down), and ``check_budget_vs_limit`` (the charge hazard, explained there);
* ``images``: ``make_image`` (a hole, a hole with data ranges, or data really on
  disk throughout: ``sparse=False``), ``evict``, ``resident_bytes``;
* ``fio``: ``FioJob`` (the guest-like job -> fio argv), ``FioRun`` (runs it,
  live per-interval IOPS), ``parse_iops_log``, ``start_neighbour`` (the noisy
  neighbour);
* ``holders``: ``VmtouchLock`` (``vmtouch -l`` of a range, the oracle) and
  ``zone_reader_argv`` (a guest re-reading one zone);
* ``daemon_proc``: ``DaemonProc``, ``vmdisktouch run`` as a child process;
* ``procfs``: ``vmlck`` (the one VmLck reader outside the package) and the
  other ``/proc/PID/status`` figures;
* ``worktree``: ``rev_worktree``, an older commit beside this one, to run its
  daemon side by side (``enter_rev_worktree``: a benchmark's ``--compare-rev``);
* ``stats``: ``steady_median``, ``first_time_at_or_above``;
* ``pg_disk``: PostgreSQL on ext4 on a raw image through qemu-storage-daemon's
  FUSE export and a loop device, in QEMU's ``none`` or ``writethrough`` mode:
  a real application on a disk, without a guest kernel (``prepare``, ``pg_disk``,
  ``PgDisk.pgbench``);
* ``common``: sizes, ``WorkloadError``, ``require_tool``, ``stop_process``.
* ``host_unit``: the host unit made from the template (``python -m tests.support.host_unit``).

The tests' helpers: ``pagecache`` (data images, reads, ``held``, page counts),
``tracing``, ``clocks``, ``journal_records``, ``replay`` (the policy over a
recorded trace), ``sandbox_exec`` (the unit's sandbox, applied by hand),
``libvirt_env``, ``private_libvirt``, ``arrival_env``, ``qemu_vm``, and
``faultkit`` (the fault rows; ``python -m tests.support.faultkit`` prints
docs/faults.md).
"""
