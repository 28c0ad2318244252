"""The report of a program built twice (plain clang, and mlgo-cc with a policy): its size
over every ELF file the build produced, its workload's throughput, its tests, and what
training did; as report.json for machines, report.html with plots for people, and a rich
table for the terminal. However many files the build made, each names the TOP files and
directories that saved most and grew most, with totals; every file is in per_file.json
beside report.json. A tune's also says what it cost (`tune_cost`). `mlgo demo`, `mlgo
build` and `mlgo tune` write it; `mlgo report` shows it again."""

from __future__ import annotations

import html
import json
import os
import resource
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from rich.table import Table

from mlgo.errors import UsageError
from mlgo.llvm.sizes import compare_trees, linked_rows, tree_totals
from mlgo.plots import STYLE, img, png, pyplot
from mlgo.problems import get_problem
from mlgo.programs.build import ProgramBuild
from mlgo.programs.decide import built_from
from mlgo.programs.pgo import hot_departures
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.inputs import read_json

if TYPE_CHECKING:
    from mlgo.programs.tune_run import TuneDir, TuneRun

TOP = 10  # the files, and the directories, a report names by bytes saved and by bytes grown
SHOWN = 3  # of those, the terminal's row names
PER_FILE = "per_file.json"  # beside report.json: every ELF file's .text in both builds
REPORT_KEYS = {"package", "policy", "size", "tests"}


def size_report(pair, trees: dict[str, Path]) -> dict:
    """.text of every ELF file both builds produced (objects, libraries, programs), of the
    linked ones alone (programs and shared libraries), and of the recipe's named programs;
    the files and directories that changed most (`top_changes`), and every file (written
    apart: `write_report`)."""
    plain, ml = pair
    rows = compare_trees(trees["mlgo"], trees["plain"])
    total = tree_totals(rows)
    linked = linked_rows(rows)
    linked_total = tree_totals(linked)
    per_file = [{"path": r.path, "baseline": r.baseline, "policy": r.build} for r in rows]
    linked_changes = top_changes([f for f, r in zip(per_file, rows, strict=True) if r.linked])
    programs = {
        p: {"baseline": b, "policy": ml.text[p], "change_pct": 100 * (ml.text[p] / b - 1)}
        for p, b in plain.text.items()
    }
    return {
        "baseline": total["baseline"],
        "policy": total["build"],
        "change_pct": total["delta_pct"],
        "counts": f"the .text of all {len(rows)} ELF files the build produced",
        "files": len(rows),
        "linked": {
            "baseline": linked_total["baseline"],
            "policy": linked_total["build"],
            "change_pct": linked_total["delta_pct"],
            "files": len(linked),
            # a regression to explain, whatever the total does
            "larger": linked_changes["grown"],
            "larger_files": linked_changes["larger"],
        },
        "top_files": top_changes(per_file),
        "top_directories": top_changes(directories(per_file)),
        "per_file": per_file,
        "programs": programs,
    }


def bytes_saved(row: dict) -> int:
    return row["baseline"] - row["policy"]


def top_changes(rows: list[dict], top: int = TOP) -> dict:
    """Of ROWS (files or directories: path, baseline, policy), the TOP that saved most
    bytes and the TOP that grew most, the largest first (then by path), and how many of
    how many were smaller and larger: a report's size of a build of any number of files."""
    saved = sorted(
        (r for r in rows if bytes_saved(r) > 0), key=lambda r: (-bytes_saved(r), r["path"])
    )
    grown = sorted(
        (r for r in rows if bytes_saved(r) < 0), key=lambda r: (bytes_saved(r), r["path"])
    )
    return {
        "of": len(rows),
        "smaller": len(saved),
        "larger": len(grown),
        "saved": saved[:top],
        "grown": grown[:top],
    }


