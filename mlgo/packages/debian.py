"""A recipe's Debian side: its build dependencies installed and its source package unpacked.

This is the only place that talks to apt and dpkg.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from mlgo.packages.recipes import Recipe
from mlgo.runtime.commands import BuildError, run_logged


def ensure_build_depends(recipe: Recipe, log: Path) -> None:
    missing = [
        p
        for p in recipe.build_depends
        if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode != 0
    ]
    if not missing:
        return
    if os.geteuid() != 0:
        raise BuildError(
            f"{recipe.name} needs Debian packages {' '.join(missing)}; install them as root"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run_logged(
        ["apt-get", "install", "-y", "-q", *missing],
        Path("/"),
        log,
        900,
        env,
        f"apt-get install {' '.join(missing)}",
    )


def _source_versions(source: str) -> list[str]:
    out = subprocess.run(["apt-cache", "showsrc", source], capture_output=True, text=True)
    versions = re.findall(r"^Version: (\S+)$", out.stdout, re.M)
    return list(dict.fromkeys(versions))


def fetch_source(recipe: Recipe, work: Path, log: Path) -> Path:
    """Downloads and unpacks the Debian source package; returns the source tree.

    When the newest version cannot be downloaded (a security update whose files the
    mirror lacks), the other versions apt knows are tried in turn.
    """
    dl = work / "download"
    if not any(dl.glob(f"{recipe.source}_*.dsc")):
        shutil.rmtree(dl, ignore_errors=True)
        dl.mkdir(parents=True)
        what = f"apt-get source {recipe.source} (is deb-src enabled? run tools/setup.sh)"
        try:
            run_logged(
                ["apt-get", "source", "--download-only", recipe.source], dl, log, 900, what=what
            )
        except BuildError:
            for version in _source_versions(recipe.source):
                try:
                    run_logged(
                        ["apt-get", "source", "--download-only", f"{recipe.source}={version}"],
                        dl,
                        log,
                        900,
                        what=what,
                    )
                    break
                except BuildError:
                    continue
            else:
                raise
    dsc = sorted(dl.glob(f"{recipe.source}_*.dsc"))[-1]
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    run_logged(
        ["dpkg-source", "--no-check", "-x", str(dsc), str(src)],
        dl,
        log,
        600,
        what=f"dpkg-source -x {dsc.name}",
    )
    return src
