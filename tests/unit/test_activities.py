from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

import diagnose.examples.service
from diagnose.collectors.pyspy import parse_raw
from diagnose.derive.activities import Activity, classify

HANDLER = [
    ("_bootstrap", "threading.py"),
    ("process_request_thread", "socketserver.py"),
    ("do_POST", "examples/service/server.py"),
]
SESSIONS = Path(__file__).parent.parent / "data" / "sessions"


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        # image decode inside the request handler: the innermost library (PIL) decides
        ([*HANDLER, ("preprocess", "examples/service/cpu_preprocess.py"), ("load", "PIL/ImageFile.py")],
         Activity.PREPROCESS),
        # pure-Python pre-processing is claimed by its function name
        ([*HANDLER, ("preprocess", "app.py"), ("<genexpr>", "app.py")], Activity.PREPROCESS),
        # numpy work outside the model
        ([*HANDLER, ("normalise_batch", "app.py"), ("mean", "numpy/core/_methods.py")], Activity.PREPROCESS),
        # the model: a user function named decode_step that calls torch is forward, not preprocessing
        (
            [
                *HANDLER,
                ("decode_step", "app.py"),
                ("_call_impl", "torch/nn/modules/module.py"),
                ("forward", "torch/nn/modules/linear.py"),
            ],
            Activity.FORWARD,
        ),
        # torch's own F.normalize is part of the model
        ([*HANDLER, ("forward", "model.py"), ("normalize", "torch/nn/functional.py")], Activity.FORWARD),
        # a compile frame claims the sample, wherever it is (nothing runs compiled code leafward of it)
        (
            [
                *HANDLER,
                ("_fn", "torch/_dynamo/eval_frame.py"),
                ("__call__", "torch/_dynamo/convert_frame.py"),
                ("run", "torch/_dynamo/symbolic_convert.py"),
                ("subs", "sympy/core/basic.py"),
            ],
            Activity.COMPILE,
        ),
        (
            [*HANDLER, ("compile_fx", "torch/_inductor/compile_fx.py"), ("communicate", "subprocess.py")],
            Activity.COMPILE,
        ),
        # a compiled graph running (eval_frame wrapper + generated code) is forward, not compile
        (
            [*HANDLER, ("_fn", "torch/_dynamo/eval_frame.py"), ("call", "/tmp/torchinductor_root/ab/cab.py")],
            Activity.FORWARD,
        ),
        # AOT autograd's runtime wrapper is on the stack of every call into a compiled graph: running, not compiling
        (
            [*HANDLER, ("_fn", "torch/_dynamo/eval_frame.py"), ("forward", "torch/_functorch/aot_autograd.py"),
             ("runtime_wrapper", "torch/_functorch/_aot_autograd/runtime_wrappers.py"),
             ("__call__", "torch/_inductor/output_code.py"), ("call", "/tmp/torchinductor_root/ab/cab.py"),
             ("addmm", "torch/_ops.py")],
            Activity.FORWARD,
        ),
        # …but a recompile triggered from inside a compiled region is compile again
        (
            [*HANDLER, ("runtime_wrapper", "torch/_functorch/_aot_autograd/runtime_wrappers.py"),
             ("forward", "model.py"), ("__call__", "torch/_dynamo/convert_frame.py"),
             ("run", "torch/_dynamo/symbolic_convert.py")],
            Activity.COMPILE,
        ),
        (
            [*HANDLER, ("respond", "app.py"), ("dumps", "json/__init__.py"), ("encode", "json/encoder.py")],
            Activity.SERIALIZE,
        ),
        ([*HANDLER, ("validate", "pydantic/main.py")], Activity.SERIALIZE),
        ([*HANDLER, ("synchronize", "torch/cuda/__init__.py")], Activity.COPY_SYNC),
        ([*HANDLER, ("parse_request", "http/server.py")], Activity.SERVER),
        ([*HANDLER, ("get", "queue.py"), ("wait", "threading.py")], Activity.WAITING),
        ([("main", "app.py"), ("loop", "app.py")], Activity.OTHER),
        ([], Activity.OTHER),
    ],
)
def test_classify(frames: list[tuple[str, str]], expected: Activity) -> None:
    assert classify(frames) is expected


def _demo_modules() -> dict[str, str]:
    """Each top-level function and class of the demo service package → the file that defines it."""
    where: dict[str, str] = {}
    for info in pkgutil.iter_modules(diagnose.examples.service.__path__, "diagnose.examples.service."):
        module = importlib.import_module(info.name)
        path = info.name.removeprefix("diagnose.").replace(".", "/") + ".py"
        for name, obj in vars(module).items():
            if getattr(obj, "__module__", None) == info.name:
                where[name] = path
    return where


# what the single-file service's frames are now that no top-level name says: the main thread's
# module frame, and the classes the package folded into the engine's shared loops
_FOLDED = {"<module>": "examples/service/__main__.py", "ModelWorker": "examples/service/engine.py",
           "BatchingWorkerPool": "examples/service/engine.py", "ChunkedPrefillEngine": "examples/service/engine.py"}


def test_the_demo_service_modules_are_classified_by_function_not_by_file() -> None:
    """No row claims a file of the demo package by its path: its code is what its functions say."""
    files = sorted(set(_demo_modules().values()))
    assert "examples/service/queueing.py" in files and "examples/service/server.py" in files
    for path in files:
        for where in (path, f"/srv/app/{path}", path.rsplit("/", 2)[-2] + "/" + path.rsplit("/", 1)[-1]):
            assert classify([("run", where)]) is Activity.OTHER, where
    assert classify([*HANDLER, ("normalize", "examples/service/cpu_preprocess.py")]) is Activity.PREPROCESS


@pytest.mark.parametrize("session", sorted(p.name for p in SESSIONS.iterdir() if (p / "pyspy.raw").exists()))
def test_recorded_demo_stacks_classify_the_same_under_the_package_paths(session: str) -> None:
    """The recorded sessions hold stacks of the single-file ``examples/service.py``: moved to the
    module that defines each function now, every stack keeps its activity."""
    where = _demo_modules()
    with (SESSIONS / session / "pyspy.raw").open() as fh:
        samples = parse_raw(fh)
    moved = 0
    for sample in samples:
        old = [(f.function, f.file) for f in sample.frames]
        new = []
        for function, file in old:
            if file == "examples/service.py":
                top = function.split(".", 1)[0]
                file = where.get(top) or _FOLDED[top]
                moved += 1
            new.append((function, file))
        assert classify(new) is classify(old), (old, new)
    assert moved > 0
