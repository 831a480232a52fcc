"""Execute BFCL ground-truth calls on BFCL's own API classes, without BFCL's runtime.

BFCL stores no tool outputs for its multi-turn entries; its checker re-executes calls on the
classes in ``bfcl_eval/eval_checker/multi_turn_eval/func_source_code/``
(``multi_turn_utils.execute_multi_turn_func_call``). This module replicates the minimal part of
that function:

* one instance per involved class, ``_load_scenario(deepcopy(initial_config[class]),
  long_context=...)`` except for the stateless ``MathAPI``;
* public method names map to instances in ``involved_classes`` order (a later class wins a
  shared name, as in BFCL's dict update);
* the names BFCL refuses (``kill``, ``exit``, ...) are refused with BFCL's message;
* a ``str`` result is kept, a ``dict`` is ``json.dumps``-ed (``str`` if not serialisable),
  anything else is ``str``-ed; an exception becomes ``"Error during execution: <message>"``.

The difference: BFCL ``eval``-s the call string after prefixing method names with instance
names; here the call is parsed with :mod:`ast` (keyword and positional arguments must be Python
literals, which every multi-turn ground-truth call is) and the bound method is called directly.

Model-proposed calls (``repair``) run through :meth:`BFCLEnvironment.execute_limited`: in a forked
child process with :data:`CALL_SECONDS` of time and :data:`CALL_MEMORY_BYTES` of memory beyond what
the process already holds, the environment's state sent back after the call. A call past a limit is
killed; its observation says which limit (``"error: call exceeded the 5 s time limit"``,
``"error: call exceeded the 2048 MiB memory limit"``) and the state stays as it was before it. Every
execution restores the process-wide numeric context afterwards (``decimal``'s context, ``mpmath``'s
precision), which ``square_root`` and ``logarithm`` set: a later call, or item, never inherits it.

The class files are loaded from their file paths (:func:`load_api_classes`); only ``bfcl_eval``'s
``long_context.py`` data module is registered under its dotted name, because the class files
import it by that name. Nothing else of ``bfcl_eval`` is imported (its pins clash with ours).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import decimal
import importlib.util
import inspect
import json
import multiprocessing
import resource
import sys
from collections.abc import Iterator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

# BFCL's constants.executable_backend_config, restricted to the classes of the multi-turn
# categories (the memory and web-search classes need faiss, serpapi, ... and no multi-turn
# entry involves them).
API_CLASS_FILES: dict[str, str] = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
STATELESS_CLASSES: frozenset[str] = frozenset({"MathAPI"})
FORBIDDEN_CALLS: frozenset[str] = frozenset({"kill", "exit", "quit", "remove", "unlink", "popen", "Popen", "run"})
_PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
# Limits on one model-proposed call (execute_limited). BFCL's own calls take milliseconds and a few MB;
# power(base=7, exponent=30000000) took 96 s and logarithm(..., precision=300000) 97 s before them.
CALL_SECONDS = 5.0
CALL_MEMORY_BYTES = 2 * 1024**3


class BFCLExecutionError(ValueError):
    """A call string cannot be parsed or bound (not a BFCL runtime error, which is an observation)."""


@dataclass(frozen=True)
class Call:
    """A parsed call ``name(*args, **kwargs)`` with its source text."""

    text: str
    name: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]


def call_name(node: ast.Call) -> str | None:
    """The called name: ``f``, or ``a.b.f`` for an attribute chain (BFCL's decoder joins such chains
    too); None for anything else (``f()()``, ``x[0]()``)."""
    parts, func = [], node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    return ".".join([func.id, *reversed(parts)])


def call_from_node(node: ast.Call, text: str) -> Call:
    """The :class:`Call` of a parsed call expression whose arguments are Python literals
    (``ast.literal_eval``: nothing is evaluated); ``text`` is its source, named in errors."""
    name = call_name(node)
    if name is None:
        raise BFCLExecutionError(f"call {text!r} does not call a name")
    try:
        args = tuple(ast.literal_eval(arg) for arg in node.args)
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    except (ValueError, TypeError, SyntaxError, RecursionError) as error:
        raise BFCLExecutionError(f"call {text!r} has a non-literal argument ({error})") from error
    if None in kwargs:
        raise BFCLExecutionError(f"call {text!r} uses **kwargs unpacking")
    return Call(text, name, args, kwargs)


def parse_call(text: str) -> Call:
    """Parse one BFCL call string such as ``mv(source='a.txt', destination='b')``."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as error:
        raise BFCLExecutionError(f"call {text!r} is not a Python call expression: {error.msg}") from error
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise BFCLExecutionError(f"call {text!r} must be a plain function call name(...)")
    return call_from_node(node, text)


