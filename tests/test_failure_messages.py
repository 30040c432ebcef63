"""The failure-message builder (conformance.worlds.failure) and the stack helpers
(conformance.worlds.stacks) from hand-made inputs: progress board slots, faulthandler dumps,
what a task's wait saw. No world, no torch."""
import os

from conformance.worlds import host as host_mod
from conformance.worlds.failure import (ReplicaDied, ReplicaFailed, ReplicaTimeout, all_waiting, classify,
                                        collective_hang, lead, progress_mark, replica_diagnosis,
                                        replica_error)
from conformance.worlds.stacks import KIT_THREADS, innermost, kit_thread, replica_stacks, top_frame, worker

SITE = "/venv/lib/python3.11/site-packages"
HEAD = "cpu world of 2 replica(s): task train"
LOAD = "machine load 0.5 (1 min average) on 2 CPUs"
TASK = 7

WAITER = f"""  File "{SITE}/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "{SITE}/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/home/u/mydp.py", line 41 in _reduce
  File "{SITE}/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "/home/u/train.py", line 9 in main"""
SLEEPER = f"""  File "/home/u/mydp.py", line 30 in _reduce
  File "{SITE}/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "/home/u/train.py", line 9 in main"""
# The kit's own host threads (conformance.worlds.host): never a replica's.
WATCHDOG = """  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap_inner
  File "/kit/conformance/worlds/host.py", line 48 in watch
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap"""


def _dump(*threads):
    """A faulthandler dump of ``(thread ident, frames)``, the first the current thread."""
    return "\n\n".join(f"{'Current thread' if i == 0 else 'Thread'} 0x{tid:016x} (most recent call first):\n{body}"
                       for i, (tid, body) in enumerate(threads)) + "\n"


def _slot(rank, **kw):
    return {"rank": rank, "task": TASK, "state": "running", **kw}


def _diagnose(slots, *, raised=None, dead=None, pending=(), dumps=None, logs=None, now=140.0):
    dumps, logs = dumps or {}, logs or {}
    return [replica_diagnosis(r, r, 10 + r, TASK, slot, now=now, rss=(100.0 + r, 120.0 + r),
                              dump=dumps.get(r, ""), host_tids=[slot["tid"]] if slot.get("tid") else [],
                              log_tail=logs.get(r, ""), raised=raised or {}, dead=dead or {}, pending=set(pending))
            for r, slot in enumerate(slots)]


def _facts(**kw):
    return {"timeout": 120.0, "elapsed": 3.0, "raised": {}, "dead": {}, "hang": None,
            "collective_bound": 30.0, "load": LOAD} | kw


# --- a culprit that raised, its peer left in a collective ---------------------------------

def test_a_raise_names_the_replica_that_raised_not_the_peer_in_the_collective():
    raised = {1: {"exception_type": "ValueError", "exception_message": "bad batch\nsecond line",
                  "traceback": "Traceback (most recent call last):\n  File \"/home/u/mydp.py\", line 7, in "
                               "forward\nValueError: bad batch", "step": 2, "phase": "forward"}}
    slots = [_slot(0, step=2, phase="backward", in_collective="all_reduce #3", last_collective="all_reduce #3",
                   collectives=3, since=136.0),
             _slot(1, step=2, phase="forward", last_collective="all_reduce #2", collectives=2)]
    diag = _diagnose(slots, raised=raised, pending={0})
    assert diag[0]["waited_s"] == 4.0 and diag[0]["status"] == "hung" and diag[1]["status"] == "raised"
    assert (diag[1]["rss_mib"], diag[1]["peak_rss_mib"]) == (101.0, 121.0)

    err = replica_error(diag, HEAD, **_facts(raised=raised))
    assert type(err) is ReplicaFailed
    assert err.summary() == ("replica 1 raised ValueError: bad batch [host 1, pid 11; step 2, phase forward, "
                             "last collective all_reduce #2]. " + HEAD + ": 1 replica(s) raised; replica 1 raised "
                             "ValueError: bad batch [host 1, pid 11; step 2, phase forward, last collective "
                             "all_reduce #2]")
    assert [d["status"] for d in diag] == ["aborted-by-peer", "raised"]
    assert [d["culprit"] for d in diag] == [False, True] and diag[1]["culprit_reason"] == "raised"
    assert "Traceback" in err.details() and err.diagnosis is diag


