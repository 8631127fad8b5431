"""What a page's process holds at ready, guarded where it once grew: loading a model imports none
of torch's compiler (a random init on the meta device imported dynamo and sympy: 74 MiB) nor its
benchmark timer with setuptools (read only when t(N) is measured). The figures, with their command,
are in benchmarks/app-memory."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_AT_READY = ("torch._dynamo", "sympy", "torch.utils.benchmark", "setuptools",
                "transformers.models.llama.configuration_llama")


def test_the_page_and_a_loaded_model_import_no_compiler(tiny_target):
    folder, _ = tiny_target("memory", vocab=97, max_pos=64)
    code = ("import sys; import ui.page, ui.model; from eagle2.model.loading import load_bundle; "
            f"b = load_bundle(target={str(folder)!r}, head='random'); b.token_texts([0, 1]); "
            f"print(sorted(m for m in {NOT_AT_READY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
