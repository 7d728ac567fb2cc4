"""Rule pages from the rules' docstrings: the catalogue, one page per rule, docs/rules/*.md."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys

from diagnose.errors import DiagnoseError
from diagnose.rules.base import Rule
from diagnose.rules.registry import RULES, lookup

SECTIONS = ("What it detects", "Why it matters", "How it decides", "Evidence", "Fix", "False positives")


def category_of(rule: type[Rule]) -> str:
    """The rule's category, or "note" for a rule that only writes informational notes."""
    return rule.category.value if rule.category is not None else "note"


def sections(rule: type[Rule]) -> dict[str, str]:
    """The fixed sections of a rule's docstring, by heading."""
    doc = inspect.cleandoc(rule.__doc__ or "")
    out: dict[str, str] = {"summary": doc.split("\n\n", 1)[0].strip()}
    current = ""
    for para in doc.split("\n\n")[1:]:
        head, sep, rest = para.partition(":")
        if sep and head.strip() in SECTIONS:
            current = head.strip()
            out[current] = " ".join(rest.split())
        elif current:
            out[current] += "\n\n" + " ".join(para.split())
    return out


def thresholds_table(rule: type[Rule]) -> list[tuple[str, object, str]]:
    """(name, default, why) for each threshold; the why is the field's trailing comment."""
    src = inspect.getsource(rule.Thresholds)
    why: dict[str, str] = {}
    for line in src.splitlines():
        name, _, rest = line.strip().partition(":")
        if "#" in rest:
            why[name.strip()] = rest.split("#", 1)[1].strip()
    return [(f.name, f.default, why.get(f.name, "")) for f in dataclasses.fields(rule.Thresholds)]


def page(rule: type[Rule]) -> str:
    s = sections(rule)
    lines = [f"# {rule.code} {rule.name}", "", s["summary"], "",
             f"- category: `{category_of(rule)}`",
             f"- requires: {', '.join(f'`{k}`' for k in rule.requires) or '—'}"]
    if rule.requires_any:
        lines.append("- requires one of: " + "; ".join(" + ".join(f"`{k}`" for k in g) for g in rule.requires_any))
    lines.append(f"- optional: {', '.join(f'`{k}`' for k in rule.optional) or '—'}")
    for head in SECTIONS:
        lines += ["", f"## {head}", "", s.get(head, "(not documented)")]
    lines += ["", "## Thresholds", "", f"Override with `diagnose … --config FILE` (or `$DIAGNOSE_CONFIG`), a TOML "
              f"file with a `[rules.{rule.code}]` table; `disable = [\"{rule.code}\"]` switches the rule off "
              "(README, *Configuration*).",
              "", "| name | default | why |", "|---|---|---|"]
    for name, default, why in thresholds_table(rule):
        lines.append(f"| `{name}` | {default} | {why} |")
    example = example_json(rule)
    if example:
        lines += ["", "## Example", "",
                  f"`diagnose analyze --format json` on this rule's positive fixture "
                  f"(`tests/data/rules/{rule.code}/positive.json`), judged by this rule alone:", "",
                  "```json", example, "```"]
    return "\n".join(lines) + "\n"


FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "tests", "data", "rules")


def example_json(rule: type[Rule]) -> str:
    """The diagnosis fields a user reads first (verdict, primary, probability, the differential, next steps,
    the finding) for the rule's positive fixture, or "" when the fixture is not there (an installed package
    without its tests). The verdict is calibrated as ``diagnose.pipeline.judge`` does it: below the
    threshold it is withheld (undetermined) and the candidates' checks lead the next steps."""
    from diagnose.model import Diagnosis, Evidence, EvidenceSet
    from diagnose.rules import calibration
    from diagnose.rules.engine import run_rules
    from diagnose.rules.verdict import decide

    path = os.path.join(FIXTURES, rule.code, "positive.json")
    if not os.path.exists(path):
        return ""
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    ev = EvidenceSet(Evidence.from_json(e) for e in doc["evidence"])
    findings, _ = run_rules(ev, rules=[rule], decide=False)
    verdict, steps, judged, withheld = calibration.settle(ev, findings, *decide(ev, findings))
    d = Diagnosis(findings=findings, verdict=verdict, next_steps=steps, probability=judged.probability,
                  candidates=judged.candidates, withheld=withheld).to_json()
    keep = ("code", "category", "severity", "confidence", "title", "message", "impact")
    out = {"verdict": d["verdict"], "primary": d["primary"], "probability": d["probability"], "answer": d["answer"],
           "candidates": d["candidates"], "next_steps": d["next_steps"],
           "findings": [{k: f[k] for k in keep} for f in d["findings"]]}
    return json.dumps(out, indent=2, ensure_ascii=False)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def activities_page() -> str:
    """docs/activities.md: the stack-classification table, generated from the code."""
    from diagnose.derive import activities

    doc = inspect.cleandoc(activities.__doc__ or "")
    lines = ["# Activities: how a sampled stack is classified", "", doc, "",
             "| activity | file pattern | function pattern | what |", "|---|---|---|---|",
             f"| `{activities.COMPILE.activity.value}` (any frame leafward of running compiled code) | "
             f"`{_cell(activities.COMPILE.file)}` | | {activities.COMPILE.note} |",
             f"| (stops the compile search) | `{_cell(activities.RUNS_COMPILED.file)}` | | "
             f"{activities.RUNS_COMPILED.note} |"]
    for p in activities.PATTERNS:
        lines.append(f"| `{p.activity.value}` | `{_cell(p.file or '(any)')}` | `{_cell(p.function or '(any)')}` "
                     f"| {p.note} |")
    return "\n".join(lines) + "\n"


