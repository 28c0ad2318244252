"""How clang's driver reads a command line, for mlgo-cc (both wrappers) and a recorded
build: which inputs are sources and in which language (by suffix, or by `-x`), which options
take the next argument as their value, `@file` response files, the output, the -O level,
and the stage of an LTO link. The native wrapper (mlgo/serve/native/mlgo_cc.c) follows the
same rules and is built with these lists (mlgo.serve.native_wrapper); tests/test_driver.py
holds the two to agree. Standard library only: `mlgo-cc` imports this on every compiler
invocation.
"""

from __future__ import annotations

import os
from pathlib import Path

from mlgo.llvm.languages import LANGUAGES

# What clang's driver compiles an input as, by its suffix: its driver types, named as `-x`
# and `clang -###` name them (tests/test_driver.py asks clang). Case matters: .C and .CPP are
# C++, .Cpp is only linked. Each makes an object with -c; the optimizer runs on all but
# assembly, so a policy may serve those. Left out: headers (precompiled, no code), LLVM IR and
# C++ module units (not what a build compiles from its sources), CUDA, HIP and OpenCL (code
# for another device), and GCC's .sx (clang only links it).
SOURCE_TYPES = {
    ".c": "c",
    ".i": "cpp-output",
    **dict.fromkeys((".C", ".cc", ".CC", ".cp", ".cpp", ".CPP", ".cxx", ".CXX"), "c++"),
    **dict.fromkeys((".c++", ".C++"), "c++"),
    ".ii": "c++-cpp-output",
    ".m": "objective-c",
    ".mi": "objective-c-cpp-output",
    **dict.fromkeys((".mm", ".M"), "objective-c++"),
    ".mii": "objective-c++-cpp-output",
    **dict.fromkeys((".s", ".asm"), "assembler"),
    ".S": "assembler-with-cpp",
}
ASSEMBLY = ("assembler", "assembler-with-cpp")
# The language (mlgo.llvm.languages) of a source of each type; clang++ compiles C as C++.
TYPE_LANGUAGES = {"c": "c", "cpp-output": "c", "c++": "c++", "c++-cpp-output": "c++"}
COMPILED_SUFFIXES = tuple(SOURCE_TYPES)  # what a recorded build made objects of
SOURCE_SUFFIXES = tuple(s for s, kind in SOURCE_TYPES.items() if kind not in ASSEMBLY)
# Options with which clang makes no code (preprocessing, checking, printing), and stdin.
NO_CODEGEN = {"-E", "-M", "-MM", "-fsyntax-only", "-###", "--version", "--help", "-"}
LEVELS = ("-O0", "-O1", "-O2", "-O3", "-Os", "-Oz", "-Og", "-Ofast")
NOT_LEVELS = ("-ObjC", "-ObjC++")  # options that start as a level does
OUTPUT_OPTIONS = ("-o", "--output")  # and -oFILE (`joined_output`)
# Nested response files deeper than this stay unexpanded (clang stops only at a cycle).
RESPONSE_FILE_DEPTH = 8
# Driver options whose value is the next argument (clang's Separate and JoinedOrSeparate ones,
# and GCC's long spellings): that value is never an input, whatever -x says. Every -X option
# (-Xclang, -Xlinker, ...) takes one too. The native wrapper skips -o, -MF, -MT, -MQ, -MJ,
# --serialize-diagnostics and -X* alike (a subset: what it does not skip, it hands over).
SEPARATE_VALUE_OPTIONS = frozenset({
    "-o", "--output", "-MF", "-MT", "-MQ", "-MJ", "--serialize-diagnostics",
    "-serialize-diagnostics", "-dependency-file", "-dependency-dot", "-include", "--include",
    "-include-pch", "-imacros", "--imacros", "-idirafter", "-iprefix", "-iquote", "-isysroot",
    "-isystem", "-isystem-after", "-iwithprefix", "-iwithprefixbefore", "-iwithsysroot",
    "-iframework", "-iframeworkwithsysroot", "-ivfsoverlay", "-vfsoverlay", "-cxx-isystem",
    "-stdlib++-isystem", "-iapinotes-modules", "-I", "--include-directory", "-L",
    "--library-directory", "-F", "-B", "-D", "--define-macro", "-U", "--undefine-macro", "-A",
    "--assert", "-T", "-G", "-b", "-z", "-l", "-u", "-e", "-mllvm", "-mmlir", "-arch", "-target",
    "--sysroot", "--config", "--language", "-resource-dir", "-working-directory", "-dumpdir",
    "-dsym-dir", "-ccc-gcc-name", "-ccc-install-dir", "-module-dependency-dir",
    "-gen-cdb-fragment-path", "-meabi", "-mthread-model", "-darwin-target-variant",
    "-darwin-target-variant-triple", "-hlsl-entry", "-fmodules-user-build-path",
    "--analyzer-output", "-filelist", "-framework", "-rpath", "--param",
})  # fmt: skip