def directories(per_file: list[dict]) -> list[dict]:
    """PER_FILE's files summed by the directory each is in ("." for the top)."""
    sums: dict[str, dict] = {}
    for f in per_file:
        where = str(PurePosixPath(f["path"]).parent)
        row = sums.setdefault(where, {"path": where, "files": 0, "baseline": 0, "policy": 0})
        row["files"] += 1
        row["baseline"] += f["baseline"]
        row["policy"] += f["policy"]
    return sorted(sums.values(), key=lambda r: r["path"])


def program_report(
    pair, trees: dict[str, Path], policies: list[Path], throughput: dict | None = None
) -> dict:
    """The report of one package built twice (PAIR, in TREES: plain and mlgo) with
    POLICIES; its throughput if its workload was measured."""
    plain, ml = pair
    report = {
        "package": plain.package,
        "policy": ", ".join(str(p) for p in policies),
        "size": size_report(pair, trees),
        "tests": {"baseline": plain.tests, "policy": ml.tests},
    }
    if throughput:
        report["throughput"] = throughput
    return report


def written_apart(report: dict) -> tuple[dict, list[dict] | None]:
    """REPORT as report.json holds it, without its every file's row, and those rows (None
    if it has none): report.json stays as small on thousands of files as on ten."""
    size = dict(report["size"])
    per_file = size.pop("per_file", None)
    return {**report, "size": size}, per_file


def write_report(report: dict, out: Path) -> None:
    """OUT/report.json, OUT/report.html and OUT/per_file.json (every file's row), each
    written atomically; the page is drawn before any is written, so a failure leaves no
    report half-made."""
    kept, per_file = written_apart(report)
    page = render_html(kept)
    if per_file is not None:
        atomic_write_text(out / PER_FILE, json.dumps(per_file))
    atomic_write_text(out / "report.json", json.dumps(kept, indent=1))
    atomic_write_text(out / "report.html", page)