def waits_page() -> str:
    """docs/waits.md: the wall-clock classification tables, generated from the code."""
    from diagnose.derive import activities, waits

    doc = inspect.cleandoc(waits.__doc__ or "")
    lines = ["# Waits: what a request thread's wall-clock time went to", "", doc, "",
             "## Serving a request (`ENTRY_PATTERNS`)", "",
             "| file pattern | function pattern | unless the next frame is | what |", "|---|---|---|---|"]
    for e in waits.ENTRY_PATTERNS:
        lines.append(f"| `{_cell(e.file or '(any)')}` | `{_cell(e.function or '(any)')}` | "
                     f"{'`' + _cell(e.parked) + '`' if e.parked else ''} | {e.note} |")
    lines += ["", "## Waiting in Python-level machinery (`WAIT_PATTERNS`, the outermost frame decides)", "",
              "| class | file pattern | function pattern | what |", "|---|---|---|---|"]
    for w in waits.WAIT_PATTERNS:
        lines.append(f"| `{w.wait.value}` | `{_cell(w.file or '(any)')}` | `{_cell(w.function or '(any)')}` "
                     f"| {w.note} |")
    lines += ["", "## Blocked in a C call: the source line says (`SOURCE_PATTERNS`)", "",
              "| class | source-line pattern | what |", "|---|---|---|"]
    for p in waits.SOURCE_PATTERNS:
        lines.append(f"| `{p.wait.value}` | `{_cell(p.line)}` | {p.note} |")
    lines += ["", "## Child processes that are compilers (`activities.COMPILER_PROCESSES`)", "",
              "Their CPU counts as compilation of their parent (`compile.children_cpu_s`), and a request "
              "thread waiting for a child while compilers run is `compile`, not `child_wait`.", "",
              "| process name | command | what |", "|---|---|---|"]
    for c in activities.COMPILER_PROCESSES:
        lines.append(f"| `{_cell(c.name or '(any)')}` | `{_cell(c.command or '(any)')}` | {c.note} |")
    return "\n".join(lines) + "\n"


def write_docs(docs_root: str) -> list[str]:
    """Write ``docs_root/rules/*.md`` (one page per rule, plus an index), ``docs_root/activities.md`` and
    ``docs_root/waits.md``."""
    folder = os.path.join(docs_root, "rules")
    os.makedirs(folder, exist_ok=True)
    written = []
    index = ["# Rules", "", "| code | name | category | summary |", "|---|---|---|---|"]
    for r in RULES:
        path = os.path.join(folder, f"{r.code}.md")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(page(r))
        written.append(path)
        index.append(f"| [{r.code}]({r.code}.md) | {r.name} | `{category_of(r)}` | {sections(r)['summary']} |")
    with open(os.path.join(folder, "README.md"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(index) + "\n")
    path = os.path.join(docs_root, "activities.md")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(activities_page())
    waits_path = os.path.join(docs_root, "waits.md")
    with open(waits_path, "w", encoding="utf-8") as fh:
        fh.write(waits_page())
    return [*written, path, waits_path]


def print_rules(code: str | None, fmt: str) -> int:
    if code:
        rule = lookup(code)
        if rule is None:
            raise DiagnoseError(f"there is no rule {code!r}.", "Run `diagnose rules` for the list.")
        if fmt == "json":
            print(json.dumps({"code": rule.code, "name": rule.name, "category": category_of(rule),
                              "requires": list(rule.requires), "optional": list(rule.optional),
                              "sections": sections(rule),
                              "thresholds": [{"name": n, "default": d, "why": w}
                                             for n, d, w in thresholds_table(rule)]}, indent=2))
        else:
            sys.stdout.write(page(rule))
        return 0
    if fmt == "json":
        print(json.dumps([{"code": r.code, "name": r.name, "category": category_of(r),
                           "summary": sections(r)["summary"]} for r in RULES], indent=2))
        return 0
    for r in RULES:
        print(f"{r.code}  {r.name:<32} {category_of(r):<24} {sections(r)['summary']}")
    return 0


if __name__ == "__main__":
    for p in write_docs(sys.argv[1] if len(sys.argv) > 1 else "docs"):
        print(p)
