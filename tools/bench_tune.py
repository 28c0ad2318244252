"""Issue 22's figures: `mlgo tune` on real projects that no shipped policy trained on.

  .venv/bin/python -m tools.bench_tune cmark jq geographiclib yajl ninja serd tidy-html5 \
      flatbuffers units --minutes 60 --work data/bench-tune

(sord, discount, mandoc, tcc, libfyaml, nasm and byacc were screened with --minutes 2 only.)

  .venv/bin/python -m tools.bench_tune serd tidy-html5 ninja --problem regalloc-eviction \
      --minutes 12

With `--problem regalloc-eviction`, issue 39's figures: the eviction policy tuned at -O2
for speed into WORK/NAME/tune-regalloc-eviction, trained and its candidates judged on the
workload's block cost (`mlgo.programs.speed`); beside the CPU time, the kept policy's change
by that cost, how well the corpus's static cost ranked the candidates against it, and both
builds timed again with longer samples (RETIMED), beside the shipped policy untuned: built
into WORK/NAME/untuned (tests run) and timed against the tune's plain build. With
`--problem inlining-speed`, the same for the inliner at -O2, from clang's own decisions
cloned (it ships no policy, so none is timed untuned). With `--pgo` (issue 60's item 4),
the tune on top of the PGO build from the project's workload (`mlgo tune --pgo`): every
figure against the PGO build, and beside it PGO's own change against plain -O2.

  .venv/bin/python -m tools.bench_tune yajl serd tidy-html5 ninja --lto full --minutes 10

With `--lto full` (or `thin`), issue 38's figures: `mlgo tune --lto full` (the inliner of
the LTO link, against plain `-Oz -flto` (`-flto=thin`) linked by lld) into
WORK/NAME/tune-lto-full (-thin), and beside it what plain LTO gives over per-file `-Oz` (a
third build, WORK/NAME/per-file, without tests), over the same programs and shared
libraries, and how well the corpus's reward ranked the candidates as the link did.

Each project is a Debian source package (fetched with apt-get source, patches applied, its
build dependencies installed), tuned on its own code with the commands below, exactly what
a user types in its source tree. The projects run one after another, so each training has
the whole machine. A project tuned before in WORK resumes where it stopped (`mlgo tune`
resumes), so a finished one is only reported again. Reported per project, from its
report.json: the linked programs' and shared libraries' .text against clang -Oz, every ELF
file's, the search headroom on its corpus and the share the policy kept, which candidate
was kept, the workload's CPU time (median and IQR of paired rounds, and the A/A control's:
the baseline timed twice a round), instructions where
valgrind is installed, the tests on both builds, the training's minutes, and the wall time
of this run of the command (all of it when the project was not tuned before).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.cli import USER_ERRORS
from mlgo.data import shipped_policy
from mlgo.llvm.sizes import compare_trees, linked_rows, tree_totals
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.packages.recipes import Recipe, project
from mlgo.problems import LTO_STAGES, Problem, at_link, get_problem, problems
from mlgo.programs.build import (
    build_program,
    plain_compilers,
    policy_service,
    pristine_source,
    problem_flags,
)
from mlgo.programs.compare import variants
from mlgo.programs.measure import recipe_throughput
from mlgo.programs.report import throughput_change
from mlgo.programs.tune import TuneOptions, tune
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.messages import WHOLE_LINE, error_line

console = Console()
SIZE = "inlining-size"  # the problem tuned unless --problem says another
RETIMED = (15, 6.0)  # a speed problem's builds timed again: rounds, CPU seconds a build a round


@dataclass(frozen=True)
class Project:
    source: str  # the Debian source package
    language: str
    build_depends: tuple[str, ...]
    configure: str
    build: str
    test: str
    bench: str  # its output must be the same on both builds


GEODESICS = (
    "awk 'BEGIN{for(i=0;i<20000;i++) print (i%179)-89, (i*7)%360-180, ((i*13)%179)-89, "
    "(i*3)%360-180}' | build/tools/GeodSolve -i | md5sum"
)
PROJECTS = {
    "cmark": Project(
        "cmark",
        "C",
        ("cmake", "python3"),
        "cmake -B build",
        "cmake --build build -j2",
        # pathological inputs are timed tests: they fail on a loaded machine, either build
        "ctest --test-dir build --output-on-failure -E pathological",
        "build/src/cmark test/spec.txt test/spec.txt test/spec.txt test/spec.txt",
    ),
    "jq": Project(
        "jq",
        "C",
        ("autoconf", "automake", "libtool", "bison", "flex", "libonig-dev"),
        "autoreconf -fi && ./configure --disable-docs --disable-maintainer-mode "
        "--disable-valgrind --with-oniguruma=yes",
        "make -j2",
        "make check -j2",
        "./jq -n '[range(100000)|{a:.,b:(.|tostring)}]' | ./jq -c 'map(.a*2)|add'",
    ),
    "geographiclib": Project(
        "geographiclib",
        "C++",
        ("cmake",),
        "cmake -B build",
        "cmake --build build -j2",
        "ctest --test-dir build",
        GEODESICS,
    ),
    # first tried as a new user (three minutes); the parsing tests are a script over the
    # built yajl_test. Its perftest, the first bench, parses for three seconds whatever the
    # build: its time cannot change (a tune now refuses such a workload), so the build
    # also writes a 200,000-object JSON document that the bench has the built
    # json_reformat reformat
    "yajl": Project(
        "yajl",
        "C",
        ("cmake",),
        "cmake -B build",
        'cmake --build build -j2 && awk \'BEGIN{printf "["; for(i=0;i<200000;i++) printf '
        '"%s{\\"id\\":%d,\\"name\\":\\"item %d\\",\\"tags\\":[\\"a\\",%d.5],'
        '\\"ok\\":true}", (i?",":""), i, i, i; print "]"}\' > big.json',
        "cd test/parsing && ./run_tests.sh ../../build/test/parsing/yajl_test",
        "build/reformatter/json_reformat < big.json | md5sum",
    ),
    # first tried as a new user (three minutes): C++; the build also writes a large fake
    # manifest with ninja's own generator (seeded: the same each time), which the bench has
    # the built ninja parse and list
    "ninja": Project(
        "ninja-build",
        "C++",
        ("cmake", "python3"),
        "cmake -B build",
        "cmake --build build -j2 && python3 misc/write_fake_manifests.py fake > /dev/null",
        "build/ninja_test",
        "build/ninja -C fake -t targets all | md5sum",
    ),
    # first tried as a new user (two minutes): C, Meson; the build also writes 40,000 triples
    # that the bench has the built serdi convert
    "serd": Project(
        "serd",
        "C",
        ("meson", "ninja-build"),
        "meson setup build -Ddocs=disabled",
        "ninja -C build && awk 'BEGIN{for(i=0;i<40000;i++) printf \"<http://e.org/s%d> "
        '<http://e.org/p%d> \\"object %d\\" .\\n", i, i%17, i}\' > big.ttl',
        "meson test -C build",
        "build/serdi -i turtle -o ntriples big.ttl | md5sum",
    ),
    # first tried as a new user (two minutes): C, CMake; 5.6.0 ships no test suite, so the
    # test is one document that must come out tidied; the build also writes 20,000 paragraphs
    # of HTML with unclosed tags that the bench has the built tidy clean up
    "tidy-html5": Project(
        "tidy-html5",
        "C",
        ("cmake",),
        "cmake -S . -B out",
        'cmake --build out -j2 && awk \'BEGIN{print "<title>t</title>"; for(i=0;i<20000;i++) '
        'printf "<p>para %d <b>bold <i>it</b> <a href=x%d>link</a>\\n", i, i}\' > big.html',
        "printf '<title>t</title><p>hi' | out/tidy -q 2>/dev/null | grep -q '<p>hi</p>'",
        "out/tidy -q big.html 2>/dev/null | md5sum",
    ),
    # C, Meson, the RDF store built on serd; the build also writes 40,000 triples that the
    # bench has the built sordi load into its model and write out
    "sord": Project(
        "sord",
        "C",
        ("meson", "ninja-build", "pkg-config", "libserd-dev", "libpcre2-dev"),
        "meson setup build -Ddocs=disabled -Dtests=enabled",
        "ninja -C build && awk 'BEGIN{for(i=0;i<40000;i++) printf \"<http://e.org/s%d> "
        '<http://e.org/p%d> \\"object %d\\" .\\n", i%9000, i%17, i}\' > big.ttl',
        "meson test -C build",
        "build/sordi big.ttl | md5sum",
    ),
    # C, its own configure.sh, with the options Debian builds it with; clang rejects a
    # callback's type that gcc only warns about, and its Makefile races under -j (Debian
    # builds it serially too); the build also writes a 48,000-line Markdown document that
    # the bench has the built markdown render (first tried as a new user, two minutes: the
    # bench ran no markdown at all, as it could not find its library, and the rehearsal
    # did not notice)
    "discount": Project(
        "discount",
        "C",
        (),
        "CFLAGS=-Wno-incompatible-function-pointer-types ./configure.sh --shared "
        "--with-id-anchor --with-github-tags --with-fenced-code --github-checkbox",
        "make && awk 'BEGIN{for(i=0;i<3000;i++){printf \"# Title %d\\n\\nSome *em* and "
        '**strong** text with `code` and a [link](http://e.org/%d).\\n\\n", i, i; '
        'print "- item one\\n- item _two_\\n  1. nested\\n\\n> quote " i "\\n\\n    '
        "indented code\\n\\n```c\\nint x;\\n```\\n\"}}' > big.md",
        "make test",
        "LD_LIBRARY_PATH=. ./markdown big.md | md5sum",  # it links the libmarkdown.so built
    ),
    # C++, CMake, built in its source tree as Debian does: flattests compares a schema path
    # relative to where the build wrote it; the bench has the built flatc generate code for
    # its test schema in a dozen languages
    "flatbuffers": Project(
        "flatbuffers",
        "C++",
        ("cmake", "python3"),
        "cmake -S . -B .",
        "cmake --build . -j2",
        "ctest --output-on-failure",
        "for i in 1 2 3 4 5; do rm -rf gen && ./flatc --cpp --java --csharp --go --python "
        "--ts --rust --swift --kotlin --dart --lua --php -o gen -I tests/include_test "
        "tests/monster_test.fbs || exit 1; done; find gen -type f | sort | xargs cat | md5sum",
    ),
    # C, its own configure, which takes the compiler from configure.local only; the bench
    # has the built mandoc render its own 27 manuals as text and HTML, ten times over
    "mandoc": Project(
        "mdocml",
        "C",
        ("zlib1g-dev", "perl"),
        'printf \'CC="%s"\\n\' "$CC" > configure.local && ./configure',
        "make -j2",
        "make regress",
        "for i in 1 2 3 4 5 6 7 8 9 10; do ./mandoc -T utf8 *.[1-8]; ./mandoc -T html *.[1-8]; "
        "done 2>/dev/null | md5sum",
    ),
    # C, its own configure; the tests have the built tcc compile and run its own test
    # programs, all but test3, which compares tcc with the host compiler on tcctest.c, a
    # file clang-22 rejects (implicit int); the bench has it compile its own source, all of
    # it in one unit, 30 times
    "tcc": Project(
        "tcc",
        "C",
        ("perl", "texinfo"),
        './configure --cc="$CC"',
        "make -j2",
        "make -k test > tests.log 2>&1; ! grep -E '[*]{3} [[].*[]] Error' tests.log "
        "| grep -vE ': (test[.]ref|test3|all|test)[]] Error'",
        "for i in $(seq 30); do ./tcc -B. -Iinclude -I. -DONE_SOURCE=1 -c tcc.c -o bench.o "
        "|| exit 1; done; md5sum < bench.o",
    ),
    # C, autotools, as Debian configures it (its test suite would clone the YAML test
    # suite); the build also writes a 80,000-item YAML document that the bench has the
    # built fy-tool parse and dump
    "libfyaml": Project(
        "libfyaml",
        "C",
        ("pkg-config", "libltdl-dev"),
        "./configure --disable-network",
        "make -j2 && awk 'BEGIN{for(i=0;i<80000;i++) printf \"- name: item%d\\n  value: %d\\n"
        '  tags: [a, b, \\"c%d\\"]\\n  nested: {x: %d, y: text %d}\\n  block: |\\n    line '
        "%d\\n\", i, i, i, i*3, i, i}' > big.yaml",
        "make check -j2",
        "src/fy-tool --dump big.yaml | md5sum",
    ),
    # C, autotools; its test runner prints FAIL but exits 0, so the test reads its log (the
    # version test fails on both builds: it expects upstream's version string); the build
    # also writes a 300,000-line assembly file with a macro that the bench has nasm assemble
    "nasm": Project(
        "nasm",
        "C",
        ("python3",),
        "./configure",
        "make -j2 && awk 'BEGIN{print \"bits 64\\n%macro twice 1\\n add rax, %1\\n add rax, "
        '%1\\n%endmacro"; for(i=0;i<60000;i++) printf "l%d: mov rax, [rbx+%d]\\n add rcx, '
        "rax\\n lea rdx, [rsi+rdi*4+%d]\\n twice %d\\n jnz l%d\\n\", i, i*8, i, i, i}' > big.asm",
        "make travis > travis.log 2>&1; ! grep '=== Test .* FAIL ===' travis.log "
        "| grep -v '/_version FAIL'",
        "./nasm -f elf64 -o big.o big.asm && md5sum < big.o",
    ),
    # C, autotools, one program; its check prints whether a conversion came out right but
    # exits 0 either way, so the test reads what it printed; the bench has the built units
    # check every unit it defines, ten times over
    "units": Project(
        "units",
        "C",
        ("bison",),
        "./configure",
        "make -j2",
        "make check | grep -q 'Units seems to work'",
        "for i in 1 2 3 4 5 6 7 8 9 10; do ./units -f definitions.units --check; done | md5sum",
    ),
    # C, autotools, configured and with the tests Debian runs (it drops those that expect
    # glibc's getopt messages); the bench has the built yacc generate the parsers of its
    # four largest test grammars, 30 times over
    "byacc": Project(
        "byacc",
        "C",
        (),
        "./configure --enable-btyacc --enable-stdnoreturn && "
        "sed -i '/MYFILE=nosuchfile/,/# Test special cases/d' test/run_test.sh",
        "make -j2",
        "make check",
        "for i in $(seq 30); do for y in expr.oxout grammar btyacc_demo varsyntax_calc1; do "
        "./yacc -B -v -d -b bench test/$y.y || exit 1; cat bench.tab.c bench.output; done; "
        "done | md5sum",
    ),
}


def project_recipe(name: str) -> Recipe:
    """Project NAME as `mlgo tune` takes it: its shell lines, its workload, and the Debian
    source and build dependencies it is fetched with."""
    p = PROJECTS[name]
    recipe = project(name, [p.configure], [p.build], [p.test], p.bench)
    return replace(recipe, source=p.source, build_depends=p.build_depends)


def tune_project(
    name: str,
    work: Path,
    minutes: float,
    lto: str | None = None,
    problem: str = SIZE,
    pgo: bool = False,
    profile_inputs: bool = False,
) -> dict:
    """Fetches NAME's source once and tunes PROBLEM on it into WORK/NAME/tune (another
    problem than the inliner's: WORK/NAME/tune-PROBLEM; LTO: that link's inliner, into
    WORK/NAME/tune-lto-LTO, and plain LTO against per-file -Oz; PGO: on top of the PGO
    build, into WORK/NAME/tune-PROBLEM-pgo; with PROFILE_INPUTS, the search's policy reading
    the profile's counts too, into WORK/NAME/tune-PROBLEM-pgo-counts); its report and wall
    time."""
    p = PROJECTS[name]
    recipe = project_recipe(name)
    source = pristine_source(recipe, work / name)
    started = time.monotonic()
    tc = find_toolchain()
    where = f"tune-lto-{lto}" if lto else "tune" if problem == SIZE else f"tune-{problem}"
    problem = at_link(problem, lto).name if lto else problem
    out = work / name / (f"{where}-pgo" if pgo else where)
    out = out.with_name(f"{out.name}-counts") if profile_inputs else out
    opts = TuneOptions(minutes=minutes, problem=problem, pgo=pgo, profile_inputs=profile_inputs)
    report = tune(source, recipe, out, tc, opts)
    result = {"language": p.language, "seconds": time.monotonic() - started, "report": report}
    if lto:
        result["lto_over_per_file_pct"] = lto_over_per_file(recipe, source, work / name, out, tc)
    tuned = get_problem(problem)
    if tuned.aim == "speed" and p.bench:
        result["retimed"] = retimed(recipe, source, work / name, out, tc, tuned)
    return result


def lto_over_per_file(
    recipe: Recipe, source: Path, work: Path, tuned: Path, tc: Toolchain
) -> float:
    """What plain LTO (the tune's baseline build) gives over per-file -Oz, in % of the
    programs' and shared libraries' .text: the same source built per file into WORK/per-file
    (once; no tests), against the tune's plain build."""
    per_file = work / "per-file"
    if not (per_file / ".complete").exists():
        build_program(recipe, source, per_file, tc, "per-file", plain_compilers(tc), None, False)
        (per_file / ".complete").touch()
    linked = tree_totals(linked_rows(compare_trees(tuned / "programs" / "plain", per_file)))
    return linked["delta_pct"]


def retimed(
    recipe: Recipe, source: Path, work: Path, tuned: Path, tc: Toolchain, problem: Problem
) -> dict:
    """The tune TUNED's policy, and PROBLEM's shipped policy untuned where one is shipped
    (built by mlgo-cc from SOURCE into WORK/untuned, its tests run), each timed against the
    tune's plain build in RETIMED's paired rounds and CPU seconds (with the A/A control):
    longer samples than the tune's own, for less noise in each round."""
    plain = tuned / "programs" / "plain"
    builds = {"tuned": tuned / "programs" / "mlgo"}
    shipped = shipped_policy(problem.name)
    if shipped.is_dir():  # inlining-speed ships none: its start is cloned in each tune
        untuned = builds["untuned"] = work / "untuned"
        if not (work / "untuned.done").exists():
            with policy_service([shipped], work / "service") as env:
                served = variants(tc, env)[1]
                build_program(
                    recipe, source, untuned, tc, "untuned", served.compilers, served.env, True,
                    problem_flags(problem),
                )  # fmt: skip
            (work / "untuned.done").touch()
    return {
        policy: recipe_throughput(recipe, {"plain": plain, policy: tree}, *RETIMED)
        for policy, tree in builds.items()
    }


def try_project(name: str, tuned: Callable[[], dict]) -> dict:
    """TUNED (`tune_project` on project NAME), or what stopped it (its rehearsal, a failing
    test...) as one line, so that the projects after it still run."""
    try:
        return tuned()
    except USER_ERRORS as e:
        console.print(f"[red]{name}: {error_line(e, WHOLE_LINE)}", highlight=False)
        return {"language": PROJECTS[name].language, "error": error_line(e)}


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}%"


