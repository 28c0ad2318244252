"""`mlgo export` as one call: a trained policy made into everything a build can use."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import save_policy
from mlgo.runtime.files import atomic_directory, atomic_write_text, output_dir


@dataclass
class Release:
    saved_model: Path
    model_card: Path
    aot: Path | None = None  # model.h and objects, what LLVM's release mode embeds
    native_server: Path | None = None
    plugin: Path | None = None  # only for a problem the plugin serves


def release(policy: MLPPolicy, out: Path, card: str, aot: bool = True) -> Release:
    """Writes POLICY into OUT: its numpy form, a TF SavedModel with LLVM's feature names and
    CARD, its model card (`modelcard.run_card` draws one from its run); with AOT also the
    AOT-compiled model, the native policy server and, where the problem has one, the clang
    plugin."""
    from mlgo.ship.export import export_saved_model

    with output_dir(out):
        saved = export_saved_model(policy, out)
        save_policy(policy, out)
        atomic_write_text(out / "MODEL_CARD.md", card)
    result = Release(saved, out / "MODEL_CARD.md")
    if aot:
        from mlgo.llvm.toolchain import find_toolchain
        from mlgo.ship.aot import native_server
        from mlgo.ship.plugin import inliner_plugin

        result.native_server = native_server(policy)
        # the server's build compiled the same policy's SavedModel: its objects, copied
        with atomic_directory(out / "aot") as staging:
            aot = result.native_server.parent / "aot"
            shutil.copytree(aot, staging, copy_function=shutil.copyfile, dirs_exist_ok=True)
        result.aot = out / "aot"
        if policy.problem.plugin:
            result.plugin = inliner_plugin(policy, find_toolchain())
    return result