def load_report(path: Path) -> dict | None:
    """The program report at PATH (a report.json, or a directory holding one); None if
    there is none (PATH is an evaluation, say). A report.json that is not one is an error
    naming it."""
    path = path / "report.json" if path.is_dir() else path
    named = path.name == "report.json"
    try:
        report = read_json(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        if named:
            raise UsageError(f"{path}: not a program report ({e})") from e
        return None
    except UsageError:
        if named:
            raise
        return None
    if isinstance(report, dict) and report.keys() >= REPORT_KEYS:
        return report
    if named:
        needs = ", ".join(sorted(REPORT_KEYS))
        raise UsageError(f"{path}: not a program report (it needs {needs})")
    return None


def slower_but_smaller(report: dict) -> bool:
    """A smaller program that runs measurably slower: its whole IQR above 0."""
    speed = report.get("throughput")
    return bool(speed) and report["size"]["change_pct"] < 0 and speed["iqr_pct"][0] > 0


def training_line(training: dict) -> str:
    """What training did, in one line, with the caveat that it is the training code."""
    changes = ", ".join(f"{k} {v:+.2f}%" for k, v in training["corpus_change_pct"].items())
    metric = training.get("metric", ".text against -Oz")
    line = f"corpus {metric}: {changes}; kept {training['chosen']} ({training['note']})"
    if "judged_by" in training:  # chosen by the link, or the workload, not the corpus
        by_judge = training["judged_change_pct"]
        judged = ", ".join(
            f"{k} {v:+.2f}%" if v is not None else f"{k} larger" for k, v in by_judge.items()
        )
        line += f"; chosen by {training['judged_by']}: {judged}"
        if (by_judge[training["chosen"]] or 0.0) > 0:  # no candidate can be clang's own
            line += "; none was cheaper than clang's own by it, so better not served"
    if "clock_change_pct" in training:  # the cheapest few by the judge, timed
        timed = "; ".join(
            f"{k} {throughput_change(v)}" for k, v in training["clock_change_pct"].items()
        )
        where = f" over {n} layouts" if (n := training["clock_control_pct"].get("layouts")) else ""
        control = throughput_change(training["clock_control_pct"])
        line += f"; timed{where}: {timed}, A/A {control}"
    return line


def only_layout(speed: dict) -> bool:
    """A change as built (IQR clear of 0) that shuffled layouts do not bear out (their
    IQR spans 0): where the program's code happened to lie, not what the policy did."""
    over = speed.get("layouts")
    q1, q3 = speed["iqr_pct"]
    return bool(over) and (q3 < 0 or q1 > 0) and over["iqr_pct"][0] <= 0 <= over["iqr_pct"][1]


def throughput_change(speed: dict, of: str = "") -> str:
    """The CPU time's change (OF "control_": the A/A control's), median and IQR."""
    q1, q3 = speed[f"{of}iqr_pct"]
    return f"{speed[f'{of}change_pct']:+.2f}% (IQR {q1:+.2f}..{q3:+.2f}%)"


def change(row: dict) -> str:
    """A file's or a directory's change in bytes, and in percent where it had any."""
    grew = row["policy"] - row["baseline"]
    pct = f" ({100 * grew / row['baseline']:+.2f}%)" if row["baseline"] else ""
    return f"{grew:+,} B{pct}"


def named(rows: list[dict], count: int) -> str:
    """The first SHOWN of ROWS, each with its `change`, and how many more of COUNT."""
    shown = rows[:SHOWN]
    more = count - len(shown)
    text = ", ".join(f"{r['path']} {change(r)}" for r in shown)
    return text + (f" and {more:,} more" if more > 0 else "")


def top_rows(size: dict) -> list[Row]:
    """The files and the directories that saved most and that grew most (red: a file
    larger is a regression to explain), SHOWN of each, and how many did."""
    rows: list[Row] = []
    for what, top in tops(size):
        for listed, count, style in (("saved", "smaller", ""), ("grown", "larger", "red")):
            if top.get(listed):
                label = f"{what} {count}: {top[count]:,} of {top['of']:,}"
                rows.append((label, "", "", named(top[listed], top[count]), style))
    return rows


Row = tuple[str, str, str, str, str]  # label, baseline, policy, change, style


def table_rows(report: dict) -> list[Row]:
    """Size and throughput, baseline against policy: what the terminal table and the page's
    header both show."""
    size = report["size"]
    speed_rows = throughput_rows(report)
    rows = [*speed_rows] if for_speed(report) else []  # the headline first
    rows += [
        (f"{p} .text", f"{r['baseline']:,}", f"{r['policy']:,}", f"{r['change_pct']:+.2f}%", "")
        for p, r in size["programs"].items()
    ]
    if (linked := size.get("linked")) and linked["files"]:
        label = f"{linked['files']} programs and shared libraries"
        base, ours, change = linked["baseline"], linked["policy"], linked["change_pct"]
        rows.append((label, f"{base:,}", f"{ours:,}", f"{change:+.2f}%", "bold"))
        if larger := linked.get("larger"):
            count = linked.get("larger_files", len(larger))
            rows.append((f"larger: {count} of them", "", "", named(larger, count), "red"))
    base, ours, pct = size["baseline"], size["policy"], size["change_pct"]
    rows.append((f"{size['files']} ELF files", f"{base:,}", f"{ours:,}", f"{pct:+.2f}%", "bold"))
    rows += top_rows(size)
    if not for_speed(report):
        rows += speed_rows
    if hot := report.get("hot"):
        rows.append(("hot code, by the profile", "", "", hot_line(hot), ""))
    tests = report["tests"]
    rows.append(("tests", tests["baseline"], tests["policy"], "", ""))
    return rows


def hot_line(hot: dict) -> str:
    """A tune on top of PGO's `hot` (`pgo.hot_departures`): what the policy changed where
    the profile made the code hot."""
    files = hot["files"].values()
    sites = sum(n for f in files for n in f["in_hot_callers"].values())
    callers = sum(len(f["in_hot_callers"]) for f in files)
    return (
        f"{len(hot['hot_functions'])} functions (count >= {hot['hot_count']}); "
        f"{sum(f['departures'] for f in files)} sites departing from clang's own, "
        f"{sites} in {callers} hot callers"
    )


def for_speed(report: dict) -> bool:
    """Whether the report's problem aims at speed: its workload's time is the headline."""
    return get_problem(report.get("problem", "inlining-size")).aim == "speed"


def throughput_rows(report: dict) -> list[Row]:
    """The workload's CPU time (bold where it is the problem's aim) and instructions."""
    speed = report.get("throughput")
    if not speed:
        return []
    slow = slower_but_smaller(report)
    change = throughput_change(speed) + (" smaller but slower" if slow else "")
    change += " layout" if only_layout(speed) else ""
    bold = "bold" if for_speed(report) else ""
    rows: list[Row] = [("CPU time", "", "", change, "red" if slow else bold)]
    if "control_change_pct" in speed:  # a report from before the control has none
        rows.append(("CPU time, A/A control", "", "", throughput_change(speed, "control_"), ""))
    if layouts := speed.get("layouts"):
        over = f"CPU time over {layouts['layouts']} layouts"
        rows.append((over, "", "", throughput_change(layouts), bold))
        rows.append((f"{over}, A/A control", "", "", throughput_change(layouts, "control_"), ""))
    if "instructions_change_pct" in speed:
        rows.append(("instructions", "", "", f"{speed['instructions_change_pct']:+.2f}%", ""))
    if pgo := speed.get("pgo"):  # against the baseline too, in the same rounds
        change = throughput_change(pgo)
        if "instructions_change_pct" in pgo:
            change += f", instructions {pgo['instructions_change_pct']:+.2f}%"
        rows.append((PGO_ROW, "", "", change, ""))
        if over := pgo.get("layouts"):
            rows.append(
                (f"{PGO_ROW}, over {over['layouts']} layouts", "", "", throughput_change(over), "")
            )
    if "pgo_change_pct" in speed:  # on top of PGO: the baseline's own gain, round by round
        rows.append((PGO_GAIN, "", "", throughput_change(speed, "pgo_"), ""))
        if over := speed.get("pgo_layouts"):
            label = f"{PGO_GAIN}, over {over['layouts']} layouts"
            rows.append((label, "", "", throughput_change(over), ""))
    return rows


PGO_ROW = "PGO from your workload"
PGO_GAIN = "PGO (the baseline) against no profile"


def left_out(report: dict) -> str:
    """Why the report has no PGO row, where its workload could have had one."""
    return (report.get("throughput") or {}).get("pgo_left_out", "")


def baseline_flags(report: dict) -> str:
    """The flags the baseline was built with, as the report names them: its level, and
    full LTO for a link-time problem."""
    return report.get("flags") or report.get("level", "-Oz")


def ours_label(report: dict) -> str:
    """What the policy's column is built with: a tune's decisions by plain clang, or
    mlgo-cc serving the policy."""
    return "from decisions" if report.get("built_from") == "decisions" else "mlgo-cc"


def tune_cost(stages: dict, build_cpu_seconds: float, training: dict) -> dict:
    """What a tune cost, from its STAGES' record (`StageRecord.summary`; the report's own
    stage, running, aside) and its TRAINING record: each stage's wall and CPU seconds, the
    whole tune's wall seconds, and in build-equivalents (a plain build's compile CPU,
    BUILD_CPU_SECONDS) each stage's CPU and the search's compiles (`chain.search_compiles`).
    A record from before CPU was kept has no build-equivalents."""
    cpu = stages.get("cpu_seconds", {})

    def builds(seconds: float) -> dict:
        return {"builds": round(seconds / build_cpu_seconds, 2)} if build_cpu_seconds > 0 else {}

    rows = {
        name: {
            "seconds": s,
            **({"cpu_seconds": cpu[name], **builds(cpu[name])} if name in cpu else {}),
        }
        for name, s in stages["seconds"].items()
        if name != "report"
    }
    cost = {
        "seconds": round(sum(r["seconds"] for r in rows.values()), 1),
        "build_cpu_seconds": build_cpu_seconds,
        "stages": rows,
    }
    if "compiles" in training:
        search = {"compiles": training["compiles"]}
        if per_build := training.get("compiles_per_build"):
            search["builds"] = round(training["compiles"] / per_build, 2)
        cost["search"] = search
    return cost


# The parts of OUT a report weighs on disk (`TuneDir`'s names): what a large project's
# tune keeps, so that a user can see what to delete (a tune resumes without programs).
DISK_PARTS = ("pristine", "corpus", "traces", "train", "decisions", "programs")


def disk_use(out: TuneDir) -> dict[str, int]:
    """Bytes each of OUT's DISK_PARTS holds (files as they are, links not followed)."""
    use = {}
    for part in DISK_PARTS:
        total = 0
        for directory, _, files in os.walk(getattr(out, part)):
            total += sum(os.lstat(os.path.join(directory, f)).st_size for f in files)
        use[part] = total
    return use


def peak_memory() -> dict[str, int]:
    """This run's peak resident memory in bytes: the tune's process, and its largest
    finished child (a compile, a build's tool, a worker)."""
    me, children = (
        resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return {"tune": 1024 * me, "largest_child": 1024 * children}


def cost_lines(report: dict) -> list[str]:
    """A tune's `tune_cost` in the notes under its table: the whole tune's wall time, and
    each stage that took any, its wall seconds and its cost in build-equivalents."""
    cost = report.get("cost")
    if not cost:
        return []
    unit = f"a build = the plain build's {cost['build_cpu_seconds']:.2f} s of compile CPU"
    lines = [f"the tune took {cost['seconds'] / 60:.1f} minutes of wall time ({unit})"]
    stages = [
        f"{name} {r['seconds']:.1f} s" + (f" ({r['builds']:,.1f} builds)" if "builds" in r else "")
        for name, r in cost["stages"].items()
        if r["seconds"] >= 0.05
    ]
    lines.append("each stage, wall (its CPU in builds): " + ", ".join(stages))
    if search := cost.get("search"):
        builds = f", {search['builds']:,.1f} builds" if "builds" in search else ""
        lines.append(f"training's search: {search['compiles']:,} compiles{builds}")
    if disk := cost.get("disk"):
        parts = ", ".join(f"{part} {_megabytes(n)}" for part, n in disk.items() if n)
        lines.append(f"OUT holds {_megabytes(sum(disk.values()))} ({parts})")
    if peak := cost.get("peak_memory"):
        lines.append(
            f"peak memory of this run: the tune {_megabytes(peak['tune'])}, its largest "
            f"child {_megabytes(peak['largest_child'])}"
        )
    return lines


def _megabytes(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def cost_table(cost: dict) -> str:
    """`tune_cost` as the page's table: a row a stage, then the search and the whole tune."""

    def cells(name: str, r: dict) -> list[str]:
        cpu = f"{r['cpu_seconds']:.1f}" if "cpu_seconds" in r else ""
        builds = f"{r['builds']:,.2f}" if "builds" in r else ""
        return [name, f"{r['seconds']:.1f}", cpu, builds]

    rows = [cells(name, r) for name, r in cost["stages"].items()]
    if search := cost.get("search"):
        builds = f"{search['builds']:,.2f}" if "builds" in search else ""
        rows.append([f"training's search: {search['compiles']:,} compiles", "", "", builds])
    rows.append(["the tune", f"{cost['seconds']:.1f}", "", ""])
    head = ["stage", "wall s", "CPU s", "builds (CPU)"]
    unit = f"a build: the plain build's {cost['build_cpu_seconds']:.2f} s of compile CPU"
    return html_table(head, rows) + f"<p>{html.escape(unit)}</p>"


def report_table(report: dict) -> Table:
    """Size and throughput, baseline against policy, as the terminal shows them."""
    title = f"{report['package']}: .text bytes, workload CPU time, tests"
    ours = ours_label(report)
    table = Table("", f"clang {baseline_flags(report)}", ours, "change", title=title)
    for *cells, style in table_rows(report):
        table.add_row(*cells, style=style or None)
    table.caption = "\n".join(filter(None, [left_out(report), *cost_lines(report)])) or None
    table.caption_justify = "left"
    return table


def top_files(size: dict) -> dict:
    """SIZE's `top_changes` of its files (of its every file, for a report from before)."""
    return size.get("top_files") or top_changes(size.get("per_file", []))


def tops(size: dict) -> list[tuple[str, dict]]:
    """SIZE's `top_changes` of its files and of its directories (a report from before the
    lists has none of these)."""
    return [("files", top_files(size)), ("directories", size.get("top_directories") or {})]


def size_figure(size: dict) -> str | None:
    """The files whose .text saved most and grew most (bytes and percent); None if none
    changed."""
    top = top_files(size)
    changed = top["saved"] + top["grown"][::-1]
    if not changed:
        return None
    top = changed[::-1]  # the largest saving at the top
    names = [f["path"] for f in top]
    delta = [f["policy"] - f["baseline"] for f in top]
    pct = [100 * (f["policy"] / f["baseline"] - 1) if f["baseline"] else 0.0 for f in top]
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(9, 0.3 * len(top) + 1.2), sharey=True)
    for ax, values, label in ((left, delta, "bytes"), (right, pct, "%")):
        ax.barh(names, values, color=["#228833" if v <= 0 else "#cc3311" for v in values])
        ax.axvline(0, color="black", lw=0.8)
        ax.set_xlabel(f".text change, mlgo-cc vs clang -Oz ({label})")
    left.tick_params(axis="y", labelsize=7)
    return png(fig)


def throughput_figure(speed: dict) -> str:
    """Every paired round's CPU-time ratio, its median and IQR, and callgrind's count."""
    ratios = speed["ratios_pct"]
    q1, q3 = speed["iqr_pct"]
    fig, ax = pyplot().subplots(figsize=(6, 3.2))
    ax.axhspan(q1, q3, color="#4477aa", alpha=0.2, label=f"IQR {q1:+.2f}..{q3:+.2f}%")
    ax.axhline(speed["change_pct"], color="#4477aa", label=f"median {speed['change_pct']:+.2f}%")
    ax.plot(range(1, len(ratios) + 1), ratios, "o", color="#4477aa", label="paired rounds")
    if "instructions_change_pct" in speed:
        n = speed["instructions_change_pct"]
        ax.axhline(n, color="#cc3311", ls="--", label=f"callgrind instructions {n:+.2f}%")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("round")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("workload CPU time, policy vs baseline (%)")
    ax.legend(fontsize=7)
    return png(fig)


def training_figure(curve: list[dict]) -> str | None:
    """The trainer's rewards (higher is better) against compiles, or steps; None if the
    history holds no reward."""
    keys = sorted({k for row in curve for k in row if "reward" in k and not k.endswith("max")})
    if not keys:
        return None
    x = "compiles" if all("compiles" in row for row in curve) else "step"
    fig, ax = pyplot().subplots(figsize=(6, 3.2))
    for key in keys:
        points = [(row.get(x, i), row[key]) for i, row in enumerate(curve) if key in row]
        ax.plot(*zip(*points, strict=True), "o-", label=key)
    ax.set_xlabel(x)
    ax.set_ylabel("reward (higher is better)")
    ax.legend(fontsize=7)
    return png(fig)


def html_table(head: list[str], rows: list[list[str]]) -> str:
    """A table of ROWS of text under HEAD, escaped."""
    esc = html.escape
    top = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{top}</tr>{body}</table>"


def top_tables(size: dict) -> str:
    """The TOP files and directories that saved most and grew most, each a table."""
    parts = []
    for what, top in tops(size):
        for listed, count in (("saved", "smaller"), ("grown", "larger")):
            if top.get(listed):
                shown = f"{len(top[listed])} of the {top[count]:,} {what} {count}"
                rows = [
                    [r["path"], f"{r['baseline']:,}", f"{r['policy']:,}", change(r)]
                    for r in top[listed]
                ]
                parts.append(f"<h3>{html.escape(shown)}</h3>")
                parts.append(html_table([what, "baseline", "policy", "change"], rows))
    every = f"<p>every file: {PER_FILE} beside report.json</p>" if "top_files" in size else ""
    return "".join(parts) + every


def render_html(report: dict) -> str:
    """report.html: the table's numbers, then a plot of each kind of data the report holds."""
    esc = html.escape
    cells = "".join(
        f"<tr class='{style}'>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>"
        for *row, style in table_rows(report)
    )
    sections = []
    if pic := size_figure(report["size"]):
        sections.append(
            f"<h2 id='size'>Size per file (largest changes)</h2>{img(pic)}"
            f"{top_tables(report['size'])}"
        )
    if cost := report.get("cost"):
        sections.append(f"<h2 id='cost'>What the tune cost</h2>{cost_table(cost)}")
    speed = report.get("throughput")
    if speed and speed.get("ratios_pct"):
        work = esc("; ".join(speed.get("workload", [])))
        sections.append(
            f"<h2 id='throughput'>Throughput</h2><p>{esc(speed.get('measure', ''))}; "
            f"workload: <code>{work}</code></p>{img(throughput_figure(speed))}"
        )
    training = report.get("training") or {}
    if pic := training_figure(training.get("curve", [])):
        note = esc(training_line(training)) if "corpus_change_pct" in training else ""
        sections.append(f"<h2 id='training'>Training</h2><p>{note}</p>{img(pic)}")
    title = f"mlgo report: {report['package']}"
    counts = report["size"].get("counts", ".text")
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{esc(title)}</title>
{STYLE}<style>tr.bold td{{font-weight:bold}} tr.red td{{color:#cc3311}}</style>
</head><body><h1>{esc(title)}</h1>
<p>policy: <code>{esc(report["policy"])}</code>; size counts {esc(counts)}</p>
<table><tr><th></th><th>clang {esc(baseline_flags(report))}</th><th>{ours_label(report)}</th>
<th>change</th></tr>{cells}</table>
{f"<p>{esc(left_out(report))}</p>" if left_out(report) else ""}
{"".join(sections)}
</body></html>"""


def report_stage(run: TuneRun) -> None:
    """A tune's report: its two builds' sizes, tests and (with a workload) the clock's
    figures, what training did, what the policy's build was built from, and, on top of
    PGO, where the profile and the policy meet: OUT/report.json and its page."""
    out, work, decisions = run.out, run.out.programs, run.decisions
    plain, ml = (ProgramBuild(**b) for b in read_json(out.builds))
    trees = {b.variant: work / b.variant for b in (plain, ml)}
    speed = read_json(out.throughput) if run.recipe.bench else None
    report = program_report((plain, ml), trees, [out.policy.resolve()], speed)
    report.update(problem=run.problem.name, level=run.problem.opt_level)
    training = read_json(out.training)
    report.update(training=training, stage=run.problem.stage, flags=run.baseline)
    report["cost"] = tune_cost(read_json(out.record), plain.build_cpu_seconds, training)
    report["cost"].update(disk=disk_use(out), peak_memory=peak_memory())
    report.update(built_from(decisions, trees["mlgo"], run.say))
    if run.profile is not None and decisions is not None:  # what the policy changed where hot
        report["hot"] = hot_departures(run.profile, decisions, run.tc)
    write_report(report, out.root)
