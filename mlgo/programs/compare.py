"""`mlgo build`'s comparison: each package built with the plain compiler and with `mlgo-cc`
and the policy service, from one pristine source; the linked programs' .text side by side.
`build.json` is rewritten after every package, so a package that fails loses no other's."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mlgo.corpus.extract import BuildError, Recipe
from mlgo.llvm.toolchain import Toolchain
from mlgo.programs.build import (
    SIZE_FLAGS,
    ProgramBuild,
    build_program,
    mlgo_compilers,
    plain_compilers,
    policy_service,
    pristine_source,
)
from mlgo.runtime.files import atomic_write_text


@dataclass(frozen=True)
class Variant:
    """One side of a comparison: its name, its (CC, CXX) and what they need in the
    environment."""

    name: str
    compilers: tuple[str, str]
    env: dict[str, str]


def variants(
    tc: Toolchain, service_env: dict[str, str], names: tuple[str, str] = ("plain", "mlgo")
) -> tuple[Variant, Variant]:
    """The plain compiler, and mlgo-cc over the same clang answered by the service at
    SERVICE_ENV."""
    served = dict(service_env, MLGO_CC=tc.clang, MLGO_CXX=tc.clangxx)
    return Variant(names[0], plain_compilers(tc), {}), Variant(names[1], mlgo_compilers(), served)


def build_pair(
    recipe: Recipe,
    work: Path,
    tc: Toolchain,
    pair: tuple[Variant, Variant],
    tests: bool = True,
    flags: list[str] | None = None,
    pristine: Path | None = None,
) -> tuple[ProgramBuild, ProgramBuild]:
    """Both variants of RECIPE built (and tested, if TESTS) in WORK/<variant> from one
    pristine source: PRISTINE, or the recipe's Debian source fetched into WORK."""
    pristine = pristine or pristine_source(recipe, work)
    a, b = (
        build_program(recipe, pristine, work / v.name, tc, v.name, v.compilers, v.env, tests, flags)
        for v in pair
    )
    return a, b


@dataclass
class Comparison:
    """The finished pairs, the packages that failed and why, and the policies used."""

    policies: list[Path]
    pairs: list[tuple[ProgramBuild, ProgramBuild]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    def totals(self) -> tuple[int, int, float]:
        """Plain .text, mlgo .text over every program, and the change in percent."""
        base = sum(sum(plain.text.values()) for plain, _ in self.pairs)
        ml = sum(sum(ml.text.values()) for _, ml in self.pairs)
        return base, ml, 100 * (ml / base - 1) if base else 0.0

    def save(self, path: Path) -> None:
        payload = {
            "policies": [str(p) for p in self.policies],
            "builds": [b.to_json() for pair in self.pairs for b in pair],
            "failed": self.failed,
            "delta_pct": self.totals()[2],
        }
        atomic_write_text(path, json.dumps(payload, indent=1))


def compare_programs(
    recipes: list[Recipe],
    policies: list[Path],
    out: Path,
    tc: Toolchain,
    tests: bool = True,
    backend: str = "auto",
    guard: bool = False,
) -> Comparison:
    """Builds every recipe plain and with the POLICIES served (SIZE_FLAGS on both) under
    OUT, saving OUT/build.json after each; a failed package is recorded and skipped.
    GUARD: mlgo-cc keeps the smaller of the policy's and the default's object per file."""
    result = Comparison(policies)
    with policy_service(policies, out / "service", backend) as service_env:
        pair = variants(tc, dict(service_env, MLGO_GUARD="size") if guard else service_env)
        for recipe in recipes:
            try:
                result.pairs.append(
                    build_pair(recipe, out / recipe.name, tc, pair, tests, SIZE_FLAGS)
                )
            except BuildError as e:
                result.failed[recipe.name] = str(e)
            result.save(out / "build.json")
    return result