def rank(result: dict) -> str:
    """Spearman's rho of the corpus's reward against the judge of the candidates (the
    link's, or the workload's), over those it gave a figure."""
    training = result.get("report", {}).get("training", {})
    corr = training.get("rank_correlation") or {}
    rho = corr.get("spearman")
    return "n/a" if rho is None else f"{rho:+.2f} ({corr['candidates']})"


def cpu_time(speed: dict) -> str:
    """A throughput's CPU time change and its A/A control's, medians and IQRs."""
    cpu = throughput_change(speed)
    if "control_change_pct" in speed:
        cpu += f"; A/A {throughput_change(speed, 'control_')}"
    return cpu


def judged(result: dict) -> float | None:
    """The kept policy's change by the judge of its candidates (a speed problem's: the
    workload's block cost), in percent."""
    training = result.get("report", {}).get("training", {})
    return training.get("judged_change_pct", {}).get(training.get("chosen"))


def row(name: str, result: dict) -> list[str]:
    """One project's table row from its RESULT (`try_project`'s)."""
    if "error" in result:
        return [f"{name} ({result['language']})", f"[red]stopped: {result['error']}", *[""] * 8]
    r = result["report"]
    size, training, speed = r["size"], r["training"], r.get("throughput")
    linked = size.get("linked", {})
    captured = training.get("headroom_captured")
    headroom = pct(training.get("headroom_pct"))
    cpu = cpu_time(speed) if speed else "not measured"
    # a report written before it named the files that grew does not say how many did
    grew = f", {len(linked['larger'])} larger" if "larger" in linked else ""
    return [
        f"{name} ({result['language']})",
        f"{pct(linked.get('change_pct'))} ({linked.get('files', 0)} files{grew})",
        f"{pct(size['change_pct'])} ({size['files']})",
        headroom if captured is None else f"{headroom} ({captured:.0%})",
        training["chosen"],
        cpu,
        pct((speed or {}).get("instructions_change_pct")),
        f"{r['tests']['baseline']} / {r['tests']['policy']}",
        f"{training['seconds'] / 60:.0f} min",
        f"{result['seconds'] / 60:.0f} min",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("projects", nargs="+", choices=sorted(PROJECTS))
    parser.add_argument("--minutes", type=float, default=60.0, help="training budget each")
    parser.add_argument("--work", type=Path, default=Path("data/bench-tune"))
    parser.add_argument("--lto", choices=sorted(LTO_STAGES), help="tune that LTO link's inliner")
    speed_problems = [p.name for p in problems() if p.aim == "speed"]
    parser.add_argument("--problem", choices=[SIZE, *speed_problems], default=SIZE)
    parser.add_argument("--pgo", action="store_true", help="tune on top of the PGO build")
    parser.add_argument(
        "--profile-inputs", action="store_true", help="with --pgo: the policy reads the counts"
    )
    args = parser.parse_args()
    work, lto, problem, pgo = args.work.resolve(), args.lto, args.problem, args.pgo
    counts = args.profile_inputs
    results = {
        n: try_project(n, partial(tune_project, n, work, args.minutes, lto, problem, pgo, counts))
        for n in args.projects
    }
    flag = {"full": "-flto", "thin": "-flto=thin"}.get(lto or "")
    level = get_problem(problem).opt_level + (" -fprofile-instr-use" if pgo else "")
    baseline = f"clang {level} {flag} (lld)" if lto else f"clang {level}"
    speed = problem != SIZE
    table = Table(
        "project", "programs + shared libs .text (files)", "all ELF files",
        "search headroom (kept)", "kept", "CPU time (IQR)", "instructions",
        f"tests ({baseline} / policy)", "training", "wall, this run",
        *([f"plain {flag} vs per-file -Oz", "corpus vs link rank (rho)"] if lto else []),
        *(["kept, by the workload's block cost", "corpus vs workload rank (rho)",
           f"retimed ({RETIMED[0]} rounds of {RETIMED[1]:g} s): tuned; shipped untuned"]
          if speed else []),
        *(["PGO against no profile (IQR)"] if pgo else []),
        title=f"mlgo tune{f' --lto {lto}' if lto else ''} --problem {problem} "
        f"--minutes {args.minutes:g}, each project against {baseline}",
    )  # fmt: skip
    for name, result in results.items():
        extra = [pct(result.get("lto_over_per_file_pct")), rank(result)] if lto else []
        if speed:
            again = result.get("retimed", {})
            cpu = "; ".join(f"{k} {cpu_time(v)}" for k, v in again.items()) or "n/a"
            extra = [pct(judged(result)), rank(result), cpu]
        if pgo:
            timed = result.get("report", {}).get("throughput") or {}
            extra.append(throughput_change(timed, "pgo_") if "pgo_iqr_pct" in timed else "n/a")
        table.add_row(*row(name, result), *extra)
    console.print(table)
    named = f"-lto-{lto}" if lto else "" if problem == SIZE else f"-{problem}"
    named += "-pgo" if pgo else ""
    named += "-counts" if counts else ""
    out = work / f"bench_tune{named}.json"
    atomic_write_text(out, json.dumps(results, indent=1))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
