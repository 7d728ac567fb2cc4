"""Pasted cProfile / pstats tables: each row's function classified, an activity's share of the profile's time."""

from __future__ import annotations

import io

from diagnose import loose
from diagnose.collectors.pstats_table import PstatsParser, parse_location
from diagnose.derive.activities import Activity
from diagnose.derive.pstats_table import shares
from diagnose.model import Confidence, Evidence, EvidenceSet
from diagnose.rules.engine import run_rules
from diagnose.rules.registry import RULES

# huggingface/transformers#1830, "GPT2 tokenizer is so slow because of sum()" (rows as pasted, strip_dirs' names)
GPT2 = """I run profiler and here is the result:

```
         73791524 function calls in 114.720 seconds

   Ordered by: standard name

   ncalls  tottime  percall  cumtime  percall filename:lineno(function)
    27157    0.045    0.000    0.060    0.000 <frozen importlib._bootstrap>:1009(_handle_fromlist)
    27157    0.237    0.000    4.258    0.000 regex.py:328(findall)
  4815114    8.703    0.000   16.973    0.000 tokenization_gpt2.py:139(bpe)
    27157   22.988    0.001  112.449    0.004 tokenization_gpt2.py:180(_tokenize)
 25459527    5.708    0.000    5.708    0.000 tokenization_gpt2.py:194(<genexpr>)
  1377876    1.595    0.000    1.900    0.000 tokenization_gpt2.py:91(get_pairs)
```
"""

# WorldCereal/presto-worldcereal#9, "Faster dataset `__getitem__`, use workers" (num_workers=0; paths shortened)
LOADER = """   ncalls  tottime  percall  cumtime  percall filename:lineno(function)
        1    0.000    0.000  208.387  208.387 /home/u/.pycharm_helpers/profiler/prof_util.py:15(execfile)
   3408/1    0.083    0.000  208.382  208.382 {built-in method builtins.exec}
        1    0.012    0.012  208.382  208.382 train.py:2(<module>)
       15    0.000    0.000  191.082   12.739 /venv/site-packages/tqdm/std.py:1174(__iter__)
       12    0.000    0.000  191.063   15.922 /venv/site-packages/torch/utils/data/dataloader.py:629(__next__)
       12    0.012    0.001  191.060   15.922 /venv/site-packages/torch/utils/data/dataloader.py:676(_next_data)
       12    0.000    0.000  190.987   15.916 /venv/site-packages/torch/utils/data/_utils/fetch.py:46(fetch)
"""

# turboderp-org/exllamav2#455, "put rfn_sum on cuda and do .item() call out of for loop" (sorted by internal time)
SYNCS = """         12347828 function calls (12238743 primitive calls) in 385.159 seconds

   Ordered by: internal time
   List reduced from 8601 to 10 due to restriction <10>

   ncalls  tottime  percall  cumtime  percall filename:lineno(function)
     3800  179.361    0.047  179.361    0.047 {method 'item' of 'torch._C.TensorBase' objects}
     7658  109.105    0.014  109.105    0.014 {method 'cuda' of 'torch._C.TensorBase' objects}
    50352   37.682    0.001   37.682    0.001 {method 'to' of 'torch._C.TensorBase' objects}
        2   12.386    6.193   12.386    6.193 {built-in method safetensors._safetensors_rust.serialize_file}
      201    6.898    0.034    6.898    0.034 {method 'tobytes' of 'numpy.ndarray' objects}
"""


def _profiles(text: str) -> PstatsParser:
    p = PstatsParser()
    for line in text.splitlines():
        p.feed(line)
    return p


def _evidence(text: str) -> EvidenceSet:
    res = loose.analyze_stream("t", io.BufferedReader(io.BytesIO(text.encode())))  # type: ignore[arg-type]
    return EvidenceSet(res.evidence)


def test_a_rows_last_field_names_a_python_or_a_c_function() -> None:
    assert parse_location("tokenization_gpt2.py:180(_tokenize)") == ("tokenization_gpt2.py", "_tokenize")
    assert parse_location("<frozen importlib._bootstrap>:1009(_handle_fromlist)") == (
        "<frozen importlib._bootstrap>", "_handle_fromlist")
    assert parse_location("{built-in method cv2.imdecode}") == ("cv2", "imdecode")
    assert parse_location("{method 'item' of 'torch._C.TensorBase' objects}") == ("torch._C.TensorBase", "item")
    assert parse_location("train.py:2(<module>)") == ("train.py", "<module>")
    assert parse_location("a sentence (not a function)") is None


