from __future__ import annotations

import pytest

from analyzer.derive.activities import Activity, classify

HANDLER = [
    ("_bootstrap", "threading.py"),
    ("process_request_thread", "socketserver.py"),
    ("do_POST", "examples/service.py"),
]


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        # image decode inside the request handler: the innermost library (PIL) decides
        ([*HANDLER, ("preprocess", "examples/service.py"), ("load", "PIL/ImageFile.py")], Activity.PREPROCESS),
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