def test_a_collective_mismatch_blames_no_single_replica():
    words = "[gloo] Received data size doesn't match expected size"
    raised = {r: {"exception_type": "RuntimeError", "exception_message": words, "traceback": "",
                  "in_collective": "all_reduce #1"} for r in (0, 1)}
    diag = _diagnose([_slot(0, last_collective="all_reduce #1"), _slot(1, last_collective="all_reduce #1")],
                     raised=raised)
    summary, cls = classify(diag, HEAD, **_facts(raised=raised))
    assert cls is ReplicaFailed
    assert summary.startswith(f"{HEAD}: collective mismatch between replicas 0, 1 (the runtime says: {words})")
    assert [d["status"] for d in diag] == ["mismatched", "mismatched"]


# --- a hang, with stacks ------------------------------------------------------------------

def test_a_hang_names_the_replica_outside_the_collective_at_its_innermost_frame():
    slots = [_slot(0, tid=0xA, step=1, phase="backward", in_collective="all_reduce #1",
                   last_collective="all_reduce #1", collectives=1, since=100.0),
             _slot(1, tid=0xB, step=1, phase="backward", collectives=0)]
    dumps = {0: _dump((0xA, WAITER), (0xE, WATCHDOG)), 1: _dump((0xB, SLEEPER), (0xF, WATCHDOG))}
    diag = _diagnose(slots, pending={0, 1}, dumps=dumps)
    assert "watch" not in diag[1]["stacks"] and "mydp.py" in diag[1]["stacks"]
    assert diag[0]["in_collective"] == "all_reduce #1" and diag[1]["in_collective"] is None

    hang = collective_hang(slots, TASK, 140.0, 30.0)
    assert hang is not None and hang[1] == [0]
    err = replica_error(diag, HEAD, **_facts(hang=hang, elapsed=41.0))
    assert type(err) is ReplicaTimeout
    s = err.summary()
    assert s.startswith("replica 1 hung outside any collective at u/mydp.py:30 in _reduce (step 1, phase "
                        "backward; rss 101 MiB). "), s
    assert (f"{HEAD}: replica(s) [0] waited in a collective for more than the collective bound (30 s, below "
            f"the runtime's own collective timeout) after 41.0 s of the task; {LOAD}; ") in s
    assert s.endswith("; waiting: replica 0 in all_reduce #1 for 40.0 s"), s
    assert [d["status"] for d in diag] == ["waiting", "hung"]


def test_a_task_bound_without_collectives_blames_every_replica_alike():
    slots = [_slot(0, tid=0xA, step=3), _slot(1, tid=0xB, step=3)]
    diag = _diagnose(slots, pending={0, 1}, dumps={0: _dump((0xA, SLEEPER)), 1: _dump((0xB, SLEEPER))})
    summary, cls = classify(diag, HEAD, **_facts(elapsed=120.4))
    assert cls is ReplicaTimeout
    assert summary.startswith("no single culprit, replicas 0, 1 alike: replica 0 hung at u/mydp.py:30 in _reduce")
    assert "no answer within 120 s (task bound; 120.4 s elapsed)" in summary


def test_a_replica_that_returned_is_blamed_when_its_peer_waits():
    slots = [_slot(0, in_collective="all_reduce #4", last_collective="all_reduce #4", collectives=4, since=100.0),
             _slot(1, state="returned", collectives=3)]
    diag = _diagnose(slots, pending={0})
    assert [d["status"] for d in diag] == ["hung", "ok"]
    summary, cls = classify(diag, HEAD, **_facts(hang=collective_hang(slots, TASK, 140.0, 30.0)))
    assert cls is ReplicaTimeout
    assert summary.startswith("replica 1 returned from the task after 3 recorded collective(s) while others wait "
                              "in a collective"), summary


