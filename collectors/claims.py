"""What an incident report *says*: quantities tied to concepts, and the framework messages people paste.

Half of what on-call engineers paste is prose around numbers ("prompt eval takes 15 s of 18 s",
"CPU at 100 % and the GPU at 0 %", "16 threads = 0.83 t/s, 7 threads = 6.56 t/s") and the other
half is log lines of frameworks no dedicated parser reads (llama.cpp's layer offload, ONNX Runtime's
provider warnings). This parser reads both by structure, never by one report's wording:

* a **clause** (a sentence, a table row or a log line) is the unit: a quantity belongs to the
  concept named nearest to it in the same clause ("GPU utilization is 20 %", "20 % GPU util"); memory competes
  for a percentage by the same distances, and one it wins is memory's ("GPU memory at 95 %", "50 % memory usage");
* **quantities** are a number with a unit of time, size, share, rate or a counted noun
  (threads, cores, layers, requests, tokens), in English or Chinese;
* **concepts** come from a domain lexicon (``CONCEPTS``): what an inference engineer names when
  describing a bottleneck, each a small set of synonyms, with Chinese where reports use it;
* **framework messages** (``MESSAGES``) are the fixed sentences frameworks print (``offloaded 0/29
  layers to GPU``, ``FP16 is not supported on CPU``, ``Specified provider 'CUDAExecutionProvider'
  is not in available provider names``): recognised by their stable text, whatever surrounds them.

Everything here is what the text claims, not a measurement: the deriver marks it ``low`` quality and
the rules that read it judge with *heuristic* confidence. Pure, stdlib only, streamed line by line.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from diagnose.collectors.linekind import LineKind, inline_command, is_exception_line, is_machine, kind_of, printed_row
from diagnose.collectors.logtext import Keyed
from diagnose.units import unit_bytes

# -- quantities ---------------------------------------------------------------------------------

# a number not glued to an ASCII word or any number ("x86", "Qwen2.5", full-width digits), nor an ordinal ("第3秒",
# the third second); Chinese glues it to its characters: "利用率30%"
NUM = r"(?<![A-Za-z0-9_.第])(?<!\d)(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
_TIME = {
    "ns": 1e-6, "nanoseconds": 1e-6, "us": 1e-3, "µs": 1e-3, "μs": 1e-3, "usec": 1e-3, "microseconds": 1e-3,
    "ms": 1.0, "msec": 1.0, "millisecond": 1.0, "milliseconds": 1.0, "毫秒": 1.0,
    "s": 1e3, "sec": 1e3, "secs": 1e3, "second": 1e3, "seconds": 1e3, "秒": 1e3,
    "min": 6e4, "mins": 6e4, "minute": 6e4, "minutes": 6e4, "分钟": 6e4,
    "h": 3.6e6, "hr": 3.6e6, "hrs": 3.6e6, "hour": 3.6e6, "hours": 3.6e6, "小时": 3.6e6,
}
_RATE = ("tokens/s", "tokens/sec", "token/s", "tok/s", "toks/s", "t/s", "tokens per second", "tokens/second",
         "it/s", "req/s", "requests/s", "rps", "qps", "fps", "infer/sec", "samples/s", "images/s", "img/s")
_COUNT = {
    "thread": "threads", "threads": "threads", "线程": "threads",
    "core": "cores", "cores": "cores", "cpus": "cores", "vcpus": "cores", "vcpu": "cores", "核": "cores",
    "layer": "layers", "layers": "layers",
    "request": "requests", "requests": "requests", "reqs": "requests", "req": "requests", "请求": "requests",
    "concurrent": "concurrency", "concurrency": "concurrency", "并发": "concurrency", "clients": "concurrency",
    "users": "concurrency",
    "token": "tokens", "tokens": "tokens", "tok": "tokens", "k tokens": "ktokens", "token数": "tokens",
    "process": "processes", "processes": "processes", "workers": "workers", "worker": "workers",
    "replicas": "replicas", "replica": "replicas", "instances": "instances", "instance": "instances",
    "gpus": "gpus", "gpu": "gpus", "images": "images", "frames": "frames", "kernels": "kernels",
}


def _alt(words: list[str] | tuple[str, ...]) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


_QTY = re.compile(
    NUM + r"\s?(?:"
    rf"(?P<rate>{_alt(_RATE)})"
    r"|(?P<pct>%|percent)"
    rf"|(?P<size>(?:[KMGT]i?B|bytes|[GM])(?![a-zA-Z]))"
    # (a time written as an adjective, glued: "a 10-minute CUDA Graph capture", "a 1.07-second compile"; not a flag's
    # "-n 128 -s 42" nor "8-H100"; a unit before a digit is a name's: "8 H100")
    rf"|(?:(?<=\d)-(?=[a-z]{{3}}))?(?P<time>(?:{_alt([k for k in _TIME if k.isascii()])})(?![a-zA-Z/\d])"
    r"|毫秒|秒|分钟|小时)"
    r"|(?:(?:input|output|prompt|new|generated|context|concurrent|parallel|simultaneous|physical|logical|cpu|gpu"
    r"|worker|model|total|active|running|waiting|pending|queued)\s+)?"
    rf"(?P<count>(?:{_alt([k for k in _COUNT if k.isascii()])})(?![a-zA-Z])|线程|核|请求|并发)"
    r")",
    re.IGNORECASE,
)
_X = re.compile(NUM + r"\s?(?:x|×|times)(?![a-zA-Z])", re.IGNORECASE)  # "40x longer", "3.5 times"
_ZERO = re.compile(r"\b(?:zero|nothing|none)\b", re.IGNORECASE)  # "GPU utilization is always zero"
# a bare integer right after a length/count word: "输入长度 1200", "prompt length: 4096", "n_threads = 16"
_BARE = re.compile(r"(?:length|长度|size|count|num_\w+|n_\w+|threads|parallel|concurrency|并发|-t|-np)\s*[:=：]?\s*"
                   r"(\d{1,3}(?:,\d{3})+|\d+)(?![\d.%\w])", re.IGNORECASE)


@dataclass(frozen=True)
class Quantity:
    """A number with its dimension and value in the base unit (ms, bytes, %, per second, count)."""

    dim: str  # time | size | pct | rate | count:<noun> | factor
    value: float
    start: int
    end: int
    text: str


# a range's first end, the percent after its second: "between 0 and 100%", "from 20 to 40%" ("80-90%" is one figure,
# about 85, as people write it)
_PCT_RANGE = re.compile(r"\bbetween\s+(\d{1,3}(?:\.\d+)?)\s+and\s+\d{1,3}(?:\.\d+)?\s*%"
                        r"|\bfrom\s+(\d{1,3}(?:\.\d+)?)\s+to\s+\d{1,3}(?:\.\d+)?\s*%")


def quantities(clause: str) -> list[Quantity]:
    """Every quantity in ``clause``, in order."""
    out: list[Quantity] = []
    for m in _QTY.finditer(clause):
        try:
            n = float(m.group(1).replace(",", ""))
        except ValueError:
            continue
        if m.group("rate"):
            out.append(Quantity("rate", n, m.start(), m.end(), m.group(0)))
        elif m.group("pct"):
            out.append(Quantity("pct", n, m.start(), m.end(), m.group(0)))
        elif m.group("size"):
            out.append(Quantity("size", n * (unit_bytes(m.group("size")) or 1), m.start(), m.end(), m.group(0)))
        elif m.group("time"):
            unit = m.group("time").lower()
            out.append(Quantity("time", n * _TIME.get(unit, 1e3), m.start(), m.end(), m.group(0)))
        elif m.group("count"):
            noun = _COUNT.get(m.group("count").lower(), m.group("count"))
            out.append(Quantity(f"count:{noun}", n, m.start(), m.end(), m.group(0)))
    if "util" in clause.lower() or "usage" in clause.lower():
        for m in _ZERO.finditer(clause):
            out.append(Quantity("pct", 0.0, m.start(), m.end(), m.group(0)))
    if "%" in clause:  # a range's first end shares the second's percent: "switching between 0 and 100%" (NVIDIA/DALI)
        taken = [(q.start, q.end) for q in out]
        for m in _PCT_RANGE.finditer(clause):
            g = 1 if m.group(1) is not None else 2
            if not any(a <= m.start(g) < b for a, b in taken):
                out.append(Quantity("pct", float(m.group(g)), m.start(g), m.end(g), m.group(g)))
    for m in _X.finditer(clause):
        try:
            out.append(Quantity("factor", float(m.group(1).replace(",", "")), m.start(), m.end(), m.group(0)))
        except ValueError:
            continue
    taken = [(q.start, q.end) for q in out]
    for m in _BARE.finditer(clause):
        if not any(a <= m.start(1) < b for a, b in taken):
            out.append(Quantity("bare", float(m.group(1).replace(",", "")), m.start(1), m.end(1), m.group(1)))
    out.sort(key=lambda q: q.start)
    return out


# -- concepts -------------------------------------------------------------------------------------

# name → synonyms (regex alternatives, case-insensitive). Each is what an inference engineer would
# call the thing; the rules decide what a combination of them means.
# an item's number, not a length: "prompt 0", "prompt #12" (a length carries its unit: "prompt 8192 tokens", "8k")
_ITEM_NO = r"\d+(?![\d.,]*\s*(?:k\b|K\b|tok|%))"
CONCEPTS: dict[str, str] = {
    "gpu_util": r"gpu[- ]?util\w*|gpu usage|gpu load|gpu activity|gpu busy|sm util\w*|volatile gpu-util"
                r"|cuda (?:usage|util\w*|load)\b"
                # "GPU is at 40 %", "GPU sits at 99%" (never "GPU memory usage is 98%": memory's percentage)
                r"|\bgpus?\b(?= (?:(?!mem\w*\b|vram\b|ram\b|显存)\w+ ){0,2}(?:is |was |at |of |stays |sits |only "
                r"|around |about |~|barely |reaches |peaks at |uses )*~?\d{1,3}(?:\.\d+)? ?%)"
                r"|gpu 利用率|gpu利用率|gpu占用|gpu 占用|显卡利用率|gpu使用率",
    "cpu_util": r"cpu[- ]?util\w*|cpu usage|cpu load|cpu (?:is |was )?pinned|cores? (?:at|pinned|pegged)"
                r"|\bcpus?\b(?= (?:\w+ ){0,2}(?:is |was |at |of |stays |sits |only |around |about |~|goes |spikes? "
                r"|up |to |reaches |peaks at |runs at |uses )*~?\d{1,3}(?:\.\d+)? ?%)"
                r"|cpu使用率|cpu占用|cpu 占用|cpu利用率",
    "gpu": r"\bgpus?\b|\bcuda\b|显卡|\bvram\b",
    # the reporter's machine has no GPU ("my i5 laptop (no NVIDIA card)", "a CPU-only server"): a GPU named elsewhere in
    # the text is one asked about, not one in the picture (rules only: ``gpu_in_view``)
    # (not a GPU's use or state: "no GPU usage", "no GPU memory left", "no GPU found", "don't have any GPUs free")
    "no_gpu": r"\b(?:no (?:nvidia |dedicated |discrete |cuda[- ]capable )?"
              r"|(?:i|we) do(?:n'?t|n’t| not) have (?:a |any )?)"
              r"(?:gpus?|graphics cards?|video cards?|nvidia cards?)\b(?![ \t]*(?:usage|utili[sz]ation|memory|vram"
              r"|found|detected|acceleration|offload\w*|load|free|available|with|that|for|left|in use|support|access"
              r"|time))"
              r"|\bcpu[- ]only (?:machine|laptop|server|host|box|system|pc|computer|instance|node|vm)\b",
    "cpu": r"\bcpus?\b|processor",
    "vram": r"vram|gpu memory|gpu mem\b|device memory|显存|memory[- ]usage"
            r"|(?:takes?|uses?|using|occup\w*|consum\w*|eats?)(?: up)? (?:about |around |~)?[\d.]+ ?[gm](?:i?b)? "
            r"(?:of )?(?:the |my )?(?:gpu|vram|memory|显存)",
    "ttft": r"\bttft\b|time[- ]to[- ]first[- ]token|first[- ]token|首token|首字|首个token|首 token|首包",
    # (a numbered prompt is an item of a run, "Finished processing prompt 0 … seconds elapsed in total for this
    # prompt": its whole generation, no prefill)
    "prefill": r"prefill|prompt processing|prompt eval\w*|processing prompt(?!s?\s*(?:#|no\.?\s*)?" + _ITEM_NO + ")"
               r"|prompt process\w*|\bpp\d+\b"
               r"|process(?:es|ing)? (?:the )?prompt(?!s?\s*(?:#|no\.?\s*)?" + _ITEM_NO + r")"
               r"|context processing|预填充",
    # (speculative decoding names a method, not the decode phase)
    "decode": r"(?<!speculative )(?<!spec )\bdecod\w*"
              r"|generation speed|token generation|\btg\d+\b|\beval time\b|generat\w* (?:speed|rate)"
              r"|tokens? per second|\btpot\b|\bitl\b|inter[- ]token",
    # ("input size" alone is an image's or a tensor's as often: pytorch#2759, keras-retinanet#91)
    "prompt_len": r"prompt (?:length|size|of)|input (?:length|tokens?|contexts?)|context (?:length|size)"
                  r"|tokens? (?:context|prompt|input)s?\b|long (?:prompt|"
                  r"context|input)|输入长度|上下文|长文本|input sequence length|prompt tokens|\bisl\b",
    "queue": r"\bqueu\w*|\bpending\b|\bwaiting\b|排队|等待",
    "sequential": r"\bsequentially\b|sequential (?:processing|execution|order|manner|requests)|one (?:by|after) "
                  r"(?:one|another)|one at a time|\bserial(?:ly|ized|ised)\b|execute[sd]? serially"
                  r"|in series|1 by 1|waits? (?:until|for) the (?:first|previous|other)|blocked until"
                  r"|not (?:processed|handled|served) (?:concurrently|in parallel|simultaneously)|串行|逐个|依次",
    "concurrency": r"concurren\w*|in parallel|simultaneous\w*|parallel requests|--parallel|\bslots?\b|并发"
                   r"|\b(?:multiple|several|many) (?:requests|calls|clients|users)\b",
    "capacity_cap": r"max[_-]num[_-]seqs|max[_-]batch[_-]size|max[_-]running[_-]requests|max[_-]concurrent\w*"
                    r"|instance[_ ]count|num[_-]?workers?|--parallel|n_parallel|\b-np\b|max_batch_total_tokens",
    "threads": r"\bthreads?\b|n_threads|num_threads|--threads|\b-t \d|omp_num_threads|mkl_num_threads"
               r"|intra[_-]?op|inter[_-]?op|set_num_threads|线程",
    "cores": r"\bcores?\b|logical (?:cpus?|processors?)|vcpus?|hyperthread\w*|\bsmt\b|核",
    "quota": r"cpu (?:limit|quota|request)s?|--cpus\b|cfs|cgroup|cpu throttl\w*|throttled|limits?\.cpu"
             r"|resources: ?limits",
    "contention": r"contention|oversubscri\w*|compet\w* for|too many threads|thread thrash\w*|spin[- ]?wait",
    "preprocess": r"pre[- _]?process\w*|preproc\w*|image decod\w*|decode image|jpeg|resiz\w*|normali[sz]\w*"
                  r"|tokeni[sz]\w*|data ?load\w*|image processor|processor\b|前处理|预处理",
    "postprocess": r"post[- _]?process\w*|postproc\w*|\bnms\b|detokeni[sz]\w*|decode_labels|后处理",
    "serialize": r"seriali[sz]\w*|deseriali[sz]\w*|json\.(?:dumps|loads)|protobuf|tolist\(\)|base64",
    "model_time": r"inference time|model time|forward(?: pass)?(?: time)?|\bnet\b|network time|gpu time"
                  r"|engine time|execute time|compute time|infer time|推理(?:时间|耗时)?",
    # compiling at run time (JIT, engine builds, graph capture, warm-up), not building the software
    "compile": r"torch\.compile|recompil\w*|compil(?:ation|ing|es)\b(?! (?:from source|with |it |the (?:library|"
               r"package|code|binding|project)))|compile[- ]?time|graph capture"
               # a compile as a noun, of something ("a 1.07-second serving-time compile of `…_fwd_kernel`")
               r"|\bcompile of\b(?![^.;]{0,40}\bfrom source)(?! (?:llama\.cpp|the (?:library|package|code|binding"
               r"|project)))"
               r"|(?<!nsys )(?<!profiler )(?<!profile )(?<!kineto )trace capture|captur\w* (?:cuda )?graphs?"
               r"|cuda ?graph capture|warm-?up\w*"
               r"|engine (?:build\w*|generation)|build\w* (?:the |an? )?(?:tensorrt |trt )?engine"
               # (not "JIT" alone: a technique named, "the fused kernel produced by JIT runs slower" (pytorch#45604),
               # not time spent compiling; "JIT compilation", "jit compiling" are read by their compiling)
               r"|autotun\w*|trac(?:e|ing) the model|编译",
    "recompile": r"recompil\w*|cache_size_limit|recompile_limit|guard fail\w*|graph break\w*|new shapes?|"
                 r"dynamic shapes?|shape changes?|regenerat\w* (?:the )?(?:engine|cache)",
    # (a short name between: "the first C4 request", "the first 8 requests"; "first-batch")
    "first": r"(?:the |a )?first[ -](?:(?-i:[A-Z0-9][\w.]{0,5}) )?(?:request|inference|call|run|time|iteration|image"
             r"|batch"
             r"|query|generation|prediction|forward|few|search|prompt|completion)s?|cold[- ]?start"
             r"|initial (?:requests?|images?|inferences?|calls?)|after (?:a )?(?:restart|deploy\w*|idle|delay)"
             r"|首次|第一次",
    "subsequent": r"subsequent|following|after (?:that|the first|warm)|(?:second|2nd|next) (?:request|inference|"
                  r"call|run|time)|later (?:requests?|calls?|runs?)|from (?:then|there) ?on|steady|warm|之后|后续",
    # (an engine's eager mode enforced, not PyTorch's "eager mode" alone: the default that TorchScript, torch.compile
    # and a model server are set against, "TorchServe slower than Eager inference", pytorch/serve#1120)
    "cuda_graph": r"cuda ?graphs?|cudagraphs?|enforc\w*[ _-]eager|--enforce-eager|graph replay"
                  r"|use_cuda_graph|disable[_-]cuda[_-]graph",
    # CUDA graphs said to be on: captured, enabled, in use (no sign of eager mode's launch path)
    "cuda_graph_on": r"cuda ?graphs? (?:are|were|is|was|get|got) (?:being )?"
                     r"(?:captured|enabled|on|used|in use|replayed)\b"
                     r"|\b(?:captured|enabled) (?:the )?cuda ?graphs?\b|cuda ?graphs? captured\b"
                     # their capture (at start-up) timed: "CUDA Graph Capturing time", "the capture time of cuda graph"
                     r"|cuda ?graphs? captur(?:e|ing) (?:time|took|takes|duration)"
                     # the capture as a phase, at start-up ("During CUDA Graph Capture", "a 10-minute CUDA Graph capture
                     # process"): graphs being made, no eager mode
                     r"|(?:during|until) (?:the )?cuda ?graphs? captur(?:e|ing)\b"
                     r"(?![^.;]{0,30}\b(?:off|disabled|skipped|removed))"
                     r"|cuda ?graphs? captur(?:e|ing) (?:process|phase|step)"
                     r"|captur(?:e|ing) (?:time|duration) (?:of|for) (?:the )?cuda ?graphs?\b",
    "launch": r"kernel launch\w*|cudalaunchkernel|hiplaunchkernel|launch overhead|launch latency|python overhead"
              r"|dispatch overhead|host overhead|cpu[- ]bound|cpu overhead|kernels? per (?:token|step)|tiny kernels"
              r"|small kernels|single[- ]core (?:performance|speed|bound)|single[- ]thread(?:ed)? (?:performance|speed)"
              r"|one (?:cpu )?core (?:at|is at|consistently|stays|pegged)",
    # the CPU named as the limit (the rules decide whether it is launching kernels or preparing input)
    "cpu_bound": r"depends? (?:heavily |strongly |really )?on (?:the )?(?:cpu|processor)|cpu[- ](?:bound|limited)"
                 r"|limited by (?:the )?cpu|bottleneck(?:ed)? (?:by|on) (?:the )?cpu|cpu (?:is )?(?:the )?bottleneck"
                 r"|cpu bottleneck",
    # a number that stopped following the load: "remains fixed at 32 regardless of concurrency"
    "capped": r"(?:stays?|remains?|stuck|fixed|capped|limited|plateau\w*|saturat\w*|never (?:goes|exceeds))"
              r" (?:at|to|around|below|above)?\s*(?=\d)|regardless of (?:further )?(?:increases? in )?(?:the )?"
              r"(?:concurrency|load|requests)|(?:doesn'?t|does not|didn'?t|no) (?:scale|improve|increase) (?:with|as)"
              r"|reduced from (?:requested )?\d+ to \d+|不提升|没有提升|不变",
    # the reporter naming a cause: what follows is what they measured or concluded
    "causal": r"\bdue to\b|caused by|because of|is the bottleneck|bottleneck (?:is|was|(?:appears|seems) to be|"
              r"lies in)|(?:is|are) best explained by|spends? (?:most|\d+ ?%)"
              r" of (?:its |the )?time (?:in|on)|most of the time (?:is|goes)|dominat\w*|the culprit|root cause",
    # what grows a runtime peak: the input's size
    "input_size": r"resolution|image size|\d{3,5} ?[x×*] ?\d{3,5}|(?:long|longer|large|larger|big|bigger|huge) "
                  r"(?:inputs?|images?|videos?|audio|prompts?|contexts?|sequences?|batch(?:es)?|documents?|requests?)"
                  r"|batch[_ ]?size|sequence length|context length|max[_-]model[_-]len|n_ctx|num[_-]?frames|frames"
                  # an engine's size limits: what it sizes its activations, KV cache and graphs by (TensorRT-LLM's
                  # build-time max_input_len, vLLM's max_num_seqs / max_num_batched_tokens, TGI's max_total_tokens)
                  r"|max[_-](?:input|seq(?:uence)?|total|prefill|num[_-]seqs|num[_-]batched|batch(?:[_-](?:total|prefill))?"
                  r"|position)(?:[_-](?:len(?:gth)?|size|tokens|embeddings))?(?![\w-])"
                  r"|vae (?:decode|decoding)|decode the (?:vae|latents?)|tiled|\d+ ?(?:min|minutes?|s|seconds?) "
                  r"(?:of )?(?:audio|video)|超分|分辨率",
    "copy": r"memcpy\w*|\bhtod\b|\bdtoh\b|\bh2d\b|\bd2h\b|host[- ]to[- ]device|device[- ]to[- ]host|pin_?memory"
            # "pinned" memory, not a figure held ("cores pinned at 100%", "stays pinned until"), a place ("pinned in
            # forward", "pinned to core 0") or a fixed reference ("the pinned prefill values", "pinned versions")
            r"|pinned(?![ \t]+(?:at|to|until|down)\b)"
            r"(?![ \t]+(?:in|on|by)\b(?![ \t]+(?:the[ \t]+)?(?:host|cpu|ram|system|page|memory|cuda)))"
            r"(?![ \t]+(?:(?!memory\b)[\w-]+[ \t]+)?(?:values?|baselines?|versions?|numbers|figures"
            r"|commits?|dependenc\w*|deps)\b)|pageable"
            r"|\.cpu\(\)|\.cuda\(\)|\.to\(['\"]?(?:cuda|cpu)|\.item\(\)|\bpcie\b|data transfer"
            r"|transfer time|copy time|copies|cpu offload\w*|offload\w* to (?:the )?cpu|swap(?:ping)? to cpu",
    "pcie_link": r"link (?:width|speed|gen)|lnksta|lnkcap|\bx(?:1|4|8|16)\b"
                 r"|pcie ?(?:gen ?)?[1-5](?:\.0)?(?![.\d])(?!\s*[GMK]i?B)|riser",
    "placement_cpu": r"(?:runs?|running|ran|executed?|falls? back|fell back|stuck|only) (?:entirely |only |all )?"
                     r"on (?:the )?cpu|cpu[- ]only|not (?:using|use|utili[sz]ing) (?:the )?gpu(?!\w)(?!"
                     # a degree, not the device ("not utilizing the GPU nearly as much as the tensorflow version",
                     # ray#6962; "not utilized fully"): the GPU runs it, less busy
                     r" (?:nearly|as much|fully|efficiently|enough|well|properly|much|more|to (?:its|the) full))"
                     r"|gpu (?:is |was )?not (?:used|utili[sz]ed|being used)(?!\w)(?! (?:nearly|as much|fully"
                     r"|efficiently|enough|well|properly|much|more|to (?:its|the) full))"
                     r"|doesn'?t use (?:the )?gpu|does not use (?:the )?gpu"
                     r"|no gpu usage|without (?:the )?gpu|device[=:] ?['\"]?cpu|torch\.device\(['\"]cpu"
                     r"|\.to\(['\"]cpu['\"]\)|cpuexecutionprovider|cuda(?:\.is_available\(\))? (?:is )?(?:not "
                     r"available|false)|is_available\(\) (?:returns? )?false|没有使用gpu|没用gpu|只用cpu"
                     r"|not (?:\w+ )?(?:loaded|moved|put|placed|sent)(?: \w+)? (?:in)?to (?:the )?[`'\"]?(?:cuda|gpu)",
    "wrong_gpu": r"wrong (?:gpu|device|card)|(?:another|other|different|second) (?:gpu|card)(?! memory)"
                 r"|gpu \d instead|instead of (?:the )?(?:gpu|cuda:?\d)"
                 r"|(?:ignor\w*|overrid\w*|not respect\w*|not honou?r\w*) cuda_visible_devices"
                 r"|cuda_visible_devices (?:is |was )?(?:ignored|not (?:respected|working|honou?red))"
                 r"|(?:index|order|enumeration) mismatch|mismatch\w* (?:index|order)",
    # the report withdrawing itself: a false alarm, the reporter's own mistake, behaviour by design
    # ("not a bug per se": a hedge, the behaviour stands)
    "retracted": r"false alarm|not a (?:server |real |\w+ )?(?:issue|bug|problem) after all|not an? (?:server |real )?"
                 r"(?:issue|bug)\b(?! with)(?!\W{0,3}per[- ]?se\b)|my (?:own )?(?:mistake|bad|fault)|user error"
                 r"|works as (?:intended|expected|designed)|methodology artifact"
                 r"|artifact of (?:the|my) (?:benchmark|measurement|setup)"
                 r"|(?:solved|resolved|fixed) it myself|never mind|nevermind",
    "offload": r"offload\w*|device_map|n[_-]gpu[_-]layers|-ngl\b|--n-gpu-layers|gpu layers|partial(?:ly)? offload",
    # the GPU held below its clocks (a power draw below the limit is not throttling: the GPU is idle)
    "throttle": r"throttl\w*|power cap|power brake|sw power cap|hw slowdown|thermal\w*|\d{2,3} ?°c\b|overheat"
                r"|gpu temp\w*|clocks? (?:drop|down|low|fall|fell)|low clocks?|downclock\w*|heat[- ]soak\w*"
                r"|power mode|nvpmodel|jetson_clocks|fans? (?:to|at|on|running at) (?:full|max\w*|100)|full blast"
                r"|fan (?:speed|control|curve)",
    "saturated": r"(?:gpu|util\w*|usage) (?:is |was |at |of |stays? |sits? )?(?:near |around |about )?(?:full|100 ?%|"
                 r"maxed|saturated|pegged)|fully (?:utili[sz]ed|loaded)|compute[- ]bound|flops?[- ]bound",
    "slow_gpu_model": r"\b(?:p40|p100|p4|k80|m60|m40|t4|gtx ?10\d0|gtx ?9\d0|jetson|xavier|orin|nano|tx2)\b",
    # "half" as the precision, not an amount ("half a second", "half of the time")
    "fp16": r"fp16|half precision|float16|\bhalf\b(?!\s+(?:a|an|the|of|as|my|our|its|their|that|this|what|hours?"
            r"|seconds?|minutes?|days?|way|done|full|empty|as)\b)(?![ -]?(?:hour|second|minute|day))",
    # GPUs whose FP16 is no faster than FP32 (the CUDA guide's arithmetic throughput per compute capability): Pascal
    # but GP100 (6.1: GTX 10xx, Titan X/Xp, Tesla P4/P6/P40, Quadro P-series at 1/64 rate), Maxwell and Kepler parts
    # (no FP16 arithmetic: K80, K40m, M40, GRID K520, GTX 9xx/7xx, Titan Black). Not the P100 (6.0), the Jetson
    # TX1/Nano and TX2 (5.3, 6.2), nor Turing onwards (7.x: twice FP32's rate, GTX 16xx and MX450 too)
    "slow_fp16_gpu": r"(?<![\w-])(?:(?:tesla|nvidia|quadro) )?(?:k80|k40m?|k20x?m?|m40|m60|m10|m6|m4)(?![\w-])"
                     r"|(?<![\w-])(?:tesla|nvidia) p(?:40|6|4)(?![\w-])|(?<![\w-])quadro (?:p|m|k)\d{3,4}(?![\w-])"
                     r"|(?<![\w-])p(?:6000|5000|4000|2200|2000)(?![\w-])|\b(?:gtx|gt) ?(?:10[3-8]0|9[5-8]0m?|7[1-8]0)"
                     r"(?: ?ti)?\b|\btitan ?(?:xp?|black)\b|\bgtx titan\b|\bmx ?[1-3][1-5]0\b|\bgrid k\d{3}\b",
    "oom": r"\boom\b|out of memory|outofmemory|cuda error: out of memory|显存不足|内存不足|显存溢出|内存溢出|爆显存"
           # the C++ runtime's and the OS' words for an allocation refused (std::bad_alloc's "bad allocation" on
           # Windows, ENOMEM's "Cannot allocate memory"), and memory or the commit limit run out
           r"|std::bad_alloc|\bbad allocation\b|cannot allocate memory|commit limit"
           r"|exhaust(?:s|ed|ing)? (?:the )?(?:system |host |gpu |device )?(?:memory|ram|vram|commit)\b",
    "preallocate": r"pre-?allocat\w*|gpu_memory_utilization|gpu-memory-utilization|mem[_-]fraction\w*"
                   r"|cuda-memory-fraction|kv cache (?:pre)?allocat\w*|reserv\w* (?:all|most|\d+ ?%)|fills? (?:up )?"
                   r"(?:all|the (?:entire|whole)) (?:gpu )?memory|(?:takes|uses|eats|occupies|fills?|consumes?)"
                   r" (?:up )?(?:all|almost all|most|\d+ ?%) (?:of )?(?:the )?(?:gpu|vram|memory)",
    "loading": r"load(?:ing|s)? (?:the |a |my )?(?:\w+ )?(?:model|weights|checkpoint|shards?)|model load\w*"
               r"|from_pretrained|failed to load|could not load|while loading|when loading|加载模型|模型加载",
    "download": r"download\w*|fetching (?:the )?(?:model|weights)|pulling (?:the )?model|from the hub|hf_hub",
    "keep_alive": r"keep[_-]?alive|stays? loaded|still loaded|model (?:is )?(?:kept|stays|remains) (?:loaded|in memory)"
                  r"|doesn'?t unload|does not unload|not unloaded"
                  r"|still (?:has|have|holds?) (?:the )?model (?:loaded|in)",
    # memory held outside the failing process: leftovers, other tenants, a second instance
    "held_elsewhere": r"orphan\w*|zombie|(?:stale|leftover|left-over) (?:process\w*|workers?|contexts?)|surviv\w*"
                      r"|(?:after|despite) (?:the )?(?:process|container|pod|server|job) (?:was |is |has been )?"
                      r"(?:killed|stopped|removed|exited|ended|gone|inactive)|(?:another|other|second|2nd|multiple|two"
                      r"|several) (?:process\w*|instance\w*|server\w*"
                      r"|models?|containers?|deployments?|tenants?|engines?|jobs?|users?|pods?|workers?|apps?)"
                      r"|shared (?:gpu|server|machine|node)|held by|occupied by|used by (?:another|other)"
                      # several of anything started on one device ("initializing multiple LLM classes simultaneously on
                      # the same GPU", vllm#9198): each holds its own weights and cache beside the others'
                      r"|(?:multiple|several|many|two|three|four) (?:[\w-]+ ){0,3}?(?:llms?|models?|instances?|engines?"
                      r"|process(?:es)?|workers?|replicas?|servers?|copies|classes|services?|containers?|jobs?"
                      r"|pipelines?|sessions?|apps?|applications?) (?:simultaneously |concurrently |at once "
                      r"|in parallel )?on (?:the same|one|a single|a shared|single) (?:\w+ )?(?:gpus?|cards?"
                      r"|devices?)\b"
                      r"|kill -9|no processes? (?:found|running|listed)"
                      r"|processes? (?:is |are )?not (?:shown|visible|listed)"
                      # the same in Chinese reports: another/existing process, two or more instances, a shared card
                      r"|(?:其他|其它|另一个|另外的?|别的|已有)进程|(?:多个|两个)[^\s，。,;；]{0,8}?实例|共卡"
                      r"|共享(?:设备|显卡|GPU|NPU)(?!内存|显存)",  # not Windows' "shared GPU memory" (host RAM)
    "slow": r"\bslow\w*|takes? (?:a )?long|too long|latency|\blag\w*|delay\w*|hang\w*|stuck|degrad\w*|regress\w*"
            r"|very high|慢|耗时",
    # memory growing over time or requests (a "memory leak?" question alone is not growth)
    # (llama.cpp#23446: "vram usage gradually increasing each run until OOM")
    # (memory rising with one input's size is its peak, not growth: "memory usage increases linearly with batch size")
    "memory_grows": r"(?:memory|vram)(?: usage)? (?:keeps? |kept |gradually |steadily |slowly |continuously "
                    r"|constantly )?(?:grow\w*|increas\w*|creep\w*|climb\w*)(?!\w)"
                    r"(?! (?:linearly |quadratically )?with (?:the )?(?:(?:larger|longer|bigger|more|higher) "
                    r"|(?:the )?number of )?(?:batch|input|sequence|seq|context|resolution|image|prompt|length|token))"
                    r"|grows? (?:with|over|per|after) "
                    r"(?:each |every )?(?:request|call|inference|batch|iteration|step|generation)|keeps? (?:growing|"
                    r"increasing|climbing)"
                    r"|increas\w* (?:with|over|per|after) (?:each |every )?(?:request|call|inference)",
    "empty_cache": r"empty_cache|gc\.collect|expandable_segments|max_split_size_mb|fragment\w*",
    "batch": r"batch[_ ]?size|\bbs\s?=|\bbatch(?:es|ing)?\b|批",
}
# ASCII word boundaries: Chinese prose glues English words and numbers to its characters ("显存溢出OOM",
# "使用GPU运行"), and with Unicode's \b there is no boundary between 出 and O
_CONCEPT_RX = {name: re.compile(rx, re.IGNORECASE | re.ASCII) for name, rx in CONCEPTS.items()}

# the kinds of quantity a concept can own (a concept not listed owns any): "8000 input tokens takes
# 60 seconds before the first token" binds the tokens to the prompt and the seconds to the first token
_TIMES = ("time", "factor")
ACCEPTS: dict[str, tuple[str, ...]] = {
    "gpu_util": ("pct",), "cpu_util": ("pct",),
    "prompt_len": ("count:tokens", "count:ktokens", "bare"),
    "ttft": _TIMES, "queue": ("time", "count:requests", "count:concurrency"),
    "threads": ("count:threads", "count:cores", "rate", "bare"), "cores": ("count:cores", "count:threads", "bare"),
    "concurrency": ("count:concurrency", "count:requests", "bare", "time"),
    "compile": _TIMES, "recompile": _TIMES, "first": _TIMES, "subsequent": _TIMES,
    "preprocess": ("time",), "postprocess": ("time",), "model_time": ("time",), "copy": ("time", "size", "rate"),
    "decode": ("time", "rate"), "prefill": ("time", "rate", "count:tokens", "count:ktokens"),
}

# -- framework messages (fixed sentences, whatever surrounds them) --------------------------------
_OFFLOADED = re.compile(r"offload(?:ed|ing)\s+(\d+)\s*/\s*(\d+)\s+(?:repeating\s+)?layers\s+to\s+GPU", re.I)
_OFFLOADING = re.compile(r"offloading\s+(\d+)\s+(?:repeating\s+)?layers\s+to\s+GPU", re.I)
MESSAGES: dict[str, re.Pattern[str]] = {
    # the work runs on the CPU although a GPU was asked for
    "cpu_fallback": re.compile(
        r"FP16 is not supported on CPU"
        r"|Specified provider '(?:CUDA|Tensorrt|ROCM|DML)ExecutionProvider' is not in available provider"
        # ONNX Runtime's python binding could not create the GPU provider and the session runs on the CPU
        # (onnxruntime_pybind_state.cc CreateExecutionProviderInstance; not TensorRT's or MIGraphX's, whose
        # failure leaves CUDA's or ROCm's)
        r"|Failed to create (?:CUDA|ROCM|DML)ExecutionProvider"
        r"|Available providers: \[?'?(?:Azure|CPU)ExecutionProvider'?(?:, ?'?(?:Azure|CPU)ExecutionProvider'?)*\]?\s*$"
        r"|\bBLAS\s*=\s*0\b"
        r"|runners=\[cpu\]|no compatible GPUs were discovered|library=cpu\b|no GPU detected"
        r"|CUDA (?:is )?not available|Torch not compiled with CUDA enabled|cuda\.is_available\(\)\s*(?:returns?\s*)?"
        r"(?:->|=+|is|:)?\s*False|torch\.cuda\.is_available\(\)\s*\n?False"
        # (a program's line: after its log level or tag ("… - INFO - Using CPU", "WARNING: Running on CPU", "[easyocr]
        # Using CPU"), or the whole line, or the sentence opening it ("> Using CPU", yolov3's; easyocr's "Using CPU.
        # Note: This module is much faster with a GPU."); a person's "I test that inference using cpu as below:"
        # compares (ultralytics#17799), and "Running on CPU, each image takes 400 ms" is their statement)
        r"|using device:? cpu\b|device:? cpu\b(?! offload)"
        r"|(?:(?-i:\b(?:INFO|WARNING|WARN|DEBUG|NOTICE)\b)[\s:|\]-]*|\]\s*)(?-i:Using CPU|Running on CPU)\b"
        r"|^\W{0,4}(?-i:Using CPU|Running on CPU)(?:\.(?:\s|$)|\s*$)"
        r"|using CPU instead\b"
        r"|n_gpu_layers\s*=\s*0\b"
        r"|ggml_cuda_init: failed|no CUDA-capable device|CUDA driver version is insufficient"
        r"|cannot find (?:a )?(?:compatible )?GPU|GPU not found|falling back to CPU|fall(?:s|ing)? back to cpu"
        # transformers' pipeline given no device on a machine with one: "Hardware accelerator e.g. GPU is available in
        # the environment, but no `device` argument is passed to the `Pipeline` object. Model will be on CPU."
        r"|GPU is available in the environment, but no .?device.? argument|Model will be on CPU"
        # a CPU-only torch wheel in an environment banner or version print ("Ultralytics YOLOv8.0.54 Python-3.10.6
        # torch-2.0.0+cpu CPU", "torch 1.10.0+cpu", "2.1.0+cpu"): that torch has no CUDA to run on
        r"|\btorch[-= :]*v?\d+\.\d+(?:\.\d+)?\+cpu\b",
        re.I),
    # TensorFlow could not load a CUDA runtime library its GPU device needs (stream_executor's dso_loader.cc: "Could
    # not load dynamic library 'libcudart.so.10.1'; dlerror: …"; TensorRT's libnvinfer is optional and not it) and,
    # from 2.4, registers no GPU ("Cannot dlopen some GPU libraries. … Skipping registering GPU devices..."). It is
    # TensorFlow's own device only: transformers imports TensorFlow where it is installed, and a PyTorch engine's log
    # carries the same lines while its GPU works (PLC001 reads them where no other engine is named)
    "tf_gpu_libs": re.compile(
        r"Could not load dynamic library '(?:lib)?cu(?:dart|blas|dnn|fft|rand|solver|sparse)[^']*'"
        r"|Cannot dlopen some GPU libraries|Skipping registering GPU devices", re.I),
    # ONNX Runtime put part of the graph on the CPU and inserted copies between providers
    "ep_memcpy": re.compile(r"(\d+) Memcpy nodes are added to the graph|Some nodes were not assigned to the "
                            r"preferred execution providers", re.I),
    # ONNX Runtime's GPU provider has no kernel for an op and leaves its node to the CPU provider: the CUDA / ROCm
    # provider's GetCapability warning "CUDA kernel not supported. Fallback to CPU execution provider for Op type:
    # Conv node name: …" (its RNN and Conv checks print the last part alone), at verbose logging "CUDA kernel not
    # found in registries for Op type: GridSample node name: …" (webgpu, js, … the same)
    "ep_cpu_node": re.compile(r"\bFallback to CPU execution provider for Op type:\s*\w+"
                              r"|\b\w+ kernel not found in registries for Op type:\s*\w+"),
    # a recompile / guard-failure message of any torch generation
    "recompile_limit": re.compile(
        r"hit (?:config\.)?(?:recompilation cache limit|cache_size_limit|recompile_limit)\s*\(?(\d+)?"
        r"|torch\._dynamo hit config\.\w+limit|recompilation cache limit \((\d+)\)", re.I),
    "engine_build": re.compile(
        r"Building (?:a new )?(?:TensorRT |TRT )?engine|engine (?:build|building) (?:took|time)"
        r"|Building the TensorRT engine"
        r"|\[TRT\].*(?:Building|Total Time|engine generation)|Capturing (?:CUDA|cuda) graphs?"
        r"|Capturing batches|Graph capturing finished|torch\.compile takes|Compiling a graph for dynamic shape"
        r"|Compilation (?:took|time)|CompileTime|\[Warmup\]|warming up|Warming up", re.I),
    # the engine built at start-up could not be written to its cache (jetson-inference's "[TRT] failed to open engine
    # cache file for writing …engine", a read-only model folder): the next start builds it again
    "engine_cache_unsaved": re.compile(
        r"failed to (?:open|write|save|create|serialize)\b[^\n]{0,40}?"
        r"\b(?:engine|timing|plan|kernel|compil\w*)[ _]?cache"
        r"|(?:could not|cannot|can't|unable to) (?:save|write|serialize|store)\b[^\n]{0,30}?"
        r"\b(?:engine|plan file|timing cache|compil\w* cache)", re.I),
    "cuda_graphs_off": re.compile(r"enforce[_-]eager\s*[=:]?\s*True|--enforce-eager|CUDA graphs? (?:is |are )?"
                                  r"disabled|disable[_-]cuda[_-]graph\s*[=:]?\s*True|cuda graph.{0,20}not "
                                  r"(?:used|launched|enabled)", re.I),
    # weights kept in host memory by the command's own settings, streamed to the GPU at every forward pass: vLLM's
    # and SGLang's --cpu-offload-gb, llama.cpp's --n-cpu-moe and an --override-tensor / -ot rule putting tensors on
    # the CPU (a value of 0 offloads nothing)
    "weights_offloaded": re.compile(r"--cpu[-_]offload[-_]gb[= ]+0*[1-9]|\bcpu_offload_gb\s*[=:]\s*0*[1-9]"),
    # ... llama.cpp's, which computes the tensors it keeps on the CPU there (its threads, not the link, set the pace)
    # (common/arg.cpp: -ncmoe/--n-cpu-moe N, -cmoe/--cpu-moe, -ot/--override-tensor PATTERN=CPU; a compose file's array
    # form "--override-tensor", "…=CPU" too)
    "tensors_on_cpu": re.compile(r"(?:--n-cpu-moe|-ncmoe)(?:=|\s+)0*[1-9]|(?:^|[\s\"'\[,])(?:--cpu-moe|-cmoe)\b"
                                 r"|LLAMA_ARG_N?_?CPU_MOE=0*[1-9]"
                                 r"|(?:(?:^|[\s\"'\[,])-ot|--override-tensor)[\"']?(?:=|,?\s+)[\"']?[^\s=\"']*"
                                 r"(?:=[^\s=\"']*)*?=CPU\b"),
    "preempted": re.compile(r"is preempted by PreemptionMode|preempted|retract(?:ed|ing) requests?", re.I),
    # the CUDA context itself cannot be created: the device is full before the process allocates anything
    "ctx_oom": re.compile(r"cuDevicePrimaryCtxRetain: CUDA_ERROR_OUT_OF_MEMORY|cuCtxCreate\w*.{0,40}OUT_OF_MEMORY"
                          r"|failed to create (?:cuda |CUDA )?context.{0,40}out of memory"
                          r"|CUDA error: out of memory\s*$", re.I),
    # ollama's scheduler serving a model one request at a time whatever OLLAMA_NUM_PARALLEL says (server/sched.go, a
    # WARN record: msg="model architecture does not currently support parallel requests" architecture=qwen35moe)
    "one_at_a_time": re.compile(r"model architecture does not currently support parallel requests"),
    "slot_unavailable": re.compile(r"slot unavailable|no (?:free|available) slots?|all slots (?:are )?(?:busy|full)"
                                   r"|Model is overloaded|too many (?:concurrent )?requests|503 Service Unavailable"
                                   r"|server (?:is )?busy", re.I),
    # a server processing the whole prompt again instead of reusing its cache
    "prompt_reprocess": re.compile(r"forcing full prompt re-?processing|prompt re-?processing|re-?process(?:es|ing)? "
                                   r"the (?:whole |entire |full )?(?:prompt|context)", re.I),
    # `ollama ps`'s PROCESSOR column ("100% CPU" after the SIZE column, upper case as it prints it); a person's "100%
    # CPU usage" or "sits at 100% CPU" is a utilisation, not where the model sits (private-gpt#1598)
    "ollama_cpu": re.compile(r"\b\d+(?:\.\d+)?\s*[KMGT]B\s+100%\s+(?-i:CPU)\b|\bsize_vram\W+0\b", re.I),
}

# `ollama ps`' PROCESSOR column for a model split between system memory and the GPU ("41 GB   42%/58% CPU/GPU"): the
# share of the model in system memory, whose layers run on the CPU at every token
_OLLAMA_SPLIT = re.compile(r"(?<![\d.])(?P<cpu>\d{1,3})%\s*/\s*(?P<gpu>\d{1,3})%\s+(?-i:CPU/GPU)\b", re.I)
# a program announcing the device it runs on, the line's first words (behind a quote's ">" or a log record's
# bracketed tags): the CPU, or a GPU. A person's "it is using CPU rather than my GPU" is no announcement
_ANNOUNCE_AT = r"^\s*(?:>\s*)*(?:\[[^\]]{1,40}\]\s*)*(?:INFO:?\s*)?"
_CPU_ANNOUNCED = re.compile(_ANNOUNCE_AT + r"(?:using device:? cpu\b|device:? cpu\b(?! offload)|Using CPU\b"
                            r"|running on CPU\b)", re.I)
_GPU_ANNOUNCED = re.compile(_ANNOUNCE_AT + r"(?:using device:? (?:cuda|gpu)\b|device:? cuda\b|Using CUDA\b"
                            r"|Using GPU\b|running on (?:the )?(?:GPU|CUDA)\b)", re.I)
# where a run on the CPU beside one on a GPU may be a fall-back: a container, WSL, a pod, another host
_ELSEWHERE = re.compile(r"\bdocker\b|container|\bwsl2?\b|\bpods?\b|kubernetes|\bk8s\b|another (?:machine|host|server)"
                        r"|other (?:machine|host|server)|remote (?:machine|host|server)|\bVM\b|virtual machine",
                        re.IGNORECASE)
_ELSEWHERE_WORDS = ("docker", "container", "wsl", "pod", "kubernetes", "k8s", "other ", "remote ", "vm",
                    "virtual machine")  # one of which every line _ELSEWHERE matches holds (lower case)
_KEYED = {name: Keyed(rx) for name, rx in MESSAGES.items()}  # each searched only where its literals are
# a line a message's words appear in that is not that message: llama.cpp's loader notice that a tensor "cannot be
# used with preferred buffer type ROCm_Host, using CPU instead" chooses between two host buffers (the pinned one
# and a plain one) for tensors that stay on the host by design (the token embeddings): no fallback from the GPU
_NOT_MESSAGE = {"cpu_fallback": re.compile(r"preferred buffer type"
                                           # a line naming a CUDA or ROCm wheel beside the CPU one compares or
                                           # replaces them ("had 2.0.1+cpu by mistake, reinstalled 2.0.1+cu118")
                                           r"|\+cpu\b.*\+(?:cu\d{2,3}|rocm\d)|\+(?:cu\d{2,3}|rocm\d).*\+cpu\b", re.I),
                # an out-of-memory error during a warm-up or a graph capture is the OOM's phase, not time spent
                # building ("CUDA out of memory occurred when warming up sampler with 1024 dummy requests", vllm#15105)
                "engine_build": re.compile(r"out of memory|OutOfMemory|\bOOM\b", re.I)}

# the messages a command line states as its configuration (``--enforce-eager``): read there too, except on a
# command that puts the engine on the CPU
SETTINGS = ("cuda_graphs_off", "weights_offloaded", "tensors_on_cpu")
_CPU_DEVICE = re.compile(r"--device[= ]cpu\b|VLLM_TARGET_DEVICE=cpu\b", re.I)
# a load generator's requests in flight on its command line (vLLM's benchmark_serving --max-concurrency 64,
# perf_analyzer --concurrency-range 8, a --request-rate inf that sends every request at once)
_LOAD_FLAG = re.compile(r"--(?:max-)?concurren\w*(?:-range)?[= ](?P<n>\d+)(?::(?P<hi>\d+))?"
                        r"|--request-rate[= ](?P<rate>inf)\b", re.I)


@dataclass
class Claims:
    """What a report says, aggregated over its clauses."""

    clauses: int = 0
    concepts: Counter[str] = field(default_factory=Counter)
    messages: Counter[str] = field(default_factory=Counter)
    quotes: dict[str, str] = field(default_factory=dict)  # concept or message → first clause saying it
    # concept → the quantities bound to it (value in base units), in order of appearance
    bound: dict[str, list[Quantity]] = field(default_factory=dict)
    layers: tuple[int, int] | None = None  # (offloaded, total) from llama.cpp / ollama
    title: str = ""  # the first non-empty line (an issue title, a log's first line)
    title_concepts: set[str] = field(default_factory=set)
    # "N threads: X t/s" pairs: (threads, rate), from comparisons of thread counts
    thread_rates: list[tuple[float, float]] = field(default_factory=list)
    first_steady: list[tuple[float, float]] = field(default_factory=list)  # (first ms, later ms) in one clause
    caused: Counter[str] = field(default_factory=Counter)  # concepts named in a clause that names a cause
    # clauses that name a download with a first run or slowness ("the first request is slow: it downloads the
    # weights"), not a download named apart from them ("the model is downloaded from <url>")
    first_download: int = 0
    first_compile: int = 0  # clauses tying a first request to compiling ("the first C4 request triggered a … compile")
    # copy times a clause charges to a read that waits for the GPU (".cpu()", ".item()", ".to('cpu')": CUDA runs
    # the model asynchronously, so the read waits for every kernel queued before it), and whether the text
    # synchronises anywhere (torch.cuda.synchronize(), CUDA_LAUNCH_BLOCKING, CUDA events): then a copy's time is
    # its own
    sync_read_ms: list[float] = field(default_factory=list)
    sync_read_clauses: int = 0  # clauses whose only copies are such reads ("the .cpu() is very slow")
    title_sync_read: bool = False  # ... and the title is one
    title_slot_only: bool = False  # the title's only concurrency word is a server's "slot"
    title_graphs_on_only: bool = False  # the title's CUDA-graph words all say the graphs are on (captured, enabled)
    exceptions: int = 0  # exception lines that end a traceback: something was raised
    synced: bool = False
    # running requests' decode rate alone and while another request's long prompt is prefilled (tok/s)
    decode_alone: list[float] = field(default_factory=list)
    decode_beside_prefill: list[float] = field(default_factory=list)
    ollama_cpu_share: float | None = None  # `ollama ps`' PROCESSOR split ("42%/58% CPU/GPU"): the CPU's share, the most
    cpu_announced: int = 0  # of the CPU-fallback messages, a program's "Using CPU" / "device: cpu" announcements
    gpu_announced: bool = False  # ... and the same kind of announcement of a GPU ("Using CUDA device0 …")
    elsewhere: bool = False  # a container, WSL or another machine named: the CPU run may be a fall-back there
    load_concurrency: float = 0.0  # a load generator's command keeps this many requests in flight (inf: all at once)
    cpu_requested: bool = False  # a command puts the program on the CPU (``--device cpu``): its CPU messages are asked
    words: set[str] = field(default_factory=set)  # lower-cased words and word pairs (bounded), for the cues
    # token rates the text states ("65 tokens per second"), with the concept that owns each ("" when none)
    token_rates: list[tuple[float, str]] = field(default_factory=list)


_CLAUSE_SPLIT = re.compile(r"(?<=[.!?;。！？；])\s+(?=[A-Z(\"'\[]|[\u4e00-\u9fff])|(?<=[。！？；])")
MAX_CLAUSE = 600
BIND_WINDOW = 48  # characters between a concept and the quantity it owns
# memory (the device's or the host's) as a label of percentages: it competes for a percentage with the concepts
# that own one (``_nearest``), by the same distances, and a percentage memory wins is memory's, never a
# utilisation's ("GPU memory at 95%", "memory is almost 100%", "50% memory usage", "显存 95%"). Memory labels
# nothing where it is qualified ("memory-bound", "RAM-heavy"), negated ("not memory") or set off ("unlike
# memory,"), nor a percentage before it when its own value follows it ("GPU-Util: 12%  Memory-Util: 94%")
_MEM_LABEL = re.compile(
    r"(?:(?<![A-Za-z])(?:mem(?:ory)?|vram|ram)(?![A-Za-z])|显存|内存)"
    r"(?:[- ]?(?:usage|use|used|utili[sz]ation|util|occupancy|allocation|allocated|consumption|footprint|bandwidth)"
    r"(?![A-Za-z])|占用|使用率|利用率)?", re.IGNORECASE)
_MEM_QUALIFIED = re.compile(r"[- ]?(?:bound|heavy|intensive|hungry|wise|optimi[sz]ed|leak\w*)\b|\s*[,;)]",
                            re.IGNORECASE)
# between a percentage and memory named after it: "of (the) (GPU) memory"
# (a space at least: top's "%CPU 100.0 %MEM 40.0" glues the sign to the next column's name)
_MEM_AFTER_GAP = re.compile(r"\s+(?:of\s+(?:the\s+|my\s+|its\s+)?)?"
                            r"(?:(?:gpu|device|dedicated|shared|system|total)\s+)*", re.IGNORECASE)


def memory_labels(clause: str) -> list[tuple[int, int, bool]]:
    """Where memory is named in ``clause`` (not negated): (start, end, qualified) of each, the usage word included;
    a qualified one ("memory-bound", "memory,") labels a value only against a concept named past another value."""
    return [(m.start(), m.end(), bool(_MEM_QUALIFIED.match(clause, m.end()))) for m in _MEM_LABEL.finditer(clause)
            if not _negated(clause, m.start())]


def _memory_distance(memory: Sequence[tuple[int, int, bool]], q: Quantity, starts: list[int], clause: str,
                     qualified: bool = False) -> int | None:
    """How near memory labels the percentage ``q`` (None: it does not): before it with no other value between,
    or right after it (``_MEM_AFTER_GAP``) when memory's own value does not follow it; a qualified mention only
    with ``qualified`` ("GPU utilization at 100% and memory-bandwidth bound at 80%": the utilisation reaches 80%
    past its own value, memory's mention is nearer)."""
    best: int | None = None
    for start, end, is_qualified in memory:
        if is_qualified and not qualified:
            continue
        if end <= q.start:
            if _value_between(starts, end, q.start):
                continue
            dist = q.start - end
        elif start >= q.end:
            if not _MEM_AFTER_GAP.fullmatch(clause, q.end, start):
                continue
            nxt = bisect.bisect_left(starts, q.end)
            if nxt < len(starts) and _OWN_VALUE.fullmatch(clause, end, starts[nxt]):
                continue  # memory's own value follows it: the percentage before it is another label's
            dist = start - q.end
        else:
            continue
        if dist <= BIND_WINDOW and (best is None or dist < best):
            best = dist
    return best


# a hard-wrapped paragraph (a mail, a markdown source, a docstring): a line that goes on from the one
# before it starts with a lower-case word, and the line before it ends with no sentence's end
_WRAPPED = re.compile(r"\s*[a-z]")
_ENDS_SENTENCE = re.compile(r"[.!?:;。！？：；]\W{0,2}\s*$")


def clauses_of(line: str) -> list[str]:
    """A line → its clauses (sentences; a table row or log line stays whole)."""
    line = line.strip()
    if not line:
        return []
    if line.startswith("|") or line.count("|") >= 3:
        return [line[:MAX_CLAUSE]]
    return [c[:MAX_CLAUSE] for c in _CLAUSE_SPLIT.split(line) if c.strip()]


# the advice frameworks print with every error: never a claim of the report
_BOILERPLATE = re.compile(
    r"reduce GPU memory used by other processes|See documentation for Memory Management|If reserved but "
    r"unallocated memory is large|If reserved memory is >> allocated memory|max_split_size_mb to avoid "
    r"fragmentation|Including non-PyTorch memory|PYTORCH_CUDA_ALLOC_CONF|may or may not have an "
    r"negative impact|It might have negative impact on performance|This can affect the end-to-end performance"
    r"|Increase gpu_memory_utilization or tensor_parallel_size"
    # PyTorch's OOM message names what CUDA graphs' private pools hold ("with X allocated in private pools (e.g., CUDA
    # Graphs)", c10/cuda/CUDACachingAllocator.cpp), whatever ran out; a paste may wrap it inside the parenthesis
    r"|private pools \(e\.g\.,? CUDA Graphs\)"
    r"|^\W*(?:(?:private\s+)?pools\s+)?\(?(?:e\.g\.,?\s*)?CUDA Graphs\), and(?:\s*$| \S+ ?[KMGT]?i?B is reserved by "
    r"PyTorch)"
    # the XPU allocator's own hint, printed with every OOM of torch.xpu
    r"|Please use `?empty_cache`? to release all unoccupied cached memory"
    # PaddlePaddle's, printed under every ResourceExhaustedError of its allocators
    r"|Please check whether there is any other process using (?:GPU|NPU|XPU|MLU)|If yes, please stop them, or start "
    r"PaddlePaddle on another|please decrease the batch size of your model|If the above ways do not solve the out of "
    r"memory problem|The command is `?export FLAGS_",
    re.IGNORECASE,
)


_WORD = re.compile(r"[a-z][a-z_]{2,}|[\u4e00-\u9fff]{2}")
MAX_WORDS = 20_000
# kinds of line that are a program's data, never a claim nor a framework message: a command line (its
# --tokenizer is no statement about tokenising), a metrics exposition (HELP texts), JSON or XML records
_DATA = frozenset({LineKind.COMMAND, LineKind.METRICS, LineKind.JSON})
# printed structures: a prose run after one is the program's when a program's line follows it
PRINTED = frozenset({LineKind.JSON, LineKind.TABLE})
# kinds whose clauses are read for quantities tied to concepts: a person's sentences, the tables they
# paste, and a traceback's exception line (the program's own statement of what failed: "RuntimeError: CUDA
# failed with error out of memory"); a log record or a line of code states nothing. Words (the report
# model's cues) and the title come from prose alone.
_READ_CLAUSES = frozenset({LineKind.PROSE, LineKind.TABLE, LineKind.TRACEBACK})


def _printout(run: list[str], carried: bool) -> tuple[set[int], bool]:
    """The lines of ``run`` in blocks of ``KV_BLOCK`` or more key-value rows of numbers in a row, and whether the run
    ends in one. ``carried``: a printout runs into the run (a rule above it, or such rows before a blank line), so
    its first rows belong to it however few."""
    out: set[int] = set()
    block: list[int] = []
    ends = False
    for i, line in enumerate([*run, ""]):
        if i < len(run) and _KV_NUMBERS.fullmatch(line):
            block.append(i)
            continue
        if block and (len(block) >= KV_BLOCK or (carried and block[0] == 0)):
            out.update(block)
            ends = block[-1] == len(run) - 1
        block = []
    return out, ends


def words_of(text: str) -> set[str]:
    """Lower-cased words (3+ letters) and adjacent word pairs: what the report model's cues are made of."""
    ws = _WORD.findall(text.lower())
    return set(ws) | {f"{a}_{b}" for a, b in itertools.pairwise(ws)}


def _is_title(line: str) -> bool:
    """A sentence of two words or more (``line`` is prose: ``diagnose.collectors.linekind``)."""
    return len(re.findall(r"[A-Za-z\u4e00-\u9fff]{2,}", line)) >= 2


LOG_MIN_LINES = 50  # a text this long ...
LOG_SHARE = 0.9  # ... that a program wrote this much of is a log, not a report with a log pasted in it
_PREFIXED = re.compile(r"\s*[a-z_][\w.]*:\s")  # "load: …", "print_info: …": a program's own line prefix
# a row of a program's key-value printout: a short label, its colon, then numbers with their units only ("number of
# prompt tokens: 741804", "token throughput (completion token): 968.468 token/s", "elapsed_time: 736.060s")
_NUM = r"[-+]?\d[\d.,]*\s?[A-Za-z/%]{0,10}"
_KV_NUMBERS = re.compile(rf"\s*[A-Za-z][\w .,()/+%-]{{0,70}}:\s*\[?{_NUM}(?:\s*[,;]\s*{_NUM})*\]?"
                         rf"(?:,\s*[A-Za-z][\w .-]{{0,30}}:\s*{_NUM})*\s*")  # "concurrency: 64, input_tokens: 1, …"
KV_BLOCK = 6  # this many such rows in a row are a printout (a benchmark's summary), not a person's list
# a program's rule across its printout ("-----…" of 20 or more: a person's markdown separator is "---"); what opens a
# block of fewer rows, as a key-value row a log reader already typed as a program's does ("elapsed_time: 736.060s")
_LONG_RULE = re.compile(r"[-=]{20,}")


# -- a long prefill stalling the running requests' decode --------------------------------------------------------------
_PREFILL_WORD = re.compile(r"prefill\w*|prompt processing|\bpp\b", re.I)
# another request's prefill beside the stream, said so: "while B is prefilling", "during another request's prefill",
# "+ one 200K-token prefill", "the peer prefill", a "mixed-load" run; not a contrast ("prompt processing is 35 tok/s
# while generation is 4") nor batching ("decode: 12 tok/s per request with 32 concurrent requests")
_BESIDE = re.compile(r"\bwhile\b[^.;|]{0,40}\bprefill(?:ing|s|ed)\b|\bduring\b[^.;|]{0,30}\bprefill"
                     r"|\bwhile\b[^.;|]{0,40}\bprefills?\s+(?:runs?|is running|happens|executes|is in progress)\b"
                     r"|\+\s*(?:one|a|an|\d)\b[^|.;]{0,30}\bprefill|\bpeer\b[^.;|]{0,20}\bprefill|\bmixed[- ]load\b"
                     r"|\b(?:another|other|second) request'?s?\b[^.;|]{0,20}\bprefill", re.I)
_ALONE = re.compile(r"\balone\b|standalone|\bsolo\b|\bisolated\b|by itself|\brecovered\b|no other (?:traffic|requests?)"
                    r"|\bbaseline\b", re.I)
_FROM_TO_RATE = re.compile(r"\bfrom\s*~?\s*(?:\d+(?:\.\d+)?\s*[–-]\s*)?(?P<a>\d+(?:\.\d+)?)\s*tok(?:en)?s?\s*/\s*s\w*"
                           r"\s+(?:down\s+)?to\s*~?\s*(?P<b>\d+(?:\.\d+)?)\s*tok", re.I)


# a picture pasted into a report: Markdown's "![image](https://github.com/…/assets/…)" (the alt text is GitHub's default
# "image" or the file's name) or an HTML <img …> tag; what it shows is not in the text, and its words are no workload
_PICTURE = re.compile(r"!\[[^\]\n]{0,200}\]\([^)\s]{0,500}(?:\s+\"[^\"]*\")?\)|<img\b[^>]{0,1000}>", re.IGNORECASE)


class ClaimParser:
    """Feed cleaned lines; ``claims`` holds what the text says.

    Each line is typed first (``diagnose.collectors.linekind``): only a person's prose is read for
    cues and claims. A run of prose-like lines between two lines a program wrote (a log record, a
    traceback, code, a command), with no blank line in between, is that program's output too ("Triton
    is installed, but doesn't include CPU backend" between an engine's records, a leak report at exit),
    and so is one between a printed structure or table and a program's line, except a line ending with a
    colon (a person introducing the paste that follows); and a line a
    program already printed is the program's wherever it appears again. So prose waits for the line
    after its run before it is read."""

    MAX_RUN = 64  # prose lines held while their run is undecided; a longer run is a person's text

    def __init__(self) -> None:
        self._claims = Claims()
        self._prev_machine = False  # the last line was a program's (no blank line since)
        # ... or a structure or table a program may have printed: prose between it and a program's line is the
        # program's ("Model metadata: {…}" then "Using fallback chat format: llama-2" then a log record)
        self._prev_printed = False
        self._run: list[str] = []  # prose lines waiting for the line after them
        self._run_after_machine = False
        self._program: set[str] = set()  # prose-like lines already known as a program's output
        self._lines = 0  # non-blank lines fed, and how many of them a program wrote
        self._machine_lines = 0
        self._prose_read = False  # a person's line read already: the title is behind
        self._kv_carry = False  # a printout of key-value rows runs on (a rule above, or its rows before a blank)
        self._last_download = self._last_first = False  # the clause before named a download / a first run or slowness
        self._first_open: tuple[float, int] | None = None  # a first run's time stated alone, and clauses left to pair
        self._sync_pending = False  # the code synchronised; whether that closes a timing or opens a read is ahead
        self._fenced = False  # inside a Markdown code fence: its lines are code, however plain they look
        self._code_syncs: set[str] = set()  # fenced lines read as code's synchronisation, not a person's saying so

    @property
    def claims(self) -> Claims:
        # a log's last lines after its last record (an exit's leak report) are the program's too, in a text
        # that is a program's output almost throughout
        if self._sync_pending:  # a synchronisation nothing read after: it closes the code's timing
            self._claims.synced, self._sync_pending = True, False
        before = self._lines - len(self._run)  # the lines before that last run
        log = before >= LOG_MIN_LINES and self._machine_lines >= LOG_SHARE * before
        self._end_run(next_machine=log)  # the last run's lines are read first: their messages count below too
        c = self._claims
        if c.cpu_requested and c.messages["cpu_fallback"] > 0:
            # the program was started on the CPU (whispering#76: "whispering … --device cpu", then its own "FP16 is
            # not supported on CPU; using FP32 instead"): what it says of the CPU was asked for, no fall-back; beside a
            # GPU run's command it is a comparison, and which run printed a CPU message is not known
            del c.messages["cpu_fallback"]
            c.quotes.pop("msg:cpu_fallback", None)
            c.cpu_announced = 0
        if c.gpu_announced and c.cpu_announced and not c.elsewhere:
            # a program announcing the CPU in one run and a GPU in another was run on both (yolov3#212's "Using CPU"
            # at 0.214 s, then "Using CUDA device0 … GTX 1050 Ti" at 0.970 s): a comparison, no fall-back
            c.messages["cpu_fallback"] -= c.cpu_announced
            c.cpu_announced = 0
            if c.messages["cpu_fallback"] <= 0:
                del c.messages["cpu_fallback"]
                c.quotes.pop("msg:cpu_fallback", None)
        return self._claims

    def feed(self, line: str) -> None:
        kind = kind_of(line)
        fence = _FENCE.match(line)
        if fence is not None:
            if not fence.group(2).rstrip().endswith(fence.group(1)):  # a fence closed on its own line flips nothing
                self._fenced = not self._fenced
        elif (kind is not LineKind.PROSE or self._fenced) and not self._claims.synced:
            if kind is LineKind.PROSE and _SYNC_CODE.search(line):
                self._code_syncs.add(line.strip())
            self._sync_code(line)
        if kind is LineKind.PROSE:
            line, kind = self._inline_command(line)
        if kind is not LineKind.BLANK:
            self._lines += 1
        if kind is LineKind.PROSE:
            if line.strip() in self._program:
                kind = LineKind.LOG  # the program printed it before: its output again
            else:
                if not self._run:
                    self._run_after_machine = self._prev_machine or self._prev_printed
                self._run.append(line)
                if len(self._run) > self.MAX_RUN:
                    self._end_run(next_machine=False)
                self._prev_machine = self._prev_printed = False
                return
        if kind is LineKind.TRACEBACK and is_exception_line(line):
            self._claims.exceptions += 1
            self._claims.quotes.setdefault("exception", line.strip()[:200])
        machine = is_machine(line, kind)
        self._machine_lines += machine
        self._end_run(next_machine=machine)
        if kind is not LineKind.BLANK:  # a program's long rule, or a key-value row typed a log's ("elapsed_time:
            # 736.060s"), opens a printout or goes on with one; any other line (a person's table too) closes it
            self._kv_carry = bool(_LONG_RULE.fullmatch(line.strip())) or (
                kind is LineKind.LOG and bool(_KV_NUMBERS.fullmatch(line)))
        self._read(line, kind)
        self._prev_machine = machine
        self._prev_printed = kind in PRINTED

    def _inline_command(self, line: str) -> tuple[str, LineKind]:
        """A command a person quoted in a sentence ("Command used: `vllm serve m --enforce-eager`") is read as a
        command (its settings, never a claim) and the sentence around it as prose; a line that is the
        command and its quotes alone is a command line."""
        span = inline_command(line)
        if span is None:
            return line, LineKind.PROSE
        a, b = span
        rest = f"{line[:a]} {line[b + 1:]}".rstrip()
        if not re.search(r"[^\W\d_]{2,}", rest):  # nothing but quotes, markers or numbering around it
            return line, LineKind.COMMAND
        self._read(line[a:b], LineKind.COMMAND)
        return rest, LineKind.PROSE

    def _end_run(self, next_machine: bool) -> None:
        run, self._run = self._run, []
        if not run:
            return
        program = self._run_after_machine and next_machine
        printout, self._kv_carry = _printout(run, self._kv_carry)
        sentence: list[str] = []  # a sentence a person wrapped over several lines, read as one line
        for i, line in enumerate(run):
            if i in printout:  # a program's key-value rows: its reader's, no one's statement
                if len(self._program) < self.MAX_RUN * 16:
                    self._program.add(line.strip())
                continue
            # "This is how the model is loaded:" introduces a paste; "load: printing all EOG tokens:" is a
            # program's line (its own "name:" prefix)
            intro = (line.rstrip().endswith((":", "：")) and not _PREFIXED.match(line)
                     and len(line.split()) >= 3)  # "Process EngineCore:" is multiprocessing's, not a sentence
            if program and not intro:
                if len(self._program) < self.MAX_RUN * 16:
                    self._program.add(line.strip())
                continue
            # the text's first line is its title, whatever follows it
            if (sentence and self._prose_read and _WRAPPED.match(line)
                    and not _ENDS_SENTENCE.search(sentence[-1])):
                sentence.append(line.strip())
                continue
            if sentence:
                self._read(" ".join(sentence), LineKind.PROSE)
                self._prose_read = True
            sentence = [line]
        if sentence:
            self._read(" ".join(sentence), LineKind.PROSE)
            self._prose_read = True

    def _read(self, line: str, kind: LineKind) -> None:
        c = self._claims
        if kind is LineKind.COMMAND:  # the settings it starts a program with, never a claim
            flags = list(_LOAD_FLAG.finditer(line))
            caps = [float(f.group("hi") or f.group("n")) for f in flags if f.group("n")]
            # a cap bounds what a rate of inf sends at once ("--request-rate inf --max-concurrency 1" is serial)
            load = max(caps) if caps else (float("inf") if any(f.group("rate") for f in flags) else 0.0)
            c.load_concurrency = max(c.load_concurrency, load)
            if _CPU_DEVICE.search(line):
                c.cpu_requested = True
                return  # an engine on its CPU backend: no CUDA graphs to turn off
            self._messages(line, SETTINGS)
            return
        if kind in _DATA:
            return  # a metrics exposition or a record: the program's text, nobody's claim
        prose = kind is LineKind.PROSE
        if prose and ("![" in line or "<img" in line.lower()):
            line = _PICTURE.sub(" ", line)  # a picture nobody can read here; its alt text is GitHub's "image"
        if prose and len(c.words) < MAX_WORDS:
            c.words |= words_of(line)  # the report model's cues: what a person wrote, only
        if prose and not c.title and _is_title(line):
            c.title = line.strip()[:300]
            title_found = _concepts_in(c.title)
            c.title_concepts = {name for _, _, name in title_found}
            c.title_sync_read = _sync_reads_only(c.title, title_found)
            # llama-server's "slot" names its unit of parallelism, a setting ("Why server slot's cache_prompt is false
            # by default?"), not requests waiting: a title whose only concurrency word it is names no queue ("slots",
            # "4 slots", "all slots busy" still name the server's parallel requests)
            c.title_slot_only = all(c.title[a:b].lower() == "slot"
                                    for a, b, name in title_found if name == "concurrency")
            # every CUDA-graph word of the title inside a phrase that says they are on ("CUDA Graph Capturing time is
            # too long"): no title about eager mode's launches
            on = [(a, b) for a, b, name in title_found if name == "cuda_graph_on"]
            c.title_graphs_on_only = bool(on) and all(any(x <= a and b <= y for x, y in on)
                                                      for a, b, name in title_found if name == "cuda_graph")
        self._messages(line, MESSAGES)
        if kind in (LineKind.PROSE, LineKind.TABLE) and "/s" in line:
            self._prefill_stall(line)
        m = _OFFLOADED.search(line)
        if m:
            c.layers = (int(m.group(1)), int(m.group(2)))
        elif c.layers is None:
            m = _OFFLOADING.search(line)
            if m:
                c.layers = (int(m.group(1)), -1)
        if kind in _READ_CLAUSES and not (kind is LineKind.TABLE and printed_row(line)):
            # a program's columns (nsys stats, a profiler's table) are its collector's to read, no one's statement
            for clause in clauses_of(line):
                self._clause(clause)

    def _prefill_stall(self, line: str) -> None:
        """A running request's decode rate alone, and while another request's long prompt is prefilled: a line or
        row that names a prefill beside it ("A while B is prefilling: 6.62 tok/s", "victim + one 200K-token
        prefill | … | 7.7 tok/s") gives its lowest rate; one that says the stream ran alone ("A standalone/recovered
        decode: ~272.6 tok/s", "victim alone | … | 59.4 tok/s"), and names no prefill of its own, its highest; "from
        ~51–55 tok/s to 5.00 tok/s" beside a peer's prefill gives both."""
        c = self._claims
        rates = [q for q in quantities(line) if q.dim == "rate" and _TOKEN_RATE.search(q.text)]
        if not rates:
            return
        prefill = _PREFILL_WORD.search(line) is not None
        beside = _BESIDE.search(line) is not None
        fell = _FROM_TO_RATE.search(line)
        if beside and fell:
            c.decode_alone.append(float(fell.group("a")))
            c.decode_beside_prefill.append(float(fell.group("b")))
        elif beside:
            c.decode_beside_prefill.append(min(q.value for q in rates))
        elif not prefill and _ALONE.search(line):
            c.decode_alone.append(max(q.value for q in rates))

    def _messages(self, line: str, names: Iterable[str]) -> None:
        """Count the framework messages ``names`` that ``line`` holds, keeping the first line of each."""
        c = self._claims
        low = line.lower()
        for name in names:
            if _KEYED[name].search(line, low):
                veto = _NOT_MESSAGE.get(name)
                if veto is not None and veto.search(line):
                    continue
                c.messages[name] += 1
                c.quotes.setdefault(f"msg:{name}", line.strip()[:200])
                if name == "cpu_fallback" and _CPU_ANNOUNCED.search(line):
                    c.cpu_announced += 1
        if "cpu/gpu" in low:
            for m in _OLLAMA_SPLIT.finditer(line):
                share = float(m.group("cpu")) / 100.0
                if abs(float(m.group("cpu")) + float(m.group("gpu")) - 100.0) <= 1.0:
                    c.ollama_cpu_share = max(c.ollama_cpu_share or 0.0, share)
        if not c.gpu_announced and ("cuda" in low or "gpu" in low) and _GPU_ANNOUNCED.search(line):
            c.gpu_announced = True
        if not c.elsewhere and any(w in low for w in _ELSEWHERE_WORDS) and _ELSEWHERE.search(line):
            c.elsewhere = True

    def _sync_code(self, line: str) -> None:
        """Whether the code it pasted synchronises its timings. A synchronisation closes a timing when a timer is
        read after it (``torch.cuda.synchronize(); t1 = time.time()``), or CUDA events time the code; one followed
        by a host read with no timer between (``torch.cuda.synchronize(); y = out.cpu()  # 3 s``) is in the read's
        span, as is one on the read's own line: that span holds the wait for the model's queued kernels
        (pytorch#24318). A synchronisation timed on its own line (``cudaDeviceSynchronize();  // 80 ms``) is that
        wait, timed: the model's time, not the code's synchronising."""
        c = self._claims
        m = _SYNC_CODE.search(line)
        if m is not None and _EVENT_TIMING.search(line):
            c.synced = True
            return
        if m is not None:
            comment = _TRAILING_COMMENT.search(line, m.end())
            timed = _TIMED_COMMENT.fullmatch(comment.group(1).strip()) if comment else None
            if timed is not None:
                times = [q.value for q in quantities(timed.group(0)) if q.dim == "time"]
                if times:
                    c.sync_read_ms.append(max(times))
                    c.quotes.setdefault("sync_read", line.strip()[:200])
                    return
            if _TIMER.search(line, m.end()):
                c.synced = True  # "torch.cuda.synchronize(); t1 = time.time()": it closes the timing
                return
            if _SYNC_READ.search(line, m.end()):
                return  # synchronised for the read on the same line
            self._sync_pending = True
            return
        if not self._sync_pending:
            return
        if _TIMER.search(line):
            c.synced, self._sync_pending = True, False
        elif _SYNC_READ.search(line):
            self._sync_pending = False  # the synchronisation belongs to the read's span

    def _clause(self, clause: str) -> None:
        c = self._claims
        c.clauses += 1
        if self._first_open is not None:  # one clause further from a first run's time stated alone
            left = self._first_open[1] - 1
            self._first_open = (self._first_open[0], left) if left >= 0 else None
        if _BOILERPLATE.search(clause):
            return
        if not c.synced and not clause.rstrip().endswith("?"):  # a person saying they synchronised, not asking
            said = clause  # (the code's own synchronisations were read as code: not a person's saying so)
            for code in self._code_syncs:
                said = said.replace(code, " ")
            c.synced = any(not _negated(said, _dotted_start(said, m.start())) for m in _SYNC_SAID.finditer(said))
        found = _concepts_in(clause)
        for q in quantities(clause) if _TOKEN_RATE.search(clause) else ():
            if q.dim == "rate" and _TOKEN_RATE.fullmatch(q.text.split(None, 1)[-1] if " " in q.text else
                                                         q.text.lstrip("0123456789.,")):
                c.token_rates.append((q.value, _rate_owner(clause, q) or _nearest(found, q) or ""))
        if not found:
            return
        names = {f[2] for f in found}
        for name in names:
            c.concepts[name] += 1
            c.quotes.setdefault(name, clause.strip()[:200])
        if "causal" in names:
            for name in names - {"causal", "slow", "gpu", "cpu"}:
                c.caused[name] += 1
        qs = quantities(clause)
        sync_only = "copy" in names and _sync_reads_only(clause, found)  # every copy named is a host read
        if sync_only and not qs:
            c.sync_read_clauses += 1
        # a download put to the first run or the slowness in one clause or the next ("the first request takes 40 s.
        # Meanwhile the log shows it downloading the weights"); where the model came from ("the model downloaded
        # from the zoo is slow") is no download
        download = "download" in names and not _provenance_only(clause, found)
        first = bool(names & {"first", "slow"})
        if (download and (first or self._last_first)) or (first and self._last_download):
            c.first_download += 1
            c.quotes.setdefault("download_first", clause.strip()[:200])
        self._last_download, self._last_first = download, first
        if {"first", "compile"} <= names:
            c.first_compile += 1
            c.quotes.setdefault("first_compile", clause.strip()[:200])
        if not qs:
            return
        values = sorted((q.start, q.dim) for q in qs)
        memory = memory_labels(clause)
        starts = [at for at, _ in values]
        # percentages memory labels at once (right before or after them): not a concept's own value after it
        held = frozenset(q.start for q in qs if q.dim == "pct" and memory
                         and (_memory_distance(memory, q, starts, clause) or BIND_WINDOW + 1) <= 5)
        items = value_first_items(clause, qs)
        read_times: list[Quantity] = []  # times bound to a host read: the model's, unless the read is sized
        sized = False  # a size or rate the copy owns ("2 GB … .cpu() … 5 GB/s"): a copy measured as one
        for q in qs:
            item = items.get(q.start)
            # a value that leads its own item of a value-first list: its item's label, or the list's heading
            mine = found if item is None else [f for f in found if item.owns(f)]
            owner = _nearest(mine, q, values, clause, memory, held)
            if owner is None and item is not None and q.dim == "time" \
                    and _STAGE_MODEL.fullmatch(clause, q.end, item.end) and names & {"preprocess", "postprocess"}:
                owner = "model_time"  # a stage list's model stage: "0.3ms preprocess, 7.6ms inference, …"
            if owner is not None:
                if owner == "copy" and sync_only and q.dim == "time":
                    read_times.append(q)
                    continue
                sized = sized or (owner == "copy" and q.dim in ("size", "rate"))
                c.bound.setdefault(owner, []).append(q)
        if sync_only and sized:
            c.bound.setdefault("copy", []).extend(read_times)
        elif sync_only:
            c.sync_read_clauses += 1
            c.sync_read_ms.extend(q.value for q in read_times)
            if read_times:
                c.quotes.setdefault("sync_read", clause.strip()[:200])
        self._pairs(clause, found, qs)

    def _pairs(self, clause: str, found: list[tuple[int, int, str]], qs: list[Quantity]) -> None:
        """Comparisons inside one clause: thread counts with rates, first vs later timings."""
        c = self._claims
        names = {f[2] for f in found}
        if "threads" in names:
            threads = [q for q in qs if q.dim == "count:threads"]
            rates = [q for q in qs if q.dim == "rate"]
            if len(threads) == 1 and len(rates) == 1:
                c.thread_rates.append((threads[0].value, rates[0].value))
        times = [q.value for q in qs if q.dim == "time"]
        if "first" in names and len(times) >= 2:
            c.first_steady.append((times[0], min(times[1:])))
        elif "first" in names and len(times) == 1 and "subsequent" not in names:
            self._first_open = (times[0], PAIR_CLAUSES)  # a later clause may give the later runs' time
        elif "subsequent" in names and times and self._first_open is not None and _LATER_RUN.search(clause):
            # the first run's time and the later runs', a clause or two apart ("First Run call: 9 seconds. Cache
            # files written. Second Run call: 25 ms.", onnxruntime#18272)
            c.first_steady.append((self._first_open[0], min(times)))
            self._first_open = None


PAIR_CLAUSES = 3  # a first run's time pairs with a later run's stated within this many clauses after it
# ... a later run named as one ("Second Run call: 25 ms"), not any word of "subsequent" ("following the docs")
_LATER_RUN = re.compile(r"\b(?:second|2nd|third|next|later|subsequent|following|other) (?:\w+ )?(?:requests?|runs?"
                        r"|calls?|inferences?|iterations?|images?|batch(?:es)?|quer(?:y|ies)|generations?|predictions?"
                        r"|forwards?|times?)\b", re.IGNORECASE)
# a Markdown code fence, and what follows it on its line
_FENCE = re.compile(r"^\s*(```|~~~)(.*)$")
# a host read of a CUDA tensor: it waits for the GPU work queued before it (libtorch's ".to(at::kCPU)" too)
_SYNC_READ = re.compile(r"\.(?:cpu|item)\(\)|\.to\(\s*(?:['\"]?cpu|(?:at|torch)::kCPU)", re.IGNORECASE)
# CUDA events time the GPU's own work: a synchronisation with them is the timing's
_EVENT_TIMING = re.compile(r"enable_timing\s*=\s*True|\.elapsed_time\(|torch\.cuda\.Event\(|cudaEventElapsedTime",
                           re.IGNORECASE)
# a host timer read: Python's clocks, C++'s chrono, a profiler's or a timer object's start and stop
_TIMER = re.compile(r"\btime\.(?:time|perf_counter|monotonic)(?:_ns)?\(|\bperf_counter(?:_ns)?\(|default_timer\("
                    r"|chrono::\w+::now\(|\btimer\.(?:start|stop|tic|toc)\(|\b(?:tic|toc)\(\)|gettimeofday\("
                    r"|clock_gettime\(|\bt\d*\s*=\s*time\b", re.IGNORECASE)
# a code line's own comment, after its statement: "cudaDeviceSynchronize();  // About 80 milliseconds", "x  # 3s"
_TRAILING_COMMENT = re.compile(r"(?://|\s#)\s*(.+)$")
# ... that is the statement's duration and nothing else ("About 80 milliseconds", "~3s!!!", "0.5 s"), not a remark
# that holds a time ("make sure the 2 ms forward has finished")
_TIMED_COMMENT = re.compile(r"(?:(?:about|around|approx\.?|roughly|takes?|took|cost|costs)\s+|[~≈]\s*)?"
                            r"\d+(?:\.\d+)?\s*(?:ns|us|µs|ms|s|sec|secs|seconds?|milliseconds?|msec|minutes?|mins?)"
                            r"[\s!.?]*", re.IGNORECASE)
# the code the text pasted synchronises: a copy's time is then its own (a person's "I never call synchronize()" or
# "does .cpu() synchronize?" is read as what a person wrote, below)
_SYNC_CODE = re.compile(r"\bsynchronize\(|cuda(?:Device|Stream|Event)Synchronize|CUDA_LAUNCH_BLOCKING\s*=\s*1"
                        r"|enable_timing\s*=\s*True|\.elapsed_time\(|torch\.cuda\.Event\(", re.IGNORECASE)
# ... or the person says they synchronised (not negated, not asked)
_SYNC_SAID = re.compile(r"\bsynchroni[sz]\w*|CUDA_LAUNCH_BLOCKING|cuda events?", re.IGNORECASE)


# a download named as where something came from: "downloaded from <url>", "download it from the hub", not one under
# way ("being downloaded from the hub")
_PROVENANCE = re.compile(r"\s+(?:it\s+|them\s+)?(?:from|at|via|off)\b", re.IGNORECASE)
_UNDER_WAY = re.compile(r"\bbeing\s+$", re.IGNORECASE)


def _provenance_only(clause: str, found: list[tuple[int, int, str]]) -> bool:
    """Whether every download ``clause`` names is where something came from, not a download under way."""
    downloads = [(a, b) for a, b, name in found if name == "download"]
    return bool(downloads) and all(
        clause[a:b].lower() in ("download", "downloaded") and _PROVENANCE.match(clause, b) is not None
        and _UNDER_WAY.search(clause, 0, a) is None for a, b in downloads)


def _dotted_start(text: str, at: int) -> int:
    """Where the dotted name ending at ``at`` begins ("torch.cuda." before "synchronize()"): a negation is read
    before the whole name."""
    while at > 0 and (text[at - 1].isalnum() or text[at - 1] in "._"):
        at -= 1
    return at


def _sync_reads_only(clause: str, found: list[tuple[int, int, str]]) -> bool:
    """Whether every copy ``clause`` names is a host read of a CUDA tensor (".cpu() takes 170 ms")."""
    copies = [(a, b) for a, b, name in found if name == "copy"]
    return bool(copies) and all(_SYNC_READ.fullmatch(clause, a, b) for a, b in copies)


# a negation among the three words before a concept denies it: "no other processes were running",
# "it is not the preprocessing", "没有其他进程"
_NEGATION = re.compile(r"(?:\b(?:no|not|never|without|none|nothing|neither|nor|cannot)\b|n't\b|没有|不是|并非|无)"
                       r"(?:[ \t]+[\w'-]+){0,2}[ \t]*$", re.IGNORECASE)


def _sentence_around(text: str, start: int, end: int) -> str:
    """The sentence of ``text`` that holds ``text[start:end]`` (a title may be a whole paragraph)."""
    a = max((m.end() for m in _SENTENCE_END.finditer(text, 0, start)), default=0)
    b = next((m.start() for m in _SENTENCE_END.finditer(text, end)), len(text))
    return text[a:b]


_SENTENCE_END = re.compile(r"[.;!?](?:\s|$)")


def _concepts_in(clause: str) -> list[tuple[int, int, str]]:
    """(start, end, concept) of each concept ``clause`` names: not negated, not a queue stated empty, not the
    slot a card sits in read as copies."""
    found: list[tuple[int, int, str]] = []
    for name, rx in _CONCEPT_RX.items():
        for m in rx.finditer(clause):
            if _negated(clause, m.start()) or (name == "queue" and _ZEROED.match(clause, m.end())) \
                    or _went_fine(clause, m.start(), m.end()) or _DENIED_AFTER.match(clause, m.end()):
                continue
            if name == "copy" and m.group().lower() == "pcie" and (
                    _LINK_AFTER.match(clause, m.end()) or _LINK_BEFORE.search(clause, 0, m.start())) \
                    and not _COPY_AFTER.match(clause, m.end()):
                continue  # the slot a card sits in ("PCIe x8", "Gen4 PCIe"): the link's, not a copy named
            if name == "preprocess" and (_TOKENIZER_FILE.match(clause, m.end())
                                         or _TOKENIZER_FILE_WORD.fullmatch(m.group())) \
                    and not _TIMED_WORK.search(_sentence_around(clause, m.start(), m.end())):
                continue  # the tokenizer's configuration or files (a setting it lacks), not tokenising work
            if name in _HOST_WAIT_VETOES and not _NAMED_OUTRIGHT.fullmatch(m.group()) and (
                    _SPIN_ON_DEVICE.search(clause)
                    or (_HOST_SPINS.fullmatch(m.group()) and _ON_THE_DEVICE.search(clause))):
                continue  # a core held by spinning on the GPU's completion is the host waiting: not its overhead
            if name == "held_elsewhere" and _COMPARED_BEFORE.search(clause, max(0, m.start() - 30), m.start()) \
                    and _SEVERAL.match(m.group()) and not _AT_ONCE.search(clause, m.end()):
                continue  # "testing two models", "across several models": a comparison, not two held at once
            found.append((m.start(), m.end(), name))
    return found


# a tokenizer's configuration, files or template named right after it ("when tokenizer config omits model_max_length",
# "tokenizer.json", "tokenizer_config.json", "the tokenizer's chat template"): a setting, not the work of tokenising
_TOKENIZER_FILE = re.compile(r"(?<=[Tt]okenizer)(?:'s)?[ \t_.]*(?:config\w*|configuration|json|files?|vocab\w*"
                             r"|templates?|chat[ _]template|model_max_length)\b", re.IGNORECASE)
_TOKENIZER_FILE_WORD = re.compile(r"tokeni[sz]er_config\w*", re.IGNORECASE)  # the word "tokenizer_config(.json)"
# ... unless the clause times that work ("re-read from disk for every request, about 600 ms each")
_TIMED_WORK = re.compile(r"\b\d+(?:\.\d+)?\s*(?:ms|s|sec\w*|seconds?|milliseconds?)\b|\b(?:per|every|each) request",
                         re.IGNORECASE)
# the host spinning (busy-waiting, polling) on the device's completion: a CUDA synchronisation's default spin, the
# CPU core at 100 % while the GPU works ("spin-waits on CUDA synchronization, holding one CPU core at 100% while the
# GPU is busy", "Auto resolves to spin-waiting" beside CUDA contexts, ninfer#301): the GPU sets the pace; no launch
# overhead, no threads contending (the core or thread it names is the spinning one)
_SPIN = r"\b(?:spin(?:s|ning)?(?:[- ]?wait\w*)?|busy[- ]?(?:wait|poll)\w*|poll(?:s|ing)?)\b"
_DEVICE = r"synchroni[sz]\w*|\bsync\b|\bcuda\w*|\bgpu\b|\bthe device\b|\bkernels?\b"
_HOST_SPINS = re.compile(_SPIN, re.IGNORECASE)
_ON_THE_DEVICE = re.compile(_DEVICE, re.IGNORECASE)
# ... the spin right before what it waits on ("spin-waits on CUDA synchronization", "polling the CUDA stream"), or
# the spin-wait itself where the clause is about CUDA ("more CPU cores than active CUDA contexts, Auto resolves to
# spin-waiting"); a concept named outright ("launch overhead dominates", "heavy CPU contention") is never dropped
_SPIN_ON_DEVICE = re.compile(rf"{_SPIN}[^.;,]{{0,30}}?(?:{_DEVICE}|\bstreams?\b|\bevents?\b)", re.IGNORECASE)
_NAMED_OUTRIGHT = re.compile(r"(?:kernel )?launch (?:overhead|latency)|kernel launch\w*|contention|oversubscri\w*"
                             r"|too many threads", re.IGNORECASE)
_HOST_WAIT_VETOES = frozenset({"launch", "contention", "cpu_bound", "cores", "threads"})


# a queue stated as empty right after its word denies it as a negation before it does: "vLLM waiting stays ~0",
# "Waiting: 0 reqs", "queue length stays at 0" (a zero-length wait is no queue; "waiting 0.5 s" is a wait)
_ZEROED = re.compile(r"[\w-]*(?:[ \t:=]+(?:length|size|depth|count|time|stays?|stayed|remains?|remained|is|was|are|"
                     r"were|at|reads?|read|shows?|showed|around|about|near|almost|always|only))*[ \t:=~≈]+0(?:\.0+)?"
                     r"(?:[ \t]*(?:reqs?|requests?|ms|s)\b)?(?![.,:]?\d)"
                     # ... and not where it starts: "0 → 14", "0-3", "0 s at idle and 30 s at peak", "0 then 50"
                     r"(?![^\n]{0,25}?(?:→|->|=>|\bto\b|\bthen\b|\band\b|\bbut\b|[-–—…])\s*~?\d)", re.IGNORECASE)


# models, engines or servers tried in turn, not held at once: a test or comparison right before "two models"
# ("with two models", "split between two models", "across several instances" can be both held at once: not read)
_COMPARED_BEFORE = re.compile(r"\b(?:test(?:ed|ing|s)?|tr(?:y|ied|ying)|compar\w*|benchmark\w*|evaluat\w*"
                              r"|switch\w* between)[ \t]+(?:the[ \t]+|these[ \t]+)?$", re.IGNORECASE)
# ... unless the clause says they ran at once: "testing two models at the same time on one GPU"
_AT_ONCE = re.compile(r"\b(?:at the same time|simultaneous\w*|concurrent\w*|in parallel|together|side by side"
                      r"|shar\w*)\b", re.IGNORECASE)
_SEVERAL = re.compile(r"(?:two|multiple|several|other|second|2nd)[ \t]+(?:models?|engines?|servers?|instances?)\b",
                      re.IGNORECASE)


# (a label's Markdown emphasis and colon between: "- **PCIe:** x4 lanes negotiated", club-3090's rig report)
_LINK_AFTER = re.compile(r"[ \t*_:-]*(?:gen ?[1-6]|[1-6](?:\.0)?(?![.\d])(?!\s*[GMK]i?B)(?!\s*(?:ms|s|us|µs|sec|%))"
                         r"|x(?:1|2|4|8|16)\b"
                         r"|slots?\b|lanes?\b|risers?\b)", re.IGNORECASE)
# ... unless the words after it say what goes over it: "Gen4 PCIe transfers dominate", "the PCIe lanes are saturated"
_COPY_AFTER = re.compile(r"(?:[^.;\n]|\.(?=\d)){0,30}?\b(?:transfers?|bandwidth|traffic|cop(?:y|ies)|throughput"
                         r"|saturat\w*|bottleneck\w*|bound)\b", re.IGNORECASE)
_LINK_BEFORE = re.compile(r"(?:\bgen ?[1-6]|\bx(?:1|2|4|8|16))[ \t-]*$", re.IGNORECASE)


# a thing named, then denied as the cause in the same breath: "the PCIe is also not doing much", "tokenization is not
# the bottleneck", "the copies aren't the issue" (a few words between, no clause boundary)
_NOT_IT = (r"(?:the\s+(?:bottleneck|issue|problem|cause|culprit|limiting factor)|an?\s+(?:bottleneck|issue|problem"
           r"|factor)|doing (?:much|anything)|busy|saturated|involved|to blame|the limit)\b")
# (no other subject between: "GPU utilization is 100% but the CPU is not the bottleneck" denies the CPU, not the GPU)
_GAP = r"(?:(?!\b(?:but|and|while|whereas|though|although|yet|so)\b)[^.;,!?\n]){0,30}?"
_DENIED_AFTER = re.compile(
    rf"{_GAP}\b(?:is|are|was|were|seems?|seemed|looks?|looked)(?:\s+(?:also|really|definitely|clearly"
    rf"|probably|still|actually))?\s+(?:not|never|hardly)(?:\s+(?:really|even))?\s+{_NOT_IT}"
    rf"|{_GAP}\b(?:isn't|aren't|wasn't|weren't|isn’t|aren’t)(?:\s+(?:really|even))?\s+{_NOT_IT}",
    re.IGNORECASE)


def _negated(clause: str, start: int) -> bool:
    return bool(_NEGATION.search(clause[max(0, start - 40):start]))


# a step the text says went well is no complaint about it: "download and load a model fine", "the model loads
# without any issues", "successfully downloaded". Only the words right after it are read, up to what starts another
# statement: a contrast, a clause's punctuation or a dash, a number ("utilization drops to 20% memory-wise fine"
# is a figure, then another thing fine), a complaint ("decode is slow and everything else works fine"), or "and"
# or "as" opening a new subject ("the tokenizer is the bottleneck and the model itself is fine"); and a success
# denied ("never completes successfully", "is not fine") is none.
_FINE = re.compile(r"\b(?:fine(?![-_\w]|[ \t]+tun)|successfully|flawlessly"
                   r"|without (?:any )?(?:issues?|problems?|errors?))", re.IGNORECASE)
_CONTRAST = re.compile(
    r"[,;:.!?()\n\d—–]|[ \t]-[ \t]|\b(?:but|however|though|although|until|unless|except|while|whilst|when|whereas|yet"
    r"|then|only|so|otherwise|besides|apart|other|rest|everything|slow\w*|tak(?:e|es|ing)|took|hangs?|hung|stuck"
    r"|forever|long|bottleneck\w*|high|low|fail\w*|errors?|oom|spikes?|grow\w*|waits?|waiting|lags?)\b"
    r"|\b(?:and|as)[ \t]+(?:the|its?|my|our|their|this|that|all|everything|each|every|other|decode|prefill"
    r"|\w+[ \t]+(?:is|are|was|were|looks?|seems?|stays?))\b", re.IGNORECASE)
_FINE_BEFORE = re.compile(r"\bsuccessfully[ \t]+(?:(?!(?:and|but|then|yet|or)\b)[\w-]+[ \t]+)?$", re.IGNORECASE)
_DENIED = re.compile(r"(?:\b(?:not|never|no|fails?\w*)|n't)(?:[ \t]+\w+)?[ \t]+$", re.IGNORECASE)


def _went_fine(clause: str, start: int, end: int) -> bool:
    after = clause[end:end + 50]
    if (stop := _CONTRAST.search(after)) is not None:
        after = after[:stop.start()]
    said = _FINE.search(after)
    if said is not None and not _DENIED.search(after, 0, said.start()):
        return True
    return bool(_FINE_BEFORE.search(clause, max(0, start - 30), start))


_TOKEN_RATE = re.compile(r"tokens?/s(?:ec)?|toks?/s|t/s|tokens? per second|tokens?/second", re.IGNORECASE)
# what the words just before a token rate call it: prompt processing or generation
_RATE_LABEL = re.compile(r"(?P<prefill>prompt(?:[ _]eval\w*)?|prefill|\bpp\d*\b|input)"
                         r"|(?P<decode>generat\w*|decod\w*|\beval\b|output|completion|\btg\d*\b|response)",
                         re.IGNORECASE)


def _rate_owner(clause: str, q: Quantity) -> str:
    """"prefill" or "decode" when the nearest label within 30 characters before the rate says which."""
    labels = list(_RATE_LABEL.finditer(clause[max(0, q.start - 30):q.start]))
    if not labels:
        return ""
    return "prefill" if labels[-1].group("prefill") else "decode"


# the gap between a label and its value ("queue 47", "queue: 47", "queue=47", "utilization is 20%")
_OWN_VALUE = re.compile(r"[\s:=~]{0,3}(?:(?:is|was|are|were|at|stays|sits|of|around|about|only)[\s:=~]{1,3}){0,3}",
                        re.IGNORECASE)
# a value's own label after a list's separator, right before the value ("+ compute input ", ", decode: "); a
# connective or a qualifier after the separator goes on with the same concept ("TTFT median 120 ms, tail 3.2 s",
# "..., and up to 18 s", "; then 18 s", ", total 36GB")
_SEPARATOR = "+,;(|，；、（｜"
_OWN_LABEL = re.compile(
    rf"[{re.escape(_SEPARATOR)}]\s*(?!(?:and|or|then|but|vs|up|to|while|at|from|total|peak|max|min|tail|avg|mean"
    rf"|median|only|over|around|about|p\d+)\b)[^\W\d_][^\d{re.escape(_SEPARATOR)})]*$", re.IGNORECASE)


_ITEM_SEP = re.compile(rf"[{re.escape(_SEPARATOR)}]")
# what may stand before the value that leads a list's item: nothing, or the item's label ("Speed: ", "TPOT: ")
_ITEM_HEAD = re.compile(r"\s*(?:[^\W\d_][^\d:：]{0,40}[:：]\s*)?")
_ITEM_LABEL = re.compile(r"\s*[^\W\d_]{2,}")  # a word right after the value: its label ("7.6ms inference")
# the label of a stage list's model stage, beside pre- and post-processing, and nothing more than its time or
# what it is per ("inference" alone is no model time: "inference is slow"; "model download" is no stage)
_STAGE_MODEL = re.compile(r"\s*(?:inference|infer|forward|model|predict(?:ion)?)(?:\s+time)?(?:\s+per\b.*)?\s*",
                          re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class Item:
    """A value-first list's item: where it starts and ends, and where the list's heading is (the first item's
    label, "Speed: ")."""

    start: int
    end: int
    heading: tuple[int, int]

    def owns(self, concept: tuple[int, int, str]) -> bool:
        """Whether a concept found at ``concept`` may own the item's value: inside the item, or the heading."""
        return (self.start <= concept[0] and concept[1] <= self.end) or (
            self.heading[0] <= concept[0] and concept[1] <= self.heading[1])


def value_first_items(clause: str, qs: Sequence[Quantity]) -> dict[int, Item]:
    """A list whose items each lead with their value and name it after ("Speed: 0.3ms preprocess, 7.6ms
    inference, 0.8ms postprocess per image", ultralytics' line; "TTFT: 120 ms median, 3.2 s tail"): each
    leading value's start → its item. Such a value is its own item's (its label after it, or before it: "TPOT:
    45 ms median") or the list heading's (the first item's label), never a concept of another item ("7.6ms" is not
    the pre-processing's). Empty unless two items or more have that shape: one value before words after a comma
    ("GPU utilisation is low, 40% most of the time") is no list. A separator inside a value ("1,200ms") cuts
    nothing."""
    cuts = [m.start() for m in _ITEM_SEP.finditer(clause) if not any(q.start <= m.start() < q.end for q in qs)]
    out: dict[int, Item] = {}
    heading: tuple[int, int] | None = None
    i = 0
    for a, b in zip([0, *(x + 1 for x in cuts)], [*cuts, len(clause)], strict=True):
        while i < len(qs) and qs[i].start < a:
            i += 1
        if i == len(qs) or qs[i].start >= b:
            continue
        q = qs[i]
        head = _ITEM_HEAD.match(clause, a, q.start)
        if head is None or head.end() != q.start or not _ITEM_LABEL.match(clause, q.end, b):
            continue
        if heading is None:
            heading = (a, q.start)
        out[q.start] = Item(a, b, heading)
    return out if len(out) >= 2 else {}


def _value_between(starts: list[int], a: int, b: int) -> bool:
    i = bisect.bisect_left(starts, a)
    return i < len(starts) and starts[i] < b


def _nearest(found: list[tuple[int, int, str]], q: Quantity, values: Sequence[tuple[int, str]] = (),
             clause: str = "", memory: Sequence[tuple[int, int, bool]] = (),
             memory_values: frozenset[int] = frozenset()) -> str | None:
    """The concept named closest to ``q`` within ``BIND_WINDOW`` characters (before it wins a tie).

    In a list of labelled values ("latency 521936 usec (overhead 364 usec + queue 47 usec + compute input
    95572 usec") each label owns the value right after it. So a concept after ``q`` owns it only when
    none of the clause's other values (``values``: each one's start and kind, in order) stands between them
    and the concept's own value does not follow it ("queue 47"); and a concept before ``q`` does not own
    it past another value when ``q`` has a label of its own after a list's separator ("+ compute input
    95572"). A value read past another with no label of its own stays the concept's ("TTFT from 136ms to
    18.8s")."""
    best: tuple[int, int, str] | None = None
    past = False  # whether the best concept reaches q past another value
    starts = [at for at, _ in values]  # q's own start among them is never inside the spans searched below
    for start, end, name in found:
        if name in ("gpu", "cpu", "slow", "batch", "saturated", "vram"):
            continue  # too broad to own a number on their own (or a number is part of its match)
        kinds = ACCEPTS.get(name)
        if kinds is not None and q.dim not in kinds:
            continue
        if kinds is None and q.dim == "bare":
            continue
        if end <= q.start:
            dist = q.start - end
            if dist and _value_between(starts, end, q.start) and _OWN_LABEL.search(clause, end, q.start):
                continue  # q is another label's value
        elif start >= q.end:
            nxt = bisect.bisect_left(starts, q.end)
            if nxt < len(starts) and (starts[nxt] < start or (
                    (kinds is None or values[nxt][1] in kinds) and starts[nxt] not in memory_values
                    and _OWN_VALUE.fullmatch(clause, end, starts[nxt]))):
                continue  # another value stands between them, or the concept's own value (of its kinds) follows it
            dist = start - q.end + 1  # a concept after the number: slightly further
        else:
            dist = 0
        if dist <= BIND_WINDOW and (best is None or dist < best[0]):
            best = (dist, start, name)
            past = end <= q.start and _value_between(starts, end, q.start)
    if best is not None and q.dim == "pct" and memory:
        mem = _memory_distance(memory, q, starts, clause, qualified=past)
        if mem is not None and mem <= best[0]:
            return None  # memory's percentage, not a utilisation's (a tie goes to memory: it labels the value)
    return best[2] if best else None
