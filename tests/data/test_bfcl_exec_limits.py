"""Model-proposed BFCL calls run under a time and a memory limit and never leave the process-wide numeric
context changed (issue 41, the hangs): ``power(base=7, exponent=30000000)`` took 96 s and
``logarithm(..., precision=300000)`` 97 s in ``repair``; ``square_root`` and ``logarithm`` left
``decimal``'s and ``mpmath``'s precision set for every later item."""

from __future__ import annotations

import decimal
import json
import time

import mpmath
import pytest

from probes.data import bfcl
from probes.data.bfcl_exec import CALL_SECONDS, BFCLEnvironment, Call, load_api_classes, parse_call


@pytest.fixture(scope="module")
def classes():
    return load_api_classes(bfcl.api_source_dir(bfcl.locate_bfcl_data()))


def math_env(classes) -> BFCLEnvironment:
    return BFCLEnvironment(classes, ["MathAPI"], {}, long_context=False)


@pytest.mark.parametrize("call", ["power(base=7, exponent=30000000)", "logarithm(value=10, base=2, precision=300000)"])
def test_the_issues_slow_calls_end_at_the_time_limit_with_that_observation(classes, call):
    started = time.perf_counter()
    observation = math_env(classes).execute_limited(parse_call(call), seconds=1.0)
    assert time.perf_counter() - started < 1.0 + 2.0  # the fork and the kill
    assert observation == "error: call exceeded the 1 s time limit"


class Allocator:
    """A stand-in API class whose method takes as much memory as it is told."""

    def _load_scenario(self, config, long_context=False):
        self.allocated = 0

    def allocate(self, megabytes):
        self.allocated = len(bytearray(megabytes * 2**20))
        return {"allocated": self.allocated}


def test_a_call_past_the_memory_limit_is_observed_as_such_and_changes_no_state():
    env = BFCLEnvironment({"Allocator": Allocator}, ["Allocator"], {}, long_context=False)
    assert env.execute_limited(parse_call("allocate(megabytes=1)"), memory_bytes=64 * 2**20) == '{"allocated": 1048576}'
    observation = env.execute_limited(parse_call("allocate(megabytes=256)"), memory_bytes=64 * 2**20)
    assert observation == "error: call exceeded the 64 MiB memory limit"
    assert env.instances["Allocator"].allocated == 2**20


def test_the_default_time_limit_is_stated():
    assert CALL_SECONDS == 5.0


@pytest.mark.parametrize("limited", [False, True], ids=["execute", "execute_limited"])
@pytest.mark.parametrize("call", ["square_root(number=2, precision=500)", "logarithm(value=10, base=2, precision=500)"])
def test_the_numeric_context_is_the_same_before_and_after_a_call_that_sets_it(classes, call, limited):
    env = math_env(classes)
    before = (decimal.getcontext().prec, mpmath.mp.dps)
    observation = (env.execute_limited if limited else env.execute)(parse_call(call))
    assert observation.startswith("{'result': ") and "error" not in observation.lower()  # mpf / Decimal: str()-ed
    assert (decimal.getcontext().prec, mpmath.mp.dps) == before


def test_limited_execution_keeps_the_trajectory_state_and_a_limit_hit_leaves_it_unchanged(classes):
    data_dir = bfcl.locate_bfcl_data()
    entries = [json.loads(line) for line in (data_dir / "BFCL_v4_multi_turn_base.json").read_text().splitlines() if line.strip()]
    entry = next(e for e in entries if "GorillaFileSystem" in e["involved_classes"])
    limited = BFCLEnvironment(classes, entry["involved_classes"], entry["initial_config"], long_context=False)
    plain = BFCLEnvironment(classes, entry["involved_classes"], entry["initial_config"], long_context=False)
    calls = ["ls()", "mkdir(dir_name='limits')", "cd(folder='limits')", "touch(file_name='a.txt')", "ls()", "pwd()"]
    for call in calls:
        assert limited.execute_limited(parse_call(call)) == plain.execute(parse_call(call))
    assert limited.execute_limited(Call("pwd(...)", "pwd", (), {}), seconds=0.0) == "error: call exceeded the 0 s time limit"
    assert limited.execute_limited(parse_call("ls()")) == plain.execute(parse_call("ls()"))


def test_bfcls_ground_truth_calls_run_under_the_default_limits_as_without(classes):
    """Legitimate calls never reach the limits: a sample of the bundled BFCL trajectories, executed
    both ways, gives the same observations and the same final state."""
    data_dir = bfcl.locate_bfcl_data()
    entries = [json.loads(line) for line in (data_dir / "BFCL_v4_multi_turn_base.json").read_text().splitlines() if line.strip()]
    answers = {json.loads(line)["id"]: json.loads(line)["ground_truth"]
               for line in (data_dir / "possible_answer" / "BFCL_v4_multi_turn_base.json").read_text().splitlines() if line.strip()}
    for entry in entries[::50]:
        limited = BFCLEnvironment(classes, entry["involved_classes"], entry["initial_config"], long_context=False)
        plain = BFCLEnvironment(classes, entry["involved_classes"], entry["initial_config"], long_context=False)
        for call in (parse_call(c) for turn in answers[entry["id"]] for c in turn):
            assert limited.execute_limited(call) == plain.execute(call), (entry["id"], call.text)
