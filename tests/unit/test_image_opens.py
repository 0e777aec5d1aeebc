"""One way to open a disk image, read from the source with ``ast`` (a sibling of
``test_layers``).

The daemon's promise that it changes nothing of an image, its access time
included, rests on one open: ``system/image.py`` ``open_image`` through
``files.open_noatime`` (read-only, ``O_NOATIME`` where permitted, its identity
kept), and every further descriptor on that image made from the verified one
(``files.reopen``: ``/proc/self/fd/N``, the same inode whatever the path names
now). A path opened a second time could name another file by then.

An AST cannot tell an image's path from a config file's, so every open in the
package (``os.open``, ``os.fdopen``, ``io.open``, ``open``, and ``.open``,
``.read_bytes``, ``.read_text`` of anything) is either the helper's or listed
below with what it opens: a new open anywhere fails here until someone says
what it opens. An image's is never listed: it goes through the helper.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from tests.unit.test_layers import PACKAGE, modules

pytestmark = pytest.mark.repo

OPENS = {"open", "fdopen", "openat", "read_bytes", "read_text"}

# The OS layer's helper: the only opens an image or a block device goes through.
HELPER = {
    ("system/files.py", "open_noatime"),     # os.open with O_NOATIME where permitted
}
# Who may call the helper: the image's first open, and the reopen of its descriptor.
HELPER_CALLERS = {
    "open_noatime": {("system/image.py", "open_image"), ("system/files.py", "reopen")},
    "reopen": {("system/image.py", "Image.reopen_direct"), ("system/files.py", "reopen_random")},
}

# Every other open in the package, and what it opens (never an image or a disk).
NOT_AN_IMAGE = {
    ("adapters/advice_file.py", "load_advice"): "advise's saved report",
    ("adapters/atomic.py", "write_bytes"): "a temporary output file in its directory",
    ("adapters/libvirt/libvirt_disks.py", "connect"): "libvirt.open: a connection",
    ("adapters/libvirt/adopt.py", "qemu_pid"): "/proc/PID/cmdline",
    ("adapters/libvirt/adopt.py", "qemu_options"): "/proc/PID/cmdline",
    ("adapters/libvirt/adopted.py", "record"): "an adoption's record in the runtime directory",
    ("adapters/libvirt/adopted.py", "records"): "an adoption's record in the runtime directory",
    ("adapters/libvirt/adopted.py", "held_back"): "a disk's released mark in the runtime directory",
    ("system/hold/drop.py", "mappers"): "/proc/PID/maps and comm",
    ("adapters/qemu_socket.py", "records"): "an adoption's record in the runtime directory",
    ("adapters/qemu_socket.py", "record_of"): "an adoption's record in the runtime directory",
    ("adapters/outputs.py", "_head"): "an output file's first bytes",
    ("adapters/runtime_dir.py", "_writer"): "a status file in the runtime directory",
    ("adapters/outputs.py", "_directory_problem"): "a probe file in an output directory",
    ("adapters/outputs.py", "remove"): "an output file, O_NOFOLLOW",
    ("adapters/warm_state.py", "_read_file"): "a warm-state file",
    ("adapters/warm_state.py", "_members"): "a member of a warm-state zip archive",
    ("commands/cli.py", "main"): "/dev/null",
    ("commands/status.py", "read_file"): "a status file",
    ("config/file.py", "load"): "the config file (config/read.py read_text)",
    ("config/file.py", "load_rules"): "a rules file (config/read.py read_text)",
    ("config/read.py", "read_text"): "a config or rules file",
    ("daemon/record.py", "Recorder.__init__"): "gzip.open: the cycle recording",
    ("daemon/service.py", "Service._open"): "Served.open: an image, through open_image",
    ("system/cgroup/memcg.py", "_read"): "a cgroup file",
    ("system/cgroup/memcg.py", "MemcgReader._open_kpage"): "/proc/kpagecgroup",
    ("system/files.py", "open_dir"): "a directory, O_DIRECTORY",
    ("system/image_lock.py", "sweep"): "a lock file",
    ("system/image_lock.py", "_open_lock"): "a lock file",
    ("system/meminfo.py", "_descriptor"): "/proc/meminfo",
    ("system/meminfo.py", "_read"): "a /proc file",
    ("system/meminfo.py", "memlock_allowance"): "/proc/self/status",
    ("system/observe/io_watch.py", "_fdinfo"): "/proc/PID/fdinfo",
    ("system/observe/io_watch.py", "process_name"): "/proc/PID/comm",
    ("system/observe/io_watch.py", "is_vmdisktouch"): "/proc/PID/cmdline",
    ("system/observe/io_watch.py", "_scratch"): "an unnamed O_TMPFILE in the image's "
                                                "directory, never the image",
    ("system/observe/residency.py", "_has_capability"): "/proc/self/status",
    ("system/observe/miss_cost.py", "open_schedstat"): "/proc/thread-self/schedstat",
    ("system/trace/bdi.py", "_whole_disk"): "a sysfs file",
    ("system/trace/direct_io.py", "_sysfs"): "a sysfs file",
    ("system/trace/trace_reader.py", "_foreseen_kb"): "a tracefs event format (tracefs.read_text)",
    ("system/trace/tracefs.py", "Instance.__init__"): "the tracefs instances directory",
    ("system/trace/tracefs.py", "Instance._open"): "a tracefs file",
    ("system/trace/tracefs_mount.py", "find_root"): "/proc/self/mounts",
    ("system/trace/tracefs_mount.py", "read_text"): "a tracefs file",
    ("system/trace/tracefs_mount.py", "online_cpus"): "/sys/devices/system/cpu/online",
}


def calls(path: pathlib.Path) -> list[tuple[str, str, int]]:
    """(the enclosing function, dotted with its class; the called name; line) of every
    call of a name in ``OPENS`` or of the helper's functions in ``path``."""
    out: list[tuple[str, str, int]] = []
    names = OPENS | set(HELPER_CALLERS)

    def visit(node: ast.AST, where: tuple[str, ...]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            where = where + (node.name,)
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(
                f, ast.Attribute) else None
            if name in names:
                out.append((".".join(where) or "<module>", name, node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, where)

    visit(ast.parse(path.read_text(), str(path)), ())
    return out


def misplaced(path: pathlib.Path, rel: str) -> list[str]:
    """The opens of ``path`` that are neither the helper's nor listed, and the calls of
    the helper from outside its callers."""
    bad = []
    for where, name, line in calls(path):
        if name in HELPER_CALLERS:
            if (rel, where) not in HELPER_CALLERS[name] and (rel, where) not in HELPER:
                bad.append(f"{rel}:{line} {where} calls the image helper {name}")
        elif (rel, where) not in HELPER and (rel, where) not in NOT_AN_IMAGE:
            bad.append(f"{rel}:{line} {where} opens a file ({name}) outside the OS layer's "
                       "image helper: an image goes through image.open_image and "
                       "Image.reopen_direct; anything else is listed in NOT_AN_IMAGE")
    return bad


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_module_opens_an_image_outside_the_os_layer_helper(path):
    rel = path.relative_to(PACKAGE).as_posix()
    assert misplaced(path, rel) == []


def test_every_listed_open_is_still_there():
    """A list that outlived its opens would allow the next one unseen."""
    seen = {(p.relative_to(PACKAGE).as_posix(), where)
            for p in modules() for where, name, _ in calls(p)}
    assert set(NOT_AN_IMAGE) | HELPER <= seen, (set(NOT_AN_IMAGE) | HELPER) - seen


def test_the_rule_catches_a_second_open_of_an_image(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nclass Probe:\n    def __init__(self, path):\n"
                   "        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECT)\n"
                   "        self.other = files.open_noatime(path, os.O_RDONLY)\n")
    assert misplaced(bad, "system/observe/probe.py") == [
        "system/observe/probe.py:5 Probe.__init__ opens a file (open) outside the OS "
        "layer's image helper: an image goes through image.open_image and "
        "Image.reopen_direct; "
        "anything else is listed in NOT_AN_IMAGE",
        "system/observe/probe.py:6 Probe.__init__ calls the image helper open_noatime"]