def _load_module(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise FileNotFoundError(f"BFCL API source {path} is missing; reinstall with: pip install --no-deps bfcl-eval")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_api_classes(source_dir: Path) -> dict[str, type]:
    """BFCL's multi-turn API classes, loaded from ``source_dir`` (``.../func_source_code``)."""
    source_dir = Path(source_dir)
    _load_module(f"{_PACKAGE}.long_context", source_dir / "long_context.py")
    classes = {}
    for class_name, stem in API_CLASS_FILES.items():
        module = _load_module(f"{_PACKAGE}.{stem}", source_dir / f"{stem}.py")
        classes[class_name] = getattr(module, class_name)
    return classes


def format_result(result: Any) -> str:
    """BFCL's conversion of a method's return value into the observation string."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def is_error_observation(observation: str) -> bool:
    """An execution error (BFCL's exception string) or a JSON object with an ``error`` key."""
    if observation.startswith("Error during execution:"):
        return True
    try:
        value = json.loads(observation)
    except ValueError:
        return False
    return isinstance(value, dict) and "error" in value


class BFCLEnvironment:
    """The instances of one BFCL entry, loaded from its ``initial_config``."""

    def __init__(
        self, classes: Mapping[str, type], involved_classes: Sequence[str], initial_config: Mapping[str, Any], *, long_context: bool
    ) -> None:
        unknown = [name for name in involved_classes if name not in classes]
        if unknown:
            raise BFCLExecutionError(f"involved class(es) {unknown} are not multi-turn API classes {sorted(classes)}")
        self.instances: dict[str, Any] = {}
        for class_name in involved_classes:
            instance = classes[class_name]()
            if class_name not in STATELESS_CLASSES:
                instance._load_scenario(copy.deepcopy(initial_config.get(class_name, {})), long_context=long_context)
            self.instances[class_name] = instance
        self._map_methods()

    def _map_methods(self) -> None:
        self.methods: dict[str, Any] = {}
        for instance in self.instances.values():
            for method_name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not method_name.startswith("_"):
                    self.methods[method_name] = method

    def bind(self, call: Call) -> dict[str, Any]:
        """The call's arguments by parameter name (positional arguments named by the method's signature)."""
        if call.name not in self.methods:
            raise BFCLExecutionError(f"{call.text!r}: no involved class has a method {call.name!r}")
        try:
            bound = inspect.signature(self.methods[call.name]).bind(*call.args, **call.kwargs)
        except TypeError as error:
            raise BFCLExecutionError(f"{call.text!r} does not match {call.name}'s signature: {error}") from error
        return dict(bound.arguments)

    def execute(self, call: Call) -> str:
        """Run ``call`` and return BFCL's observation string (errors included, as BFCL records them)."""
        with _numeric_context_kept():
            try:
                if call.name in FORBIDDEN_CALLS:
                    raise Exception(f"Function call {call.name} is not allowed.")
                if call.name not in self.methods:
                    raise NameError(f"name '{call.name}' is not defined")
                return format_result(self.methods[call.name](*call.args, **call.kwargs))
            except MemoryError:
                raise  # the process's memory, not the call's error (execute_limited reports its limit)
            except Exception as error:  # noqa: BLE001 - BFCL records every exception as an observation
                return f"Error during execution: {error}"

    def execute_limited(self, call: Call, *, seconds: float = CALL_SECONDS, memory_bytes: int = CALL_MEMORY_BYTES) -> str:
        """:meth:`execute` in a forked child under a time and a memory limit (module docstring); the
        child's state after the call replaces this one's. Past a limit: the observation names it and
        the state is unchanged."""
        fork = multiprocessing.get_context("fork")  # the child starts with this state, nothing to send
        receive, send = fork.Pipe(duplex=False)
        child = fork.Process(target=_execute_in_child, args=(self, call, memory_bytes, send), daemon=True)
        child.start()
        send.close()
        try:
            if not receive.poll(seconds):
                return f"error: call exceeded the {seconds:g} s time limit"
            try:
                outcome, value = receive.recv()
            except EOFError:
                child.join()
                return f"error: the call's process ended without a result (exit code {child.exitcode})"
        finally:
            child.kill()
            child.join()
            receive.close()
        if outcome == "memory":
            return f"error: call exceeded the {memory_bytes / 1024**2:g} MiB memory limit"
        observation, self.instances = value
        self._map_methods()
        return observation

    def snapshot(self) -> "BFCLEnvironment":
        """An independent copy of the current state (to try a perturbed call without touching this one)."""
        clone = object.__new__(BFCLEnvironment)
        clone.instances = copy.deepcopy(self.instances)
        clone._map_methods()
        return clone


def _execute_in_child(env: BFCLEnvironment, call: Call, memory_bytes: int, send: Any) -> None:
    """The child of :meth:`BFCLEnvironment.execute_limited`: its address space may grow by
    ``memory_bytes`` (the limit counts what the fork already maps); sends the observation and state."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + memory_bytes, resource.RLIM_INFINITY))
    try:
        observation = env.execute(call)
    except MemoryError:
        send.send(("memory", None))
        return
    send.send(("observed", (observation, env.instances)))


@contextlib.contextmanager
def _numeric_context_kept() -> Iterator[None]:
    """Restore ``decimal``'s context and ``mpmath``'s precision (when it is loaded) on leaving."""
    context = decimal.getcontext().copy()
    mpmath = sys.modules.get("mpmath")  # math_api imports it when the classes load
    precision = mpmath.mp.prec if mpmath is not None else None
    try:
        yield
    finally:
        decimal.setcontext(context)
        if mpmath is not None:
            mpmath.mp.prec = precision
