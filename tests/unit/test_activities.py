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
        # a DataLoader fetching in this process: the dataset's own code under it is the input pipeline…
        ([("train", "train.py"), ("__next__", "torch/utils/data/dataloader.py"),
          ("fetch", "torch/utils/data/_utils/fetch.py"), ("__getitem__", "dataset.py")], Activity.PREPROCESS),
        # …while the main process waiting on its workers' queue waits
        ([("train", "train.py"), ("_next_data", "torch/utils/data/dataloader.py"), ("get", "queue.py"),
          ("wait", "threading.py")], Activity.WAITING),
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


# llama-cpp-python's server streaming a completion (0.3.x): starlette runs the generator in anyio's worker
# thread, so the HTTP framework is rootward of the whole model loop (issue 17: counted as server, 0 % forward)
LLAMA_CPP_STREAM = [
    ("Thread._bootstrap_inner", "threading.py"),
    ("WorkerThread.run", "anyio/_backends/_asyncio.py"),
    ("_next", "starlette/concurrency.py"),
    ("iterator", "llama_cpp/server/app.py"),
    ("Llama._create_completion", "llama_cpp/llama.py"),
    ("Llama.generate", "llama_cpp/llama.py"),
]
# vLLM V1 (0.32, CPU): the EngineCore's step into its executor, which hands the batch to the worker
# process over a shared-memory queue and spins on it
VLLM_ENGINE_CORE = [
    ("EngineCoreProc.run_busy_loop", "vllm/v1/engine/core.py"),
    ("EngineCore.step", "vllm/v1/engine/core.py"),
    ("MultiprocExecutor.execute_model", "vllm/v1/executor/multiproc_executor.py"),
    ("MultiprocExecutor.collective_rpc", "vllm/v1/executor/multiproc_executor.py"),
]


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        # llama.cpp runs the model under LlamaContext.decode (its C call has no frame of its own)
        ([*LLAMA_CPP_STREAM, ("Llama.eval", "llama_cpp/llama.py"),
          ("LlamaContext.decode", "/srv/venv/lib/python3.11/site-packages/llama_cpp/_internals.py")],
         Activity.FORWARD),
        ([*LLAMA_CPP_STREAM, ("Llama.eval", "llama_cpp/llama.py")], Activity.FORWARD),
        (LLAMA_CPP_STREAM, Activity.FORWARD),  # the generation loop's own Python
        ([*LLAMA_CPP_STREAM, ("Llama.sample", "llama_cpp/llama.py"),
          ("LlamaSampler.sample", "llama_cpp/_internals.py")], Activity.FORWARD),
        # …but its tokeniser is pre/post-processing, by name, wherever the model loop is
        ([*LLAMA_CPP_STREAM[:5], ("Llama.tokenize", "llama_cpp/llama.py"),
          ("LlamaModel.tokenize", "llama_cpp/_internals.py")], Activity.PREPROCESS),
        ([*LLAMA_CPP_STREAM, ("Llama.detokenize", "llama_cpp/llama.py")], Activity.PREPROCESS),
        # the server's own request handling stays the server's
        (LLAMA_CPP_STREAM[:3], Activity.SERVER),
        # ctransformers (GGML models) and onnxruntime: the runtime's run is the forward pass
        ([*HANDLER, ("LLM._stream", "ctransformers/llm.py"), ("LLM.generate", "ctransformers/llm.py"),
          ("LLM.eval", "ctransformers/llm.py")], Activity.FORWARD),
        ([*HANDLER, ("predict", "app.py"), ("Session.run", "onnxruntime/capi/onnxruntime_inference_collection.py")],
         Activity.FORWARD),
        ([*HANDLER, ("infer", "app.py"), ("InferRequest.infer", "openvino/runtime/ie_api.py")], Activity.FORWARD),
        # vLLM: the model runner in the worker, and the EngineCore's executor call while it is not waiting
        ([("WorkerProc.worker_busy_loop", "vllm/v1/executor/multiproc_executor.py"),
          ("CPUModelRunner.execute_model", "vllm/v1/worker/gpu_model_runner.py")], Activity.FORWARD),
        (VLLM_ENGINE_CORE[:3], Activity.FORWARD),
        # the EngineCore spinning on the queue to its worker waits for the worker's forward pass
        ([*VLLM_ENGINE_CORE, ("MessageQueue.dequeue", "vllm/distributed/device_communicators/shm_broadcast.py"),
          ("MessageQueue.acquire_read", "vllm/distributed/device_communicators/shm_broadcast.py"),
          ("sched_yield", "vllm/distributed/utils.py")], Activity.WAITING),
        # vLLM's API server awaiting its engine is not the model: AsyncLLM.generate is no forward pass
        ([("Server.serve", "uvicorn/server.py"), ("create_completion", "vllm/entrypoints/openai/api_server.py"),
          ("AsyncLLM.generate", "vllm/v1/engine/async_llm.py"),
          ("AsyncLLM.add_request", "vllm/v1/engine/async_llm.py")],
         Activity.SERVER),
        # py-spy names methods by their qualified name: a model's own forward is forward
        ([*HANDLER, ("TinyModel.forward", "app/model.py")], Activity.FORWARD),
        ([*HANDLER, ("ServerErrorMiddleware.__call__", "app/middleware.py")], Activity.SERVER),
        # the runtime rows are the library's: a function of the same name elsewhere is not claimed
        ([("main", "app.py"), ("Evaluator.eval", "app/metrics.py")], Activity.OTHER),
        ([("main", "app.py"), ("Runner.run", "myproject/llama_cpp_client.py")], Activity.OTHER),
    ],
)
def test_native_model_runtimes_are_forward_by_library_and_function(frames: list[tuple[str, str]],
                                                                   expected: Activity) -> None:
    assert classify(frames) is expected


def test_runtime_rows_name_a_package_and_functions_never_one_file() -> None:
    from diagnose.derive.activities import PATTERNS, RUNTIME_WAITS, RUNTIMES

    for runtimes, activity in ((RUNTIMES, Activity.FORWARD), (RUNTIME_WAITS, Activity.WAITING)):
        for runtime in runtimes:
            assert runtime.pattern(activity) in PATTERNS
            assert not runtime.package.endswith(".py") and runtime.functions
            for fn in runtime.functions:  # a module-level function, and a method under any class name
                for name in (fn, f"AnyClass.{fn}"):
                    where = f"/opt/venv/site-packages/{runtime.package}/any_module.py"
                    assert classify([(name, where)]) is activity, (name, where)
