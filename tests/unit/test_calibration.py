"""The calibrated probability, committing only when sure, and the differential (``diagnose.rules.calibration``)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pathlib
import random
import sys

import pytest

from diagnose import loose, pipeline
from diagnose.model import Candidate, Diagnosis, EvidenceSet, Verdict
from diagnose.rules import calibration, calibration_fit, differential, memory
from diagnose.rules.calibration_fit import Row
from tests.verdicts import committed_as_calibrated

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SESSIONS = os.path.join(ROOT, "tests", "data", "sessions")


def _judge(text: str) -> Diagnosis:
    res = loose.analyze_stream("paste", io.BufferedReader(io.BytesIO(text.encode())))
    return pipeline.judge(EvidenceSet(res.evidence))


TWO_CAUSES = ("My vLLM server is slow, time to first token is several seconds when many users send long prompts. "
              "I think requests are waiting in the queue.\n")
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
       "23.65 GiB of which 1.2 GiB is free. Of the allocated memory 20.1 GiB is allocated by PyTorch, and 1.5 GiB "
       "is reserved by PyTorch but unallocated.\n")


def d_evidence(d: Diagnosis) -> EvidenceSet:
    return EvidenceSet(d.evidence)


def test_a_paste_that_names_two_causes_shows_both_and_the_check_between_them() -> None:
    d = _judge(TWO_CAUSES)
    cats = [c.category for c in d.candidates]
    assert cats[:2] == ["queueing", "prefill_ttft"], cats
    pair = differential.PAIRS[frozenset({"queueing", "prefill_ttft"})]
    assert d.candidates[0].check == pair and "queue time against prefill time" in pair
    assert all("only the report's wording says so" in " ".join(c.against) for c in d.candidates[:2])
    assert committed_as_calibrated(d)
    assert d.overall is (Verdict.UNDETERMINED if d.withheld else Verdict.BOTTLENECK)
    # withheld, its first next step is that check
    judged = calibration.assess(d_evidence(d), d.findings, Verdict.BOTTLENECK)
    unsure = calibration.Assessment(judged.answer, judged.probability, False, judged.regime, judged.candidates)
    assert calibration.next_steps(unsure, ())[0] == f"To tell queueing from prefill_ttft: {pair}"


def test_the_differential_is_at_most_three_best_first_and_sums_to_at_most_one() -> None:
    for text in (TWO_CAUSES, OOM):
        d = _judge(text)
        probs = [c.probability for c in d.candidates]
        assert 1 <= len(probs) <= calibration.MAX_CANDIDATES
        assert probs == sorted(probs, reverse=True), probs
        assert sum(probs) <= 1.0 + 1e-6 and all(c.check for c in d.candidates)
        assert d.candidates[0].probability == d.probability


def test_the_differential_rounded_still_sums_to_at_most_one_and_keeps_the_answers_probability() -> None:
    # 0.9126 + 0.0726 + 0.0148 = 1.0 rounds to 0.913 + 0.073 + 0.015 = 1.001: the smallest gives the thousandth back
    assert calibration._rounded([0.9126, 0.0726, 0.0148], keep=0) == [0.913, 0.073, 0.014]
    # the answer last (withheld, outweighed): its probability is the verdict's, the one above it gives, in order
    assert calibration._rounded([0.4006, 0.3006, 0.2988], keep=2) == [0.401, 0.3, 0.299]
    assert calibration._rounded([0.5, 0.3, 0.2], keep=0) == [0.5, 0.3, 0.2]  # nothing to take back
    # more than one in all (the findings' floor over the report model's own): shares of one, in order
    assert calibration._rounded([0.97, 0.05, 0.05], keep=None) == [0.907, 0.047, 0.046]


SETTLED = ("Measured prefill on our box: the target is already met.\n\n| prompt | wall | rate |\n|---|---|---|\n"
           "| 512 tokens | 1.1s | **465 tok/s** |\n| 2048 tokens | 3.9s | **525 tok/s** |\n\n"
           "That accounts for the TTFT we saw; nothing needs fixing, this is normal and expected behaviour.\n")


def test_a_withheld_answer_the_others_outweigh_is_not_first_and_the_verdict_says_what_leads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The findings point to prefill, the calibrated probability is under the rest's share (set here: what the
    fitted weights give this case moves with every refit): the differential is best first (the answer second),
    the verdict's probability stays the withheld answer's, and the verdict's words name what the differential
    leads with."""
    from diagnose.reports.wording import undetermined_text

    monkeypatch.setattr(calibration.Calibrator, "excerpt", lambda self, x: 0.3)
    d = _judge(SETTLED)
    probs = [c.probability for c in d.candidates]
    assert d.verdict is Verdict.UNDETERMINED and d.leading is not None and d.leading.value == "prefill_ttft"
    assert probs == sorted(probs, reverse=True) and d.candidates[0].category == "none", d.candidates
    assert d.candidates[1].category == "prefill_ttft" and d.candidates[1].probability == d.probability
    doc = d.to_json()  # the JSON names the answer the probability is of: not the first candidate here
    assert doc["primary"] is None and doc["answer"] == "prefill_ttft" and doc["probability"] == d.probability
    assert Diagnosis.from_json(doc).answer == "prefill_ttft"
    text = undetermined_text(d)
    assert text.startswith("the findings point to prefill_ttft, but at ")
    assert f"the differential leads with none ({round(100 * d.candidates[0].probability)} %)" in text, text
    from diagnose.watch import verdict_line  # diagnose watch's line for a capture says the same

    assert verdict_line(d) == (f"undetermined (withheld: prefill_ttft, p {d.probability:.2f}; the differential "
                               f"leads with none, p {d.candidates[0].probability:.2f})")