def is_source(arg: str) -> bool:
    """Is ARG a source file the driver optimizes as it compiles (by its suffix)?"""
    return arg.endswith(SOURCE_SUFFIXES) and not arg.startswith("-")


def suffix_language(name: str, cxx_driver: bool = False) -> str | None:
    """The language of the source file NAME by its suffix (clang++ compiles C as C++), None
    for any other (Objective-C, assembler, ...)."""
    dot = name.rfind(".")
    language = TYPE_LANGUAGES.get(SOURCE_TYPES.get(name[dot:], "")) if dot > 0 else None
    return "c++" if language == "c" and cxx_driver else language


def takes_value(arg: str) -> bool:
    """Is the driver option ARG's value the next argument (never an input, whatever it looks
    like)?"""
    return arg in SEPARATE_VALUE_OPTIONS or arg == "-x" or (arg.startswith("-X") and len(arg) > 2)


def typed_sources(args: list[str]) -> set[int]:
    """The positions in ARGS of inputs without a source suffix that clang compiles as C or
    C++ because `-x c` or `-x c++` comes before them (until `-x none`): existing regular
    files that are not an option's value. Those clang cannot read are its errors to report."""
    found: set[int] = set()
    x = "none"
    rest = iter(enumerate(args))
    for i, a in rest:
        if a == "-x":
            x = next(rest, (i, "none"))[1]
        elif a.startswith("-x") and len(a) > 2:
            x = a[2:]
        elif takes_value(a):
            next(rest, None)
        elif x in LANGUAGES and not a.startswith("-") and not is_source(a) and os.path.isfile(a):
            found.add(i)
    return found


def source_files(args: list[str]) -> list[str]:
    """The source files among ARGS, by suffix or by -x (the guard compares only a compile of
    one)."""
    typed = typed_sources(args)
    return [a for i, a in enumerate(args) if is_source(a) or i in typed]


def compile_language(args: list[str], cxx_driver: bool) -> str | None:
    """The language the sources among ARGS compile as (mlgo.llvm.languages): set by the last
    `-x LANG` before each, else by its suffix. None when they are of more than one language,
    or of one neither C nor C++."""
    typed = typed_sources(args)
    found: set[str | None] = set()
    x = "none"
    rest = iter(enumerate(args))
    for i, a in rest:
        if a == "-x":
            x = next(rest, (i, "none"))[1]
        elif a.startswith("-x") and len(a) > 2:
            x = a[2:]
        elif is_source(a) or i in typed:
            by_x = x if x in LANGUAGES else None
            found.add(suffix_language(a, cxx_driver) if x == "none" else by_x)
    return found.pop() if len(found) == 1 else None


def split_response_file(text: str) -> list[str]:
    """The arguments in a response file, split as clang splits them on Unix (LLVM's
    TokenizeGNUCommandLine, which differs from a shell's): whitespace separates, '...' and
    "..." quote, a backslash escapes the next character even inside quotes, an unclosed quote
    ends at the end, and a quoted empty string is no argument."""
    words: list[str] = []
    token: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n:
            token.append(text[i + 1])
            i += 1
        elif c in "'\"":
            i += 1
            while i < n and text[i] != c:
                if text[i] == "\\" and i + 1 < n:
                    i += 1
                token.append(text[i])
                i += 1
        elif c in " \t\r\n":
            if token:
                words.append("".join(token))
                token = []
        else:
            token.append(c)
        i += 1
    if token:
        words.append("".join(token))
    return words