def test_a_tokenizers_cumulative_time_is_the_profiles_preprocessing() -> None:
    (profile,) = _profiles(GPT2).result()
    assert profile.total_s == 114.72 and len(profile.rows) == 6 and profile.rows[2].calls == 4815114
    got, tops = shares(profile)
    assert abs(got[Activity.PREPROCESS] - 112.449 / 114.72) < 1e-3  # _tokenize, by its name, with no model beside it
    assert tops[Activity.PREPROCESS][0]["function"] == "_tokenize (tokenization_gpt2.py)"
    findings, _ = run_rules(_evidence(GPT2), rules=RULES)
    (cpu,) = [f for f in findings if f.code == "CPU001"]
    assert cpu.confidence is Confidence.MEASURED and "cProfile" in cpu.message and "tokenis" in cpu.title.lower()


def test_a_dataloaders_fetch_in_the_main_process_is_the_input_pipeline() -> None:
    (profile,) = _profiles(LOADER).result()
    assert profile.total_s is None and profile.span_s == 208.387  # no header: the root's cumulative time
    got, _ = shares(profile)
    assert abs(got[Activity.PREPROCESS] - 190.987 / 208.387) < 1e-3
    ev = _evidence("Faster dataset `__getitem__`, use workers\n" + LOADER)
    assert isinstance(ev.get("workers.active_mean"), Evidence) and ev.value("cpu.profile_total_s") == 208.387
    assert any(f.code == "CPU001" for f in run_rules(ev, rules=RULES)[0])


def test_time_blocked_in_tensor_moves_is_copy_and_sync_not_preprocessing() -> None:
    (profile,) = _profiles(SYNCS).result()
    got, _ = shares(profile)
    assert abs(got[Activity.COPY_SYNC] - (179.361 + 109.105 + 37.682) / 385.159) < 1e-3
    assert Activity.PREPROCESS not in got
    assert not any(f.code == "CPU001" for f in run_rules(_evidence(SYNCS), rules=RULES)[0])


def test_a_by_name_row_beside_a_large_forward_counts_its_own_time_only() -> None:
    """A function named 'preprocess' may call the model: with a forward a tenth of the profile or more, its cumulative
    time is not taken for pre-processing (a deterministic profile has no stacks to tell)."""
    text = """   ncalls  tottime  percall  cumtime  percall filename:lineno(function)
        1    0.500    0.500   10.000   10.000 app.py:10(run_preprocess_and_model)
       10    0.100    0.010    8.000    0.800 /venv/site-packages/torch/nn/modules/module.py:1500(_call_impl)
"""
    got, _ = shares(_profiles(text).result()[0])
    assert got[Activity.PREPROCESS] == 0.05 and got[Activity.FORWARD] == 0.8


def test_of_several_profiles_the_longest_is_read() -> None:
    """A paste before and after a fix, or one profile per worker count: the longest shows the problem."""
    short = GPT2.replace("114.720 seconds", "1.000 seconds").replace("112.449", "0.900")
    ev = _evidence(short + "\n" + SYNCS)
    assert ev.value("cpu.profile_total_s") == 385.159 and "cpu.copy_sync_share" in ev
    assert "cpu.preprocess_share" not in ev


def _shares_of(text: str) -> dict[Activity, float]:
    return shares(_profiles(text).result()[0])[0]


def test_anyones_call_is_no_forward_and_a_stripped_library_is_still_known() -> None:
    """A review's repros: a tokenizer's __call__ is no model forward (its cumulative time threw _tokenize's away); PIL's
    rows after strip_dirs() ('ImageFile.py', the C 'ImagingDecoder') and on Windows' backslashes are PIL's; a
    DataLoader's __next__ waiting on its workers' queue is no pre-processing (only fetch and collate are)."""
    head = "   ncalls  tottime  percall  cumtime  percall filename:lineno(function)\n"
    root = "        1    0.000    0.000  100.000  100.000 app.py:1(main)\n"
    tok = (head + root + "      100    1.000    0.010   90.000    0.900 tokenization_utils_base.py:2790(__call__)\n"
           "      100   85.000    0.850   89.000    0.890 tokenization_gpt2.py:180(_tokenize)\n")
    got = _shares_of(tok)
    assert got[Activity.PREPROCESS] == 0.89 and Activity.FORWARD not in got
    pil = (head + root + "      100    1.000    0.010   58.000    0.580 ImageFile.py:190(load)\n"
           "      100   50.000    0.500   50.000    0.500 {method 'decode' of 'ImagingDecoder' objects}\n")
    assert _shares_of(pil)[Activity.PREPROCESS] == 0.58
    win = head + root + "      100    1.000    0.010   58.000    0.580 C:\\py\\PIL\\ImageFile.py:190(load)\n"
    assert _shares_of(win)[Activity.PREPROCESS] == 0.58
    waiting = (head + root
               + "      150    0.100    0.001  150.000    1.000 /v/torch/utils/data/dataloader.py:629(__next__)\n"
               "      150  149.000    0.993  149.000    0.993 {method 'poll' of 'select.epoll' objects}\n")
    assert Activity.PREPROCESS not in _shares_of(waiting)
