"""Documented numbers measured at a KV capacity that ``auto`` no longer gives carry a marker (issue 54).

Issue 54 changed ``memory.capacity_tokens=auto`` (kvstudy/costs/capacity.py) to follow vLLM's start-up profiling,
so every ``auto`` capacity moved. The studies that were not re-run (prefix caching, CacheOPT, cluster_mooncake, the
RR-SJF and hardware studies' "before" figures) keep numbers measured at the former capacities. Each section of the
docs that names one of those former capacities must say so in words, ``measured at the earlier capacity``, and give
the override that reproduces it (``memory.capacity_tokens=<the former capacity>``), so that a stale number cannot
come back without the note.

Sections: a markdown heading's text up to the next heading (README.md, docs/*.md; fenced code is not a heading), a
notebook's markdown cell, an experiment config's comment lines (conf/experiment/*.yaml).

The former capacities, from the formula before issue 54 (``git show 4e76044:kvstudy/costs/capacity.py``: the
vendor's GB as 1e9 bytes, a 1.5 GB reserve and a 4,096-token activation pass), each with the setting it belongs
to. ``test_the_former_capacities_are_not_todays`` checks that ``auto`` no longer gives any of them.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKER = "measured at the earlier capacity"

#: former ``auto`` capacity (tokens) -> (model, hardware) it was computed for
FORMER = {
    54073: ("opt_13b", "a100_tp1"),
    412528: ("llama31_8b", "a100_tp1"),
    6205: ("llama2_70b", "a100_tp2"),
    341288: ("llama2_70b", "h200_tp2"),
    83302: ("llama2_70b", "a40_tp4"),
    531575: ("llama32_1b", "l4_tp1"),
    121089: ("opt_13b", "h200_tp1"),
    18916: ("opt_13b", "a40_tp1"),
    44499: ("opt_175b", "a100_tp8"),
}


def _number(n: int) -> str:
    """A regex for ``n`` written with or without thousands commas, not inside a longer number."""
    digits = str(n)
    head, tail = digits[:-3], digits[-3:]
    return rf"(?<![\d,.]){head},?{tail}(?![\d]|,\d)"


FORMER_RE = {n: re.compile(_number(n)) for n in FORMER}


def markdown_sections(text: str):
    """(heading, body) of each heading's section; '#' lines inside fenced code are not headings."""
    sections, heading, body, fenced = [], "(top)", [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and re.match(r"#{1,6} ", line):
            sections.append((heading, "\n".join(body)))
            heading, body = line.strip(), []
        else:
            body.append(line)
    sections.append((heading, "\n".join(body)))
    return sections


def doc_sections():
    """(where, text) of every section the check reads."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for heading, body in markdown_sections(path.read_text(encoding="utf-8")):
            out.append((f"{path.relative_to(ROOT)} {heading}", body))
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for k, cell in enumerate(cells):
            if cell["cell_type"] == "markdown":
                out.append((f"{path.relative_to(ROOT)} cell {k}", "".join(cell["source"])))
    for path in sorted((ROOT / "conf" / "experiment").glob("*.yaml")):
        comments = [line.split("#", 1)[1] for line in path.read_text(encoding="utf-8").splitlines() if "#" in line]
        out.append((str(path.relative_to(ROOT)), "\n".join(comments)))
    return out


def problems(sections):
    """One line per section that names a former capacity without the marker or without its override."""
    found = []
    for where, text in sections:
        named = [n for n, rx in FORMER_RE.items() if rx.search(text)]
        if not named:
            continue
        flat = re.sub(r"\s+", " ", text)
        if MARKER not in flat.lower():
            found.append(f"{where}: names {', '.join(f'{n:,}' for n in named)} without '{MARKER}'")
        overrides = {int(v) for group in re.findall(r"memory\.capacity_tokens=([\d,]+\d)", flat)
                     for v in group.split(",")}
        if not overrides & set(named):
            found.append(f"{where}: names {', '.join(f'{n:,}' for n in named)} but gives no "
                         f"memory.capacity_tokens=<former capacity> override")
    return found


def test_every_section_naming_a_former_capacity_carries_the_marker_and_its_override():
    sections = doc_sections()
    assert sum(any(rx.search(t) for rx in FORMER_RE.values()) for _, t in sections) >= 10  # the check reads them
    assert problems(sections) == []


@pytest.mark.parametrize("text, complaint", [
    ("With the former 412,528 tokens (`memory.capacity_tokens=412528`) it was 4.4%.", f"without '{MARKER}'"),
    ("At 54073 tokens (measured at the earlier\n  capacity) it was 1.2 s.", "no memory.capacity_tokens"),
    ("6,205 tokens, measured at the earlier capacity (`memory.capacity_tokens=auto`).", "no memory.capacity"),
])
def test_the_check_reports_a_section_without_the_marker_or_the_override(text, complaint):
    (line,) = problems([("docs/x.md ## A study", text)])
    assert line.startswith("docs/x.md ## A study: names ") and complaint in line


def test_the_check_accepts_a_marked_section_and_ignores_longer_numbers():
    marked = ("Measured at the earlier capacity (412,528 tokens):\n`python -m kvstudy.reproduce prefix -- "
              "memory.capacity_tokens=131072,262144,412528`.")
    assert problems([("a", marked), ("b", "1,154,073 and 6,2055 and 0.412528 are other numbers")]) == []


def test_headings_inside_code_fences_do_not_split_a_section():
    text = ("## Study\nMeasured at the earlier capacity\n```bash\n# a comment\n```\n"
            "412,528 `memory.capacity_tokens=412528`\n")
    assert [h for h, _ in markdown_sections(text)] == ["(top)", "## Study"]
    assert problems(markdown_sections(text)) == []


@pytest.mark.parametrize("former, setting", sorted(FORMER.items()))
def test_the_former_capacities_are_not_todays(former, setting):
    """Today's ``auto`` for each setting differs: the list above names capacities no run of ``auto`` gives now."""
    from kvstudy.costs.capacity import auto_capacity
    from kvstudy.running.assemble import hardware_spec
    from kvstudy.running.paths import CONF_DIR, load_model_arch
    from omegaconf import OmegaConf

    model, hardware = setting
    hw = hardware_spec(OmegaConf.create({"hardware": OmegaConf.load(CONF_DIR / "hardware" / f"{hardware}.yaml")}))
    today = auto_capacity(load_model_arch(model), hw)
    assert today != former and abs(today - former) / former < 3.5  # the same setting, a different count
