"""`mlgo export`: a trained policy shipped as the artifacts builds use."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlgo.cli.options import PolicyOpt, console, own_output


def export(
    policy: PolicyOpt,
    out: Annotated[Path, typer.Option(help="where the shipped policy goes", callback=own_output)],
    aot: Annotated[
        bool,
        typer.Option(
            help="also AOT-compile it (OUT/aot), build the native server and the clang plugin"
        ),
    ] = True,
) -> None:
    """Write a policy as a TF SavedModel (LLVM's feature names) beside its numpy form,
    with a model card drawn from its run (budget) and its evaluations; then AOT-compile
    it into OUT/aot (model.h + objects, what LLVM's release mode embeds)."""
    from mlgo.problems.policy_files import load_policy
    from mlgo.ship.release import release
    from mlgo.train import policy_dir
    from mlgo.train.modelcard import run_card

    pdir = policy_dir(policy)
    loaded = load_policy(pdir)  # once: what is released is what was read
    shipped = release(loaded, out, run_card(loaded, pdir), aot)
    console.print(f"wrote {shipped.saved_model} and {shipped.model_card}")
    if shipped.aot:
        console.print(f"wrote {shipped.aot} (model.h and objects)")
        console.print(f"native policy server: {shipped.native_server}")
    if shipped.plugin:
        p = shipped.plugin
        console.print(f"clang plugin: {p} (clang-22 -fpass-plugin={p} ...)")
