"""An older commit checked out beside this one, to run its daemon side by side with the current code.

    with rev_worktree("HEAD~3") as tree:
        d = DaemonProc(tmp, image, ..., cwd=tree.path)   # `python -m vmdisktouch` = that commit's

``git worktree add --detach`` checks ``rev`` out in a temporary directory
(its own index and HEAD: the main checkout is not touched) and ``git
worktree remove --force`` takes it away at the end, also on errors.
The same venv python runs both: with ``cwd`` the worktree, ``python -m``
puts that directory first on ``sys.path``, ahead of the venv's editable
install of the current checkout; ``tree.check_imports()`` proves it by
importing ``vmdisktouch`` there and comparing its path.

A benchmark's ``--compare-rev REV`` takes its tree with
``enter_rev_worktree(stack, REV)``: the worktree for the rest of the
``ExitStack``, its commit and import path printed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from tests.support.common import ROOT, WorkloadError


def git(*args, cwd=ROOT) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise WorkloadError(f"git {' '.join(args)}: {r.stderr.strip() or r.returncode}")
    return r.stdout.strip()


def module_path(cwd, python: str = sys.executable) -> str:
    """Where ``python -m vmdisktouch`` run in ``cwd`` imports the package from."""
    r = subprocess.run([python, "-c", "import vmdisktouch; print(vmdisktouch.__file__)"],
                       cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if r.returncode:
        raise WorkloadError(f"cannot import vmdisktouch in {cwd}: {r.stderr.strip()[-500:]}")
    return r.stdout.strip()


@dataclass
class RevTree:
    rev: str          # as given
    sha: str          # the commit it names
    path: str         # the worktree

    @property
    def label(self) -> str:
        return f"vmdisktouch @{self.rev}"

    def check_imports(self, python: str = sys.executable) -> str:
        """The package path ``python -m vmdisktouch`` gets in the worktree; fails if not its own."""
        got = module_path(self.path, python)
        if not os.path.realpath(got).startswith(os.path.realpath(self.path) + os.sep):
            raise WorkloadError(f"python -m vmdisktouch in {self.path} imports {got}, "
                                f"not the worktree's code")
        return got


@contextlib.contextmanager
def rev_worktree(rev: str, repo=ROOT):
    """A temporary ``git worktree`` of ``rev``, removed when the block ends."""
    sha = git("rev-parse", "--verify", f"{rev}^{{commit}}", cwd=repo)
    path = tempfile.mkdtemp(prefix=f"vmdt-rev-{sha[:10]}-")
    os.rmdir(path)                       # git creates it
    git("worktree", "add", "--detach", path, sha, cwd=repo)
    try:
        yield RevTree(rev, sha, path)
    finally:
        try:
            git("worktree", "remove", "--force", path, cwd=repo)
        except WorkloadError as exc:
            print(f"warning: {exc}; remove {path} with `git worktree remove --force`",
                  file=sys.stderr)


def _say(text: str) -> None:
    print(text, flush=True)


def enter_rev_worktree(stack: contextlib.ExitStack, rev: str, say=_say) -> RevTree:
    """``rev_worktree(rev)`` entered on ``stack`` (removed when it closes), imports checked and said."""
    tree = stack.enter_context(rev_worktree(rev))
    say(f"--compare-rev {rev}: {tree.sha[:10]} in {tree.path}; python -m vmdisktouch there "
        f"imports {tree.check_imports()}")
    return tree
