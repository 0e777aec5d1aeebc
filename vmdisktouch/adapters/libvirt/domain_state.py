"""What libvirt's state of a domain says of its disks: whether QEMU has activated them.

A domain arrives (an incoming migration, a restore, a start from a managed
save) with its disks inactive; QEMU activates them, and drops their page
cache, when the incoming completes, or at ``cont`` after a paused domain's
migration (late block activation). libvirt does not report that directly:
it is read here from the domain's state, its state reason and its jobs (the
one running, and the last one completed), asked only when the state leaves
it open. The rule that follows from it is ``daemon.arrival``'s.
"""

from __future__ import annotations

# virDomainState -> name (virsh spells some of these with spaces; keep them one word)
STATE_NAMES = {0: "nostate", 1: "running", 2: "blocked", 3: "paused", 4: "shutdown",
               5: "shutoff", 6: "crashed", 7: "pmsuspended"}
RUNNING, PAUSED = 1, 3
# virDomainPausedReason values that mean QEMU may not have activated its disks yet:
# STARTING_UP (11) while QEMU starts (a restore's or migration's incoming included);
# MIGRATION (2) both during an incoming migration and after a completed restore that
# stays paused, told apart by the job libvirt runs on the domain (``arriving``).
PAUSED_MIGRATION, PAUSED_STARTING_UP = 2, 11
# USER (1) after an incoming migration of a paused domain: QEMU activates its disks only
# when it is resumed; libvirt's completed job then says the migration came in (``landed``).
PAUSED_USER = 1


def arriving(active: bool, state: int, reason: int, job_running, landed=lambda: False) -> str:
    """Whether QEMU may not have activated the domain's disks yet, and why: "starting"
    (QEMU starting up, a restore's incoming included), "incoming" (paused for a migration
    while a job runs on it: an incoming migration; on the source, the end of an outgoing
    one) or "landed" (paused by the user, and the last job libvirt completed on it was an
    incoming migration: a paused domain migrated here, its disks activated at resume, or
    one resumed and paused since, which cannot be told apart); "" otherwise. ``job_running()``
    and ``landed()`` are asked only then, because a paused domain whose restore has
    completed has the same state and reason as an incoming one, and no job."""
    if not active or state != PAUSED:
        return ""
    if reason == PAUSED_STARTING_UP:
        return "starting"
    if reason == PAUSED_MIGRATION and job_running():
        return "incoming"
    return "landed" if reason == PAUSED_USER and landed() else ""


def _job_running(dom, libvirt) -> bool:
    """A job runs on ``dom``. The destination of a migration refuses to report its incoming
    job ("migration statistics are available only on the source host"): any error counts
    as a job, so a domain whose arrival cannot be told complete is not held."""
    try:
        return dom.jobInfo()[0] != libvirt.VIR_DOMAIN_JOB_NONE
    except libvirt.libvirtError:
        return True


def activated(active: bool, state: int, reason: int, job_running) -> bool:
    """Whether QEMU has activated the domain's disks for certain: it runs, or it is paused
    after a completed restore (paused for a migration, no job; libvirt's restore sets no
    late block activation, so QEMU activated them when the incoming ended). A domain paused
    after an incoming migration of a paused domain reports "paused (user)" and activates
    its disks only when resumed (late block activation), so paused is not enough."""
    if not active:
        return False
    if state == RUNNING:
        return True
    return state == PAUSED and reason == PAUSED_MIGRATION and not job_running()


def _landed(dom, libvirt) -> bool:
    """The last job libvirt completed on ``dom`` was an incoming migration (kept for others:
    KEEP_COMPLETED). An error counts as one, so a domain whose disks cannot be told active
    is not held while it is paused."""
    try:
        stats = dom.jobStats(libvirt.VIR_DOMAIN_JOB_STATS_COMPLETED
                             | libvirt.VIR_DOMAIN_JOB_STATS_KEEP_COMPLETED)
    except libvirt.libvirtError:
        return True
    return stats.get("operation") == libvirt.VIR_DOMAIN_JOB_OPERATION_MIGRATION_IN


def domain_state(dom, libvirt) -> tuple[str, bool, str, bool]:
    """(state name, active, arriving, activated) of a virDomain (``libvirt``: the module)."""
    st, reason = dom.state()[:2]
    active = bool(dom.isActive())
    job = _Once(lambda: _job_running(dom, libvirt))
    return (STATE_NAMES.get(st, f"state{st}"), active,
            arriving(active, st, reason, job, lambda: _landed(dom, libvirt)),
            activated(active, st, reason, job))


class _Once:
    """A question to libvirt asked at most once."""

    def __init__(self, ask):
        self.ask, self.answer = ask, None

    def __call__(self) -> bool:
        if self.answer is None:
            self.answer = bool(self.ask())
        return self.answer
