"""signals.LoopSignals: handlers only store flags; the loop wakes through a pipe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from vmdisktouch.system.signals import LoopSignals


@pytest.fixture
def sig():
    s = LoopSignals().install()
    try:
        yield s
    finally:
        s.restore()


def test_a_stop_signal_wakes_a_long_wait_at_once(sig):
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
    t0 = time.monotonic()
    assert sig.wait(30.0) is True
    assert time.monotonic() - t0 < 5
    assert sig.stopping and sig.stop_name() == "SIGTERM"
    assert sig.wait(30.0) is True          # stays stopping: never a lost stop


def test_many_reload_signals_are_one_reload(sig):
    for _ in range(50):
        os.kill(os.getpid(), signal.SIGHUP)
    assert sig.wait(5.0) is True
    assert sig.take_reload() is True
    assert sig.take_reload() is False      # coalesced
    assert not sig.stopping


def test_another_thread_wakes_the_wait(sig):
    threading.Timer(0.2, sig.set).start()
    t0 = time.monotonic()
    assert sig.wait(30.0) is True
    assert time.monotonic() - t0 < 5 and not sig.stopping


def test_the_pace_sleep_ends_on_stop_but_not_on_reload(sig):
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGHUP)).start()
    t0 = time.monotonic()
    assert sig.sleep(0.6) is False
    assert time.monotonic() - t0 >= 0.55       # a reload waits for the end of the cycle
    assert sig.take_reload()
    threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    assert sig.sleep(30.0) is True
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1.0])
def test_a_timeout_that_is_not_a_finite_number_does_not_hang(sig, timeout):
    t0 = time.monotonic()
    assert sig.wait(timeout) is False
    assert sig.sleep(timeout) is False
    assert time.monotonic() - t0 < 1


def test_restore_puts_the_old_handlers_back():
    before = signal.getsignal(signal.SIGHUP)
    s = LoopSignals().install()
    assert signal.getsignal(signal.SIGHUP) != before
    s.restore()
    assert signal.getsignal(signal.SIGHUP) == before
    assert signal.set_wakeup_fd(-1) == -1


def test_a_signal_flood_into_a_full_pipe_prints_nothing_and_loses_no_stop():
    code = ("import os, signal, sys\n"
            "from vmdisktouch.system.signals import LoopSignals\n"
            "s = LoopSignals().install()\n"
            "for _ in range(100000): os.kill(os.getpid(), signal.SIGHUP)\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "print(s.wait(5), s.take_reload(), s.stop_name())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "SIGTERM"]
    assert r.stderr == ""