# --- a death with a signal ----------------------------------------------------------------

def test_a_death_by_signal_says_the_signal_and_the_runtimes_last_words():
    slots = [_slot(0, in_collective="all_reduce #2", last_collective="all_reduce #2", collectives=2, since=139.0),
             _slot(1, step=1, phase="backward", last_collective="all_reduce #1", collectives=1)]
    logs = {1: "starting\nterminate called: [gloo] Connection closed by peer\n\n"}
    diag = _diagnose(slots, dead={1: -6}, pending={0}, logs=logs)
    assert (diag[1]["exit_code"], diag[1]["signal"], diag[1]["status"]) == (-6, "SIGABRT", "died")
    assert diag[1]["rss_mib"] == 101.0  # the caller passes none for a dead host; here it did
    summary, cls = classify(diag, HEAD, **_facts(dead={1: -6}))
    assert cls is ReplicaDied
    first = "replica 1 (host 1, pid 11) died: killed by SIGABRT (terminate called: [gloo] Connection closed by peer)"
    assert summary.startswith(f"{first}. {HEAD}: 1 replica(s) died: {first} [replica 0: "), summary
    assert "replica 1: step 1, phase backward, last collective all_reduce #1]" in summary
    assert [d["status"] for d in diag] == ["aborted-by-peer", "died"]


def test_an_exit_code_is_said_as_such():
    diag = _diagnose([_slot(0), _slot(1)], dead={0: 3}, pending={1})
    assert (diag[0]["exit_code"], diag[0]["signal"]) == (3, None)
    summary, cls = classify(diag, HEAD, **_facts(dead={0: 3}))
    assert cls is ReplicaDied and summary.startswith("replica 0 (host 0, pid 10) died: exited with code 3. ")


# --- the board decisions ------------------------------------------------------------------

def test_collective_hang_needs_the_bound_passed_and_a_peer_elsewhere_or_a_mismatch():
    waiting = _slot(0, in_collective="all_reduce #1", collectives=1, since=100.0)
    assert collective_hang([waiting, _slot(1)], TASK, 120.0, 30.0) is None  # bound not passed
    assert collective_hang([waiting, _slot(1)], TASK, 140.0, 30.0)[1] == [0]
    same = _slot(1, in_collective="all_reduce #1", collectives=1, since=100.0)
    assert collective_hang([waiting, same], TASK, 140.0, 30.0) is None  # they will meet
    other = _slot(1, in_collective="broadcast #2", collectives=2, since=100.0)
    assert collective_hang([waiting, other], TASK, 140.0, 30.0)[1] == [0, 1]
    sampled = _slot(1, seen_collective="torch.distributed.all_reduce at u/mydp.py:41", seen_since=100.0,
                    collectives=1)  # seen in its stack only: it waits there too
    assert collective_hang([_slot(0), sampled], TASK, 140.0, 30.0)[1] == [1]
    assert collective_hang([_slot(0), sampled], TASK, 125.0, 30.0) is None


def test_a_peer_that_advanced_within_the_bound_is_late_not_hung():
    """Under load a peer may trace its step for longer than the bound while the others wait:
    while its progress slot changed within the bound, no hang is declared (issue 26 item 3)."""
    waiting = _slot(0, in_collective="all_reduce #1", collectives=1, since=100.0)
    tracing = _slot(1, phase="backward")
    assert collective_hang([waiting, tracing], TASK, 140.0, 30.0, moved={0: 100.0, 1: 125.0}) is None
    assert collective_hang([waiting, tracing], TASK, 160.0, 30.0, moved={0: 100.0, 1: 125.0})[1] == [0]
    assert collective_hang([waiting, tracing], TASK, 140.0, 30.0, moved={0: 100.0})[1] == [0]  # never seen move
    done = _slot(1, state="returned")  # it left the task: it will not come
    assert collective_hang([waiting, done], TASK, 140.0, 30.0, moved={0: 100.0, 1: 125.0})[1] == [0]
    other = _slot(1, in_collective="broadcast #2", collectives=2, since=139.0)  # a mismatch: never held
    assert collective_hang([waiting, other], TASK, 140.0, 30.0, moved={0: 100.0, 1: 139.0})[1] == [0]


