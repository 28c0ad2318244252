"""`mlgo export` as one call: a trained policy made into everything a build can use."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from mlgo.problems.policy_files import load_policy
from mlgo.runtime.files import atomic_write_text, output_dir
from mlgo.train import policy_dir


@dataclass
class Release:
    saved_model: Path
    model_card: Path
    aot: Path | None = None  # model.h and objects, what LLVM's release mode embeds
    native_server: Path | None = None
    plugin: Path | None = None  # only for a problem the plugin serves


def release(policy: Path, out: Path, aot: bool = True, card: str | None = None) -> Release:
    """Writes the policy at POLICY (a run or its policy/) into OUT: its numpy form, a TF
    SavedModel with LLVM's feature names and a model card (CARD, or one from its run);
    with AOT also the AOT-compiled model, the native policy server and, where the problem
    has one, the clang plugin."""
    from mlgo.ship.export import export_saved_model
    from mlgo.ship.modelcard import model_card, policy_run

    pdir = policy_dir(policy)
    loaded = load_policy(pdir)
    with output_dir(out):
        saved = export_saved_model(loaded, out)
        for name in ("policy.npz", "normalization.json", "policy.json"):
            shutil.copyfile(pdir / name, out / name)
        calibrated = (pdir / "calibration.json").exists()
        card = card or model_card(loaded, policy_run(pdir), calibrated)
        atomic_write_text(out / "MODEL_CARD.md", card)
    result = Release(saved, out / "MODEL_CARD.md")
    if aot:
        from mlgo.llvm.toolchain import find_toolchain
        from mlgo.ship.aot import aot_compile, native_server
        from mlgo.ship.plugin import inliner_plugin

        result.aot = aot_compile(saved, out / "aot")
        result.native_server = native_server(loaded)
        if loaded.problem.plugin:
            result.plugin = inliner_plugin(loaded, find_toolchain())
    return result
