"""Update one section of a RESULTS file, leaving the other sections as they are, and keep the index of sections at
the file's top in step with them.

bench/RESULTS.md (the default) holds this folder's speed and memory benchmarks; studies/RESULTS.md holds the
studies' findings, written through studies/study_results.py with this same function.
"""
from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
from pathlib import Path

from keyheads.io import atomic_write_text, write_json

ROOT = Path(__file__).resolve().parents[1]

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = """# Benchmark results

Speed and memory of keyheads' steps. Each section opens with one line that names the script (or command) behind
its figures, the commit they were measured on ("not measured" for commands not run yet), and the machine. A script
writes that line itself when it runs (`provenance` in bench/results.py: the checkout's commit, with "+ uncommitted
changes" when src/ or bench/ differ from it, and the date). Figures that a script renders from a run's files stand
between markers that name the script, and `tests/test_one_value.py` fails on a figure outside such markers. The
figures once typed in or put together by hand, with no record behind them, are withdrawn ("figures withdrawn" in
a section's first line): such a section says what its benchmark measures and the command that measures it again
(`git show 8577d0a:bench/RESULTS.md` has them as they were). What the studies found (accuracies, effects, tables 1
and 2) is in studies/RESULTS.md.
"""
SECTION = re.compile(r"^## (.+)$", re.M)
INDEX = "Sections:"  # the line that opens the index; the index runs from it to the first section


def anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def with_index(text: str) -> str:
    """`text` with its index rebuilt: one link per `## ` section, in order, between the preamble and the first
    section (a text without sections is returned as it is)."""
    first = SECTION.search(text)
    if first is None:
        return text
    preamble = re.split(rf"^{re.escape(INDEX)}$", text[:first.start()], maxsplit=1, flags=re.M)[0]
    links = "\n".join(f"- [{t}](#{anchor(t)})" for t in SECTION.findall(text))
    return f"{preamble.rstrip()}\n\n{INDEX}\n\n{links}\n\n{text[first.start():]}"


def write_section(title: str, body: str, path: Path = RESULTS, header: str = HEADER) -> None:
    """Replace the section `## title` of `path` with `body` (or add it at the end), and rebuild the index.
    `header` starts a file that does not exist yet."""
    text = path.read_text() if path.exists() else header
    section = f"## {title}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text).rstrip() + "\n"
    else:
        text = text.rstrip() + "\n\n" + section
    atomic_write_text(path, with_index(text))


# A measured section stands between these markers, written from its record (bench/records/NAME.json beside the
# RESULTS file): the figures as the script measured them and the text made of them. tests/test_bench_records.py
# checks that each block is its record's text, and tests/test_one_value.py that no figure stands outside a block.
BEGIN = "<!-- bench record: written by `python -m {module}` into {record} -->"
END = "<!-- end of bench record -->"


def records_folder(path: Path = RESULTS) -> Path:
    """Where the records of the RESULTS file at `path` are kept: bench/records for bench/RESULTS.md."""
    return path.with_name("records")


def block(record: dict) -> str:
    """A measured section's body: its record's text between the markers that name the script and the record."""
    where = f"bench/records/{record['name']}.json"
    return "\n".join([BEGIN.format(module=record["module"], record=where), *record["text"], END])


def publish(title: str, module: str, name: str, figures: dict, text: list[str], path: Path = RESULTS) -> Path:
    """Save one measurement's record (its `figures` and the `text` made of them) as NAME.json in the records folder
    of `path`, then write the section `## title` of `path` from it; -> the record's path."""
    record = {"title": title, "module": module, "name": name, "figures": figures, "text": text}
    saved = records_folder(path) / f"{name}.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    write_json(saved, record)
    write_section(title, block(record), path)
    return saved


def read_section(title: str, path: Path = RESULTS) -> str | None:
    """The body of the section `## title` of `path`, stripped as write_section writes it (None without one)."""
    if not path.exists():
        return None
    found = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", path.read_text(), re.S | re.M)
    return found.group(1).strip() if found else None


def provenance(script: str, machine: str, root: Path | str | None = None) -> str:
    """The line a section opens with: `script` (with its part or flags, as the caller names them), the commit of
    the checkout at `root` (default: this repository) that the figures are measured on, the date, and `machine`.

    The commit reads "+ uncommitted changes" when `git status` shows a change under src/ or bench/ (new files
    included; RESULTS.md and the records aside, which the runs themselves write), and "unknown" outside a checkout.
    """
    root = Path(root) if root is not None else ROOT

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()

    try:
        sha = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--", "src", "bench", ":(exclude)bench/RESULTS.md",
                      ":(exclude)bench/records")
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown (not a git checkout)"
    else:
        commit = sha + (" + uncommitted changes" if changed else "")
    return f"- script: {script}; commit {commit}, run {datetime.date.today().isoformat()}; machine: {machine}"


def machine(device: str = "cpu", threads: int | None = None) -> str:
    """The machine as a provenance line names it: the GPU's name for a CUDA device, else the CPU's architecture,
    model (where /proc/cpuinfo tells it) and cores, and the threads the run used."""
    if device.startswith("cuda"):
        import torch

        return f"one {torch.cuda.get_device_name(device)}"
    if device != "cpu":
        return device
    model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("model name")), "")
    what = ", ".join(x for x in (platform.machine(), model, f"{os.cpu_count()} cores") if x)
    return f"CPU ({what})" + (f", {threads} threads" if threads else "")