def test_a_known_confusion_with_nothing_for_it_never_passes_a_measured_finding(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Thermal throttling measured by NVML (GPU003's fixture, judged by that rule alone), withheld at under a half
    (set here: the fitted weights move with every refit): its only other candidate is the answer's known
    confusion, which nothing named. It follows the answer, its share capped at the answer's, however much of the
    rest it would take (rule docs before: launch overhead first at 55 % with nothing for it)."""
    monkeypatch.setattr(calibration.Calibrator, "excerpt", lambda self, x: 0.3)
    from diagnose.model import Evidence
    from diagnose.rules.engine import run_rules
    from diagnose.rules.gpu import GpuThrottling
    from diagnose.rules.verdict import decide

    with open(os.path.join(ROOT, "tests", "data", "rules", "GPU003", "positive.json"), encoding="utf-8") as fh:
        ev = EvidenceSet(Evidence.from_json(e) for e in json.load(fh)["evidence"])
    findings, _ = run_rules(ev, rules=[GpuThrottling], decide=False)
    verdict, _, judged, withheld = calibration.settle(ev, findings, *decide(ev, findings))
    assert withheld and verdict is Verdict.UNDETERMINED and judged.probability < 0.5  # the case at stake
    first, *rest = judged.candidates
    assert first.category == "gpu_compute" and first.probability == judged.probability and first.support
    assert rest and all(not c.support and c.probability <= first.probability for c in rest), judged.candidates
    assert sum(c.probability for c in judged.candidates) <= 1.0 + 1e-6


def test_an_oom_answer_keeps_its_siblings_in_the_differential() -> None:
    """The other causes of an OOM follow its answer; one the message's own numbers rule out (1.5 GiB cached, 2 GiB
    asked: no fragmentation) gives its place to one they do not."""
    d = _judge(OOM)
    assert d.leading is not None and d.leading.value == "oom_peak"
    cats = [c.category for c in d.candidates]
    assert cats == ["oom_peak", "oom_weights", "oom_external"], cats
    assert committed_as_calibrated(d)
    ev = d_evidence(d)
    assert [c for c, _ in calibration._others(d.findings, "oom_peak", None, memory.oom_numbers(ev))][-1] == \
        "oom_fragmentation"
    _, against = calibration._for_against(ev, d.findings, "oom_fragmentation", None)
    assert "the allocator held only 1.50 GiB reserved but unallocated, less than the 2.00 GiB" in " ".join(against)


def _mem(**values: float) -> EvidenceSet:
    from diagnose.model import Evidence

    return EvidenceSet(Evidence(f"mem.{k}", v, "", "t") for k, v in values.items())


def test_the_allocators_numbers_order_an_ooms_other_causes() -> None:
    """What the numbers say of each cause no rule named (``memory.oom_numbers``) orders the differential: a share
    held outside the process (SGLang on a 24 GiB card, mineru#3418: 23.49 GiB, 55 MiB free, 22.31 GiB this
    process's) puts another process ahead of the causes only the words weigh; weights beyond the share an engine
    was given (7B at 4 bits with vLLM's --gpu-memory-utilization 0.1 on a T4, vllm#7028) speak for them, weights
    under half of it against, and a cache smaller than the request against fragmentation."""
    G = float(1 << 30)
    sglang = memory.oom_numbers(_mem(oom_count=1, device_total_bytes=23.49 * G, device_free_bytes=55.38 * (1 << 20),
                                     process_used_bytes=22.31 * G, requested_bytes=42 * (1 << 20),
                                     reserved_minus_allocated_bytes=303.36 * (1 << 20)))
    assert sglang["oom_external"][0] and "1.13 GiB (5 %) of the 23.49 GiB device" in sglang["oom_external"][1]
    assert "oom_fragmentation" not in sglang  # 303 MiB cached: more than the 42 MiB asked, too little to matter
    leaning = {"oom_peak": 0.6, "oom_weights": 0.2, "oom_fragmentation": 0.13, "oom_external": 0.04, "none": 0.05}
    assert [c for c, _ in calibration._others((), "oom_peak", leaning, sglang)] == [
        "oom_external", "oom_weights", "oom_fragmentation", "none"]
    # a cause the numbers rule out follows even what is no OOM cause at all
    ruled = {**sglang, "oom_weights": (False, "small")}
    assert [c for c, _ in calibration._others((), "oom_peak", leaning, ruled)][-1] == "oom_weights"
    t4 = memory.oom_numbers(_mem(oom_count=1, device_total_bytes=16 * G, gpu_memory_utilization_ratio=0.1,
                                 weights_estimate_bytes=3.5e9))
    assert t4["oom_weights"][0] and "gpu_memory_utilization=0.1" in t4["oom_weights"][1]
    small = memory.oom_numbers(_mem(oom_count=1, device_total_bytes=80 * G, weights_estimate_bytes=14e9,
                                    device_free_bytes=0.1 * G, process_used_bytes=79.9 * G))
    assert small["oom_weights"][0] is False and small["oom_external"][0] is False
    assert memory.oom_numbers(_mem(device_total_bytes=80 * G, weights_estimate_bytes=14e9)) == {}  # no OOM


def test_the_report_model_ranks_the_other_candidates_and_siblings_stand_in_without_it() -> None:
    """With a report model's view, the candidates after the answer follow it (a category it gives almost
    nothing is not listed, whatever the fixed list of confusions says), an OOM answer's own family first;
    without one (no report's cues), the answer's known confusions are the differential."""
    leaning = {"queueing": 0.5, "none": 0.3, "oom_external": 0.15, "prefill_ttft": 0.02, "oom_peak": 0.01,
               "launch_overhead": 0.04}
    ranked = [c for c, _ in calibration._others((), "queueing", leaning)]
    assert ranked == ["none", "oom_external", "launch_overhead"], ranked  # not prefill_ttft, its sibling, at 2 %
    oom = [c for c, _ in calibration._others((), "oom_weights", leaning)]
    assert oom[:2] == ["oom_external", "oom_peak"] and oom[2:] == ["queueing", "none", "launch_overhead"], oom
    assert [c for c, _ in calibration._others((), "oom_peak", None)] == list(differential.SIBLINGS["oom_peak"])


def test_an_oom_answers_other_causes_come_before_a_weaker_finding_of_another_kind() -> None:
    """Two vLLM instances started together on one GPU: a profiling OOM read as a runtime peak, and the report's
    "one at a time" read as queueing (a finding). That finding took a slot ahead of every other cause of the
    OOM, so another process's memory, the truth, was not among the three. Another cause a finding names comes
    first; another finding's category competes with the causes the report's words weigh, by weight."""
    from diagnose.model import Category, Confidence, Finding, Severity

    def found(code: str, category: Category, confidence: Confidence = Confidence.HEURISTIC) -> Finding:
        return Finding(code, code.lower(), category, Severity.CRITICAL, confidence, "t", "m", 0.5)

    leaning = {"oom_peak": 0.5, "oom_external": 0.2, "queueing": 0.12, "oom_fragmentation": 0.1,
               "oom_weights": 0.03, "launch_overhead": 0.02, "none": 0.03}
    queue = [found("QUE005", Category.QUEUEING), found("GPU110", Category.LAUNCH_OVERHEAD)]
    ranked = [c for c, _ in calibration._others(queue, "oom_peak", leaning)]
    assert ranked[:3] == ["oom_external", "queueing", "oom_fragmentation"], ranked
    # a cause a finding names leads, however little the words weigh it; a heavier finding of another kind
    # still passes the causes only the words weigh
    frag = [found("MEM009", Category.OOM_FRAGMENTATION), found("QUE005", Category.QUEUEING)]
    heavy = {**leaning, "queueing": 0.3, "oom_fragmentation": 0.01}
    assert [c for c, _ in calibration._others(frag, "oom_peak", heavy)][:3] == [
        "oom_fragmentation", "queueing", "oom_external"]
    # without the report model's view the answer's known confusions stand in, weighed the same way against a
    # finding's score: a weak queueing finding follows them, a strong one passes them
    for impact, want in ((0.02, ["oom_fragmentation", "oom_weights", "queueing"]),
                         (0.9, ["oom_fragmentation", "queueing", "oom_weights"])):
        weak = [found("MEM009", Category.OOM_FRAGMENTATION),
                dataclasses.replace(found("QUE005", Category.QUEUEING), impact=impact)]
        assert [c for c, _ in calibration._others(weak, "oom_peak", None)] == want, impact


def test_a_report_naming_no_counted_concept_gets_a_differential_from_its_words_only() -> None:
    """A person's text that names no concept the claims parser counts (no queue, no memory, no GPU) is too
    little for a report rule to answer on, but its words still rank the differential: the report model
    weighs them (``report.words``) for the candidates, never for the calibrator, which was fitted without."""
    text = ("Two workflows sent through the API never run at the same time\n"
            "The second one always starts after the first one completed, they are unable to run together.\n")
    d = _judge(text)
    ev = d_evidence(d)
    assert "report.words" in ev and "report.cues" not in ev
    assert d.overall is Verdict.UNDETERMINED and not d.findings and d.probability is None
    assert 1 <= len(d.candidates) <= calibration.MAX_CANDIDATES
    assert all(c.support and c.support[0].startswith("the report's wording leans to it") for c in d.candidates)
    assert calibration.lean(ev, d.findings) is None  # what the calibrator weighs is unchanged
    ranked = calibration.lean(ev, d.findings, words=True)
    assert ranked is not None and [c.category for c in d.candidates] == sorted(
        (c.category for c in d.candidates), key=lambda c: -ranked[c])
    # a text that names a counted concept has cues, not bare words
    assert "report.words" not in d_evidence(_judge(TWO_CAUSES))
    # words that do not move the model from what it says without them rank nothing: no differential
    empty = _judge("Any ideas? Thanks\n")
    assert not empty.findings and not empty.candidates
    # and a program's text gives no words at all (a traceback's message is not a person's report)
    assert "report.words" not in d_evidence(_judge("RuntimeError: the worker failed on the second request\n"))


def test_candidates_round_trip_through_json_and_follow_the_schema() -> None:
    d = _judge(TWO_CAUSES)
    doc = d.to_json()
    assert doc["probability"] == d.probability and len(doc["candidates"]) == len(d.candidates)
    assert set(doc["candidates"][0]) == {"category", "probability", "for", "against", "check"}
    back = Diagnosis.from_json(json.loads(json.dumps(doc)))
    assert back.candidates == d.candidates and back.probability == d.probability
    assert back.withheld == d.withheld and back.primary == d.primary
    jsonschema = pytest.importorskip("jsonschema")
    with open(os.path.join(ROOT, "analyzer", "diagnosis.schema.json"), encoding="utf-8") as fh:
        jsonschema.validate(doc, json.load(fh))
    assert Candidate.from_json(doc["candidates"][0]) == d.candidates[0]


def test_a_session_whose_measurements_cover_the_service_commits_at_the_recordings_rate() -> None:
    d = pipeline.analyze([os.path.join(SESSIONS, "prefill_long_prompts_demo")])
    cal = calibration.calibrator()
    assert cal is not None and d.primary is not None and d.primary.value == "prefill_ttft"
    assert d.probability == cal.covered_p >= calibration_fit.PRECISION and not d.withheld
    # one rate for every covered answer commits at the target itself; an excerpt needs the threshold
    assert cal.commits("covered", calibration_fit.PRECISION) and not cal.commits("covered", 0.89)
    assert cal.commits("excerpt", cal.threshold) and not cal.commits("excerpt", cal.threshold - 0.01)


def test_a_finding_that_speaks_more_strongly_is_trusted_more() -> None:
    """The answering finding's impact is one of the calibrator's inputs (out of fold on train it separated
    right from wrong answers better: AUC 0.725 -> 0.764); a stronger finding of the same rule and basis gets
    the higher probability."""
    d = _judge(OOM)
    top = d.findings[0]
    x = calibration.features("oom_peak", top, d.findings, None)
    assert x["impact"] == top.impact > 0
    weaker = calibration.features("oom_peak", dataclasses.replace(top, impact=top.impact / 2), d.findings, None)
    cal = calibration.calibrator()
    assert cal is not None and cal.excerpt(x) > cal.excerpt(weaker)
    assert calibration.features("none", None, (), None)["impact"] == 0.0


def test_prose_never_lowers_a_structured_answer() -> None:
    """Measured evidence outranks prose: the report model leaning elsewhere does not take from it."""
    d = _judge(OOM)
    top = d.findings[0]
    agree = calibration.features("oom_peak", top, d.findings, {"oom_peak": 0.9, "queueing": 0.1})
    against = calibration.features("oom_peak", top, d.findings, {"oom_peak": 0.01, "queueing": 0.99})
    silent = calibration.features("oom_peak", top, d.findings, None)
    cal = calibration.calibrator()
    assert cal is not None
    assert cal.excerpt(against) >= cal.excerpt(silent) - 0.05  # only the small "lean known" term may differ
    assert cal.excerpt(agree) > cal.excerpt(against)
    assert against["struct_logit"] == 0.0 and agree["struct_logit"] > 0.0


def test_the_threshold_is_the_lowest_that_commits_with_a_standard_error_to_spare() -> None:
    # 140 answers: the top 80 by probability are 78 right, the next 60 are half right
    ps = [0.99 - 0.001 * i for i in range(80)] + [0.6 - 0.001 * i for i in range(60)]
    right = [i not in (5, 60) for i in range(80)] + [i % 2 == 0 for i in range(60)]
    t = calibration_fit.choose_threshold(ps, right)
    committed = [r for p, r in zip(ps, right, strict=True) if p >= t]
    # down to 0.60 (81 answers, 79 right); at 0.59 ten coin flips more make 84 of 91 (92 %): above the
    # target, but not by a standard error (its Wilson bound is 0.89)
    assert t == 0.6 and len(committed) == 81 and sum(committed) == 79
    below = [r for p, r in zip(ps, right, strict=True) if p >= 0.59]
    assert sum(below) / len(below) >= calibration_fit.PRECISION > calibration_fit.wilson_low(sum(below), len(below), 1)
    assert calibration_fit.choose_threshold([0.9] * 40, [False] * 40) == 1.0  # never precise: never commit
    # two wrong among the top 34 (94 %, Wilson bound 0.89) and 60 right below them: the margin is asked of
    # what is committed (all 94 rows, 92 right), not of the thinner top, which would forbid committing at all
    ps = [0.975 - 0.001 * i for i in range(34)] + [0.935 - 0.0005 * i for i in range(60)]
    right = [i not in (0, 20) for i in range(34)] + [True] * 60
    assert calibration_fit.wilson_low(32, 34, 1) < calibration_fit.PRECISION
    t = calibration_fit.choose_threshold(ps, right)
    assert t < 0.9 and sum(p >= t for p in ps) == 94
    # three out-of-fold runs of the same cases pooled: the precision of all three, the margin of one run's count.
    # 45 answers, 42 right (93 %): one standard error below is 0.886 for 45 cases, 0.909 if counted as 135
    few = [0.97 - 0.001 * i for i in range(45)] + [0.6 - 0.001 * i for i in range(20)]
    hit = [i not in (3, 33, 40) for i in range(45)] + [False] * 20
    once = calibration_fit.choose_threshold(few, hit)
    assert once > 0.9 and calibration_fit.choose_threshold(few * 3, hit * 3, copies=3) == once
    assert calibration_fit.choose_threshold(few * 3, hit * 3) < 0.62  # counted thrice, all 45 would commit
    # but a top whose own precision is below the target is never committed past
    right = [i not in (0, 5, 10, 20) for i in range(34)] + [True] * 60
    assert calibration_fit.choose_threshold(ps, right) == 1.0


def test_reliability_states_against_observed_and_the_error() -> None:
    table, ece = calibration_fit.reliability([0.95, 0.95, 0.55, 0.55], [True, False, True, True])
    assert [(r["bin"], r["n"], r["observed"]) for r in table] == [("0.5-0.6", 2, 1.0), ("0.9-1.0", 2, 0.5)]
    assert ece == pytest.approx(0.5 * 0.45 + 0.5 * 0.45)


def test_the_logistic_fit_learns_which_basis_is_right() -> None:
    rows = [Row(f"s{i}", {"bias": 1.0, "prose": 0.0}, i % 10 != 0) for i in range(100)]
    rows += [Row(f"p{i}", {"bias": 1.0, "prose": 1.0}, i % 2 == 0) for i in range(100)]
    w = calibration_fit.fit_logistic(rows, ["bias", "prose"])
    assert calibration_fit._p(w, {"bias": 1.0, "prose": 0.0}) == pytest.approx(0.9, abs=0.03)
    assert calibration_fit._p(w, {"bias": 1.0, "prose": 1.0}) == pytest.approx(0.5, abs=0.03)


def test_the_shipped_calibration_was_fitted_on_train_for_the_precision_target() -> None:
    with open(calibration.CALIBRATION_PATH, encoding="utf-8") as fh:
        doc = json.load(fh)
    meta = doc["meta"]
    assert meta["fitted_on"] == "tests/data/incidents/train.jsonl" and meta["target_precision"] == 0.9
    assert meta["oof_committed_precision"] >= 0.9 and 0.5 <= doc["threshold"] <= 1.0
    assert doc["covered"]["n"] >= 10 and doc["covered"]["p"] == round((doc["covered"]["right"] + 1)
                                                                      / (doc["covered"]["n"] + 2), 3)
    assert not any("validation" in str(v) for v in meta.values())


def test_the_shipped_weights_are_fitted_on_every_split_pooled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The threshold is chosen on the report model's splits pooled, so the weights are fitted on them pooled
    too, not on the first split's answers alone; each case weighs as one however many splits there are."""
    def run(prose_right: bool) -> list[Row]:
        return ([Row(f"s{i}", {"bias": 1.0, "prose": 0.0}, i % 10 != 0) for i in range(60)]
                + [Row(f"p{i}", {"bias": 1.0, "prose": 1.0}, prose_right) for i in range(60)])

    monkeypatch.setattr(calibration_fit, "covered_rows", lambda: [])
    fitted = {}
    for name, runs in {"one": [run(True)], "same twice": [run(True), run(True)],
                       "split apart": [run(True), run(False)]}.items():
        monkeypatch.setattr(calibration_fit, "oof_rows", lambda path, splits, runs=runs: (runs, 120))
        fitted[name] = calibration_fit.train("train.jsonl")
    assert fitted["same twice"]["weights"] == pytest.approx(fitted["one"]["weights"], abs=1e-3)
    assert fitted["split apart"]["meta"]["answered_rows"] == 120
    assert fitted["split apart"]["meta"]["weights_l2"] == 2 * calibration_fit.L2
    p_prose = calibration_fit._p(fitted["split apart"]["weights"], {"bias": 1.0, "prose": 1.0})
    assert p_prose == pytest.approx(0.5, abs=0.05)  # the first split alone says ~0.98
    assert calibration_fit._p(fitted["one"]["weights"], {"bias": 1.0, "prose": 1.0}) > 0.9


def test_the_report_models_folds_come_from_the_case_ids_not_their_order(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: pathlib.Path) -> None:
    """The regularisation's cross-validation draws its folds from the case ids (``report_fit.fold_of``), as
    the out-of-fold answers do: a case added or the file reordered moves no other case to another fold, so
    the chosen regularisation and its cross-validated accuracy do not move with the order of the rows."""
    from diagnose.derive import claims
    from diagnose.rules import report_fit

    ids = [f"case-{k:03d}" for k in range(60)]
    folds = [report_fit.fold_of(i, 0) for i in ids]
    assert folds == [report_fit.fold_of(i, 0) for i in [*ids, "one-more"]][:60]  # one added moves none
    assert set(folds) == set(range(report_fit.FOLDS)) and folds != [report_fit.fold_of(i, 1) for i in ids]
    classes = ["cpu_preprocessing", "queueing", "oom_weights"]
    rng = random.Random(3)
    rows = []
    for i in ids:  # a cue that mostly names the class, and a third of the labels noise
        k = rng.randrange(3)
        label = classes[k] if rng.random() < 0.67 else rng.choice(classes)
        rows.append((i, {f"c:{k}": 1.0, f"c:noise{rng.randrange(7)}": 1.0}, label, 1.0, [label]))
    shuffled = rows[:]
    rng.shuffle(shuffled)
    monkeypatch.setattr(report_fit, "build_vocabulary", lambda path: frozenset())
    monkeypatch.setattr(claims, "set_vocabulary", lambda words: None)
    monkeypatch.setattr(claims, "VOCABULARY_PATH", str(tmp_path / "vocabulary.txt"))
    metas = []
    for order in (rows, shuffled):  # reversed would only renumber row-order folds
        monkeypatch.setattr(report_fit, "_corpus", lambda path, order=order: tuple(map(list, zip(*order, strict=True))))
        metas.append(report_fit.train("train.jsonl", l2s=(0.003, 0.3)).meta)
    assert len({(m["cross_validated_log_loss"], m["cross_validated_accuracy"], m["l2"]) for m in metas}) == 1


def test_out_of_fold_scoring_answers_each_case_without_its_fold(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: pathlib.Path) -> None:
    """``score.py --out-of-fold``: each fold's cases are answered by a report model fitted on the other folds
    only, every scored case is answered once, and the shipped model is back afterwards."""
    import importlib.util

    from diagnose.rules import report_fit, report_model
    spec = importlib.util.spec_from_file_location("score", os.path.join(ROOT, "tests", "data", "incidents",
                                                                        "score.py"))
    assert spec is not None and spec.loader is not None
    score = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "score", score)  # its dataclass looks its module up there
    spec.loader.exec_module(score)
    with open(os.path.join(ROOT, "tests", "data", "incidents", "train.jsonl"), encoding="utf-8") as fh:
        cases = [json.loads(line) for line in fh][:40]
    corpus = tmp_path / "small.jsonl"
    corpus.write_text("".join(json.dumps(c) + "\n" for c in cases))
    fitted: list[int] = []
    answered: list[tuple[int, list[str]]] = []
    real_fit, real_cases = report_model.fit, score._score_cases
    monkeypatch.setattr(report_model, "fit", lambda xs, *a, **k: fitted.append(len(xs)) or real_fit(xs, *a, **k))
    monkeypatch.setattr(score, "_score_cases", lambda cs, split: (answered.append((len(fitted), [c["id"] for c in cs])),
                                                                  real_cases(cs, split)))
    split = score.score(str(corpus), out_of_fold=True)
    folds = {c["id"]: report_fit.fold_of(c["id"], 0) for c in cases}
    assert len(fitted) == report_fit.FOLDS == len(answered)
    for k, (n_fits, ids) in enumerate(answered):
        assert n_fits == k + 1 and all(folds[i] == k for i in ids)
        trained = sum(1 for c in cases if folds[c["id"]] != k and c["expected_class"] in report_model.CLASSES)
        assert fitted[k] == trained < len(cases)
    assert split.cases == sum(1 for c in cases if c.get("scored", True)) and split.name.endswith("(out of fold)")
    assert report_model._MODEL is None


def test_an_answer_on_the_reports_wording_alone_is_never_committed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report model's lean with nothing the text states, shows or names behind it: withheld however high the
    calibrated probability (vllm#44688: 'waiting stays ~0' beside 72 concurrent requests read as queueing at
    0.96), ranked first in the differential all the same; a cause the report names commits at that probability."""
    from diagnose.rules.report import wording_only

    monkeypatch.setattr(calibration.Calibrator, "excerpt", lambda self, x: 0.99)
    d = _judge("Requests pile up on the server when it gets busy, and responses get slower.\n")
    assert [f.code for f in d.findings] == ["QUE005"] and wording_only(d.findings[0])
    assert d.verdict is Verdict.UNDETERMINED and d.probability == 0.99
    assert d.candidates[0].category == "queueing"
    named = _judge("Responses get slower, and it's due to the requests waiting in the queue at a concurrency of 64.\n")
    assert named.findings[0].code == "QUE005" and not wording_only(named.findings[0])
    assert named.verdict is Verdict.BOTTLENECK and named.primary is not None and named.primary.value == "queueing"


def test_a_healthy_answer_on_the_reports_wording_alone_is_never_committed(monkeypatch: pytest.MonkeyPatch) -> None:
    """'Nothing is wrong' read from the words alone (HLT003's lean, its only finding) is withheld however high the
    probability (a reviewer's case: committed healthy at 0.88)."""
    from diagnose.rules.report import wording_only

    monkeypatch.setattr(calibration.Calibrator, "excerpt", lambda self, x: 0.99)
    d = _judge("High VRAM usage with the vLLM server\nHello, using the same model, the vram stays at 22 GB. Why would "
               "it use the same memory for different prompts?\nThe input data is video; decode runs without error.\n")
    assert d.findings and all(wording_only(f) for f in d.findings)
    assert d.verdict is Verdict.UNDETERMINED and d.candidates[0].category == "none"


def test_the_answer_names_what_the_probability_is_of() -> None:
    """Committed: the primary; healthy: "none"; nothing assessed: null (the schema allows each)."""
    healthy = Diagnosis((), probability=0.93, verdict=Verdict.HEALTHY)
    assert healthy.to_json()["answer"] == "none"
    assert Diagnosis(()).to_json()["answer"] is None
    d = _judge(SETTLED)
    if d.verdict is Verdict.BOTTLENECK:
        assert d.to_json()["answer"] == d.to_json()["primary"] == "prefill_ttft"
    else:
        assert d.to_json()["answer"] == "prefill_ttft" and d.to_json()["primary"] is None
