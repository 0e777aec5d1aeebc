"""Harnesses outside the installed package: the demo, the guest-like workload, the daemon as a child.

Shared by the demo (``python -m tools.demo``), the benchmarks and the tests;
each module usable alone:

* ``cgroup``: ``MemoryCgroup``, a cgroup v1 memory group with a limit (start
  processes in it, read usage / failcnt / OOM kills / unevictable bytes, tear
  it down), and ``check_budget_vs_limit`` (the charge hazard, explained there);
* ``images``: ``make_image`` (non-sparse, data really on disk), ``evict``,
  ``resident_bytes``;
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
* ``common``: sizes, ``WorkloadError``, ``require_tool``, ``stop_process``.
"""
