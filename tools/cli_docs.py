"""Generate the man page and the bash completion from the argparse definitions.

    .venv/bin/python -m tools.cli_docs          # writes docs/vmdisktouch.1, completions/vmdisktouch.bash
    .venv/bin/python -m tools.cli_docs --check  # exit 1 when either is out of date (a test runs it)

The man page comes from ``argparse-manpage`` (every subcommand and option, as
``vmdisktouch COMMAND --help`` shows them) plus the sections argparse cannot
know: exit status, files, environment, see also. The completion comes from
``shtab``. Install them with ``pip install -e '.[test]'``; the daemon needs neither.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAN = os.path.join(ROOT, "docs", "vmdisktouch.1")
COMPLETION = os.path.join(ROOT, "completions", "vmdisktouch.bash")

EXTRA = r"""
.SH EXIT STATUS
The same for every command (docs/exit\-codes.md says where each comes from).
.TP
\fB0\fR
success; \fBrun\fR: stopped by SIGTERM or SIGINT, all holds released
.TP
\fB1\fR
a failure at run time (\fBrun\fR: too many failed cycles in a row; \fBsnapshot\fR: a scan failed; \fBdiscover\fR: libvirt unreachable; standard output closed)
.TP
\fB2\fR
a usage error: an unknown option, a missing or extra argument, options that exclude each other; \fBsnapshot \-\-png\fR with several PATHs; a \fBunit\-name\fR PATH with no unit name
.TP
\fB3\fR
\fBstatus\fR: no daemon is live (no status file, or every one stale), as \fBsystemctl is\-active\fR says; \fBadvise\fR: no disk was read during the window, or no running domain has one
.TP
\fB66\fR
a disk image that does not exist, cannot be opened, or whose residency the kernel hides from this user (\fBsnapshot\fR as neither its owner nor a writer); \fBstatus\fR: the directory, or no status file serving PATH
.TP
\fB70\fR
an internal error (a bug: rerun with \-\-debug)
.TP
\fB75\fR
not now: the disk image went away or was replaced while served; \fBadopt\fR: the domain is paused, arriving, or a job or block job runs on it
.TP
\fB77\fR
\fBadvise\fR as a user who may not read the kernel's tracepoints (not root)
.TP
\fB78\fR
a refused setup: a bad value of a setting, given as a flag of any command or in the config file; the config file; an output path; the lock limit; \fBadvise\fR: a kernel without the tracepoints a disk needs; \fBadopt\fR: a disk that cannot be adopted as configured (io=native, hot\-plugged, not local), advise said no gain, or a page of the image stays in the page cache
.TP
\fB130\fR, \fB143\fR, \fB129\fR
\fBadvise\fR stopped by Ctrl\-C (SIGINT), SIGTERM or SIGHUP (128 + the signal's number): what was measured is still printed
.SH FILES
.TP
\fI/run/vmdisktouch/adopted/\fR
one record per disk \fBadopt\fR switched to the page cache: which domains \fBrelease \-\-all\fR asks (QEMU's answer decides)
.TP
\fI/etc/vmdisktouch/host.toml\fR
the host service's settings (\fBvmdisktouch.service\fR)
.TP
\fI/etc/vmdisktouch/INSTANCE.toml\fR, \fI/etc/vmdisktouch/default.toml\fR
a per\-disk unit's settings (\fBvmdisktouch@INSTANCE.service\fR)
.TP
\fI/run/vmdisktouch/\fR
status files (read by \fBvmdisktouch status\fR), the PNG maps, the per\-image locks, the last \fBvmdisktouch advise\fR report (\fIadvise.json\fR, read by \fBdiscover\fR)
.TP
\fI/var/lib/vmdisktouch/\fR
the warm\-restart state (\fB\-\-state\-dir\fR)
.SH ENVIRONMENT
.TP
\fBJOURNAL_STREAM\fR
set by systemd to the device and inode of the journal stream on stderr. Only where it matches stderr's own does \fBrun\fR log to the journal: entries with fields (DISK, DOMAIN, TARGET, MESSAGE_ID) where python3\-systemd is installed, else lines with syslog priority prefixes (<3> for a fatal one). Otherwise: timestamped lines (docs/logging.md)
.TP
\fBNOTIFY_SOCKET\fR, \fBWATCHDOG_USEC\fR
set by systemd: readiness, status and watchdog notifications
.TP
\fBVMDISKTOUCH_NO_CACHESTAT=1\fR
scan without cachestat(2), as on a kernel before 6.5 (for benchmarks)
.SH SEE ALSO
vmtouch(8), fincore(1), systemd.exec(5), virsh(1); the README and docs/ of the source
(docs/configuration.md: every setting; docs/status.md: every key of the status file).
"""


def parser() -> argparse.ArgumentParser:
    os.environ["COLUMNS"] = "80"            # argparse wraps at the terminal's width
    sys.path.insert(0, ROOT)
    from vmdisktouch.commands import cli
    return cli.build_parser()


def man_page() -> str:
    from argparse_manpage.manpage import Manpage
    from vmdisktouch import __version__
    p = parser()
    page = Manpage(p, _data={"project_name": "vmdisktouch", "version": __version__,
                             "manual_title": "vmdisktouch manual", "date": "",
                             "description": "keep the hot parts of QEMU/KVM disk images "
                                            "in the host page cache"})
    page.date = "vmdisktouch " + __version__
    return str(page).rstrip("\n") + "\n" + EXTRA.lstrip("\n")


def completion() -> str:
    import shtab
    return shtab.complete(with_choices(parser()), shell="bash")


def with_choices(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``p`` with each setting's words (``Setting.choices``) as its flag's choices, which
    shtab completes; only here, because argparse would check them case-sensitively before
    the setting's own parser, which takes ``TRACE`` too."""
    from vmdisktouch.config import settings
    words = {s.key: list(s.choices) for s in settings.SETTINGS if s.choices}
    parsers = [p]
    while parsers:
        for action in parsers.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
            elif action.dest in words:
                action.choices = words[action.dest]
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="generate the man page and the bash completion")
    ap.add_argument("--check", action="store_true", help="exit 1 if either is out of date")
    args = ap.parse_args(argv)
    stale = []
    for path, text in ((MAN, man_page()), (COMPLETION, completion())):
        old = open(path).read() if os.path.exists(path) else None
        if old != text:
            stale.append(path)
            if not args.check:
                with open(path, "w") as f:
                    f.write(text)
    if args.check and stale:
        print("out of date (regenerate: python -m tools.cli_docs): " + ", ".join(stale),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