def expand_response_files(args: list[str], depth: int = 0) -> list[str]:
    """ARGS as clang's driver reads them: each `@FILE` replaced by the arguments in FILE,
    nested ones too (named relative to the working directory, as clang does), up to
    RESPONSE_FILE_DEPTH. A FILE that cannot be read stays as the literal argument, as in
    clang, and so does one that is not a regular file: reading a pipe (`@<(...)`) would take
    its arguments from the compiler. For what the wrapper decides only: the compiler is given
    ARGS as they are."""
    expanded: list[str] = []
    for a in args:
        if not a.startswith("@") or depth >= RESPONSE_FILE_DEPTH or not os.path.isfile(a[1:]):
            expanded.append(a)
            continue
        try:
            with open(a[1:], "rb") as f:
                data = f.read()
        except OSError:
            expanded.append(a)
            continue
        text = data.removeprefix(b"\xef\xbb\xbf").decode(errors="surrogateescape")
        expanded += expand_response_files(split_response_file(text), depth + 1)
    return expanded


def joined_output(arg: str) -> bool:
    """-oFILE (not -objcmt-..., -object: other options that start alike)."""
    return arg.startswith("-o") and len(arg) > 2 and not arg.startswith("-obj")


def named_output(args: list[str]) -> str | None:
    """The output ARGS name: the last -o (or --output, -oFILE); None when none does."""
    output = None
    rest = iter(args)
    for a in rest:
        if a in OUTPUT_OPTIONS:
            output = next(rest, output)
        elif joined_output(a):
            output = a[2:]
    return output


def link_output(args: list[str]) -> str:
    """What a link with ARGS writes: the output they name, or a.out."""
    output = named_output(args)
    return "a.out" if output is None else output


def opt_level(args: list[str]) -> str | None:
    """The -O level clang compiles at, read as its driver reads it: the last -O flag wins, -O
    alone is -O1, -O4 and up are -O3, none is -O0; None for a level clang refuses (and says
    so). An argument handed on to another tool (-Xclang X, -Xlinker X) is not the driver's."""
    level = "-O0"
    rest = iter(args)
    for a in rest:
        if a.startswith("-X") and len(a) > 2:
            next(rest, None)
        elif a == "--optimize" or a.startswith("--optimize="):
            level = "-O" + a.removeprefix("--optimize").removeprefix("=")
        elif a.startswith("-O") and a not in NOT_LEVELS:
            level = a
    digits = level[2:]
    if not digits:
        return "-O1"
    if digits.isascii() and digits.isdigit():
        return f"-O{min(int(digits), 3)}"
    return level if level in LEVELS else None


def lto(args: list[str]) -> str | None:
    """The LTO clang compiles (to bitcode, not an ELF object) or links with: "thin" when the
    last -flto switch is -flto=thin, "full" for another, None when there is none or it is
    -fno-lto."""
    switches = [a for a in args if a in ("-flto", "-fno-lto") or a.startswith("-flto=")]
    if not switches or switches[-1] == "-fno-lto":
        return None
    return "thin" if switches[-1] == "-flto=thin" else "full"


def link_stage(args: list[str]) -> str | None:
    """The stage of an LTO link (no source compiled, an -flto switch not undone): "link" for
    full LTO, whose link optimizes the whole program's bitcode once more, or "thin-link" for
    ThinLTO, whose backends optimize each module again after import. A link-time policy
    answers there; None for anything else."""
    if NO_CODEGEN.intersection(args) or {"-c", "-S"}.intersection(args) or source_files(args):
        return None
    mode = lto(args)
    return None if mode is None else "thin-link" if mode == "thin" else "link"


def links_with_lld(args: list[str]) -> bool:
    """Does clang's driver run lld (the last -fuse-ld or --ld-path names it)? Only lld loads
    a pass plugin into its LTO backend; GNU ld's LLVM gold plugin cannot."""
    linker = ""
    for a in args:
        if a.startswith(("-fuse-ld=", "--ld-path=")):
            linker = a.partition("=")[2]
    return linker == "lld" or Path(linker).name.startswith(("ld.lld", "lld"))