def test_progress_marks_change_with_the_step_phase_and_collectives():
    a = _slot(1, step=3, phase="forward", collectives=4)
    assert progress_mark(a) == progress_mark(dict(a))
    for change in ({"step": 4}, {"phase": "backward"}, {"collectives": 5}, {"in_collective": "all_reduce #5"}):
        assert progress_mark(a) != progress_mark({**a, **change}), change
    assert progress_mark(a) == progress_mark({**a, "rss": 9})  # not progress


def test_all_waiting_counts_a_collective_seen_in_the_stack():
    board = [_slot(0, in_collective="all_reduce #1"), _slot(1, seen_collective="all_reduce at x.py:1")]
    assert all_waiting(board, [0, 1], TASK)
    assert not all_waiting(board + [_slot(2)], [0, 1, 2], TASK)
    assert not all_waiting([_slot(0, task=TASK - 1, in_collective="all_reduce #1")], [0], TASK)


# --- stack helpers ------------------------------------------------------------------------

def test_kit_threads_are_the_hosts_own_functions():
    assert {f for _, f in KIT_THREADS} == {os.path.basename(host_mod.__file__)}
    nested = {c.co_name for c in host_mod.die_with_parent.__code__.co_consts if hasattr(c, "co_name")}
    assert {"watch", "watch_collectives"} == {fn for fn, _ in KIT_THREADS}
    assert "watch" in nested and callable(host_mod.watch_collectives)
    assert kit_thread(WATCHDOG) and not kit_thread(SLEEPER)


def test_replica_stacks_on_a_host_of_several_replicas():
    backward = f"""  File "{SITE}/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "/home/u/train.py", line 9 in main"""
    hook_worker = f"""  File "{SITE}/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/home/u/mydp.py", line 41 in _reduce"""  # autograd's device thread: no threading bootstrap
    dump = _dump((0xA, backward), (0xB, SLEEPER), (0xC, hook_worker), (0xE, WATCHDOG))
    text, seen = replica_stacks(dump, 0xA, [0xA, 0xB])
    assert seen == "torch.distributed.all_reduce at u/mydp.py:41 in _reduce"
    assert "0x000000000000000a" in text and "0x000000000000000c" in text and "0x000000000000000b" not in text
    text, seen = replica_stacks(dump, 0xB, [0xA, 0xB])  # not in backward: its own thread only
    assert seen is None and "0x000000000000000c" not in text
    assert replica_stacks(dump, 0xD, [0xA, 0xB]) == (dump, None)  # its thread is not in the dump
    assert innermost(backward) == "_engine_run_backward" and worker(hook_worker) and not worker(WATCHDOG)


def test_top_frame_skips_a_thread_waiting_in_backward():
    backward = f"""  File "{SITE}/torch/autograd/graph.py", line 979 in _engine_run_backward
  File "/home/u/train.py", line 9 in main"""
    assert top_frame(_dump((1, backward), (2, SLEEPER))).startswith("u/mydp.py:30 in _reduce")
    assert top_frame(_dump((1, backward))) == "autograd/graph.py:979 in _engine_run_backward"  # all it has


def test_lead_names_every_culprit_when_there_are_several():
    assert lead([]) == ""
    assert lead(["replica 1 raised X: y."], [{"rank": 1}]) == "replica 1 raised X: y. "
    assert lead(["replica 0 hung", "replica 1 hung"], [{"rank": 0}, {"rank": 1}]) == \
        "no single culprit, replicas 0, 1 alike: replica 0 hung. "
