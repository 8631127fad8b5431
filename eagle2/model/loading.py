"""Load a target model + tokenizer + EAGLE head onto a device, once, from presets, folders or ids,
and choose the backend that runs them (forward.py), once."""
from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from .. import threads  # noqa: F401  (a forked child of a process that loads a model runs on one thread)
from ..devices import is_cuda
from ..errors import UserError
from ..heap import trim_heap
from .forward import DraftForward, EagerDraft, EagerTarget, TargetForward
from .head import DraftHead, EagleHead, head_from_checkpoint, read_checkpoint
from .head3 import head3_from_checkpoint, is_eagle3
from .llama import LlamaArgs, LlamaModel, hf_key_map, pack_linears
from .tokenizer import load_tokenizer
from .weights import DEFAULT_PRESET, PRESETS, embedded_key, hub_download, local_folder, resolve_target

log = logging.getLogger(__name__)
SUPPORTED = {"llama", "mistral", "qwen2"}


class TokenTexts:
    """Every token's display text in one string, with where each ends: a page holds one table for
    the model's life. A list of 49,152 strings decoded in one batch took 7-10 MiB of the process;
    decoded one by one into one string, 2-3 MiB (measured at ready, benchmarks/app-memory)."""

    def __init__(self, tokenizer, vocab_size: int):
        buf, self._ends, n = io.StringIO(), np.empty(vocab_size, np.int64), 0
        for i in range(vocab_size):
            text = tokenizer.decode([i])
            n += len(text)
            buf.write(text)
            self._ends[i] = n
        self._joined = buf.getvalue()

    def __len__(self) -> int:
        return len(self._ends)

    def texts(self, ids) -> list[str]:
        """The texts of `ids`; "<id>" for an id outside the vocabulary."""
        j, ends, n = self._joined, self._ends, len(self._ends)
        return [j[int(ends[i - 1]) if i else 0:int(ends[i])] if 0 <= i < n else f"<{i}>" for i in ids]


@dataclass(kw_only=True)
class Bundle:
    """Everything a decoder needs, loaded once per process and shared by sessions (read-only).
    `forward` and `draft` run the target and the head (forward.py: one backend, chosen at load);
    `target` and `head` are the torch modules where their eager forward is the one that runs, else
    None (the q4_1 kernels keep only the blocks they read)."""
    forward: TargetForward
    draft: DraftForward
    target: LlamaModel | None
    head: DraftHead | None  # EagleHead (EAGLE-1/2) or Eagle3Head
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    name: str
    head_name: str
    precision: str = ""  # what the target multiplies in: "float32", "bfloat16", "q4_1" (quantized.py)
    # computed once per model on first use: the token text table, a policy's index (LANTERN's neighbours)
    derived: dict = field(default_factory=dict, repr=False)

    def token_texts(self, ids: list[int]) -> list[str]:
        """Display text of single tokens, from a table decoded once per bundle."""
        table = self.derived.get("token_texts")
        if table is None:
            table = self.derived["token_texts"] = TokenTexts(self.tokenizer, self.args.vocab_size)
        return table.texts(ids)

    @property
    def args(self) -> LlamaArgs:
        """The target's sizes."""
        return self.forward.args

    @property
    def description(self) -> str:
        """One line: which forwards run."""
        return f"{self.forward.description}; {self.draft.description}"

    @property
    def eos_ids(self) -> frozenset[int]:
        """The tokens that end a reply (the model's and the tokenizer's), found once per bundle:
        a decoder reads them every step, and the tokenizer's lookup costs tens of microseconds."""
        ids = self.derived.get("eos_ids")
        if ids is None:
            found = set(self.args.eos_ids)
            if self.tokenizer.eos_token_id is not None:
                found.add(self.tokenizer.eos_token_id)
            ids = self.derived["eos_ids"] = frozenset(found)
        return ids


def pick_device(device: str | None) -> torch.device:
    device = device or "cpu"
    if is_cuda(device):
        if not torch.cuda.is_available():
            raise UserError("CUDA was requested but no GPU is available here: use --device cpu.")
        return torch.device(device)
    if device != "cpu":
        raise UserError(f"Unknown device {device!r}: use cpu or cuda.")
    return torch.device("cpu")


def _weights_state(folder: Path) -> dict:
    files = sorted(folder.glob("*.safetensors"))
    state = {}
    if files:
        for f in files:
            with safe_open(str(f), "pt") as sf:
                for k in sf.keys():
                    state[k] = sf.get_tensor(k)
        return state
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if not bins:
        raise UserError(f"{folder} has no *.safetensors or pytorch_model*.bin weights.")
    for b in bins:
        state.update(torch.load(str(b), map_location="cpu", weights_only=True))
    return state


def target_args(folder: Path) -> LlamaArgs:
    """The target's sizes, from its config.json (a UserError for a model type this project does not run)."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"Cannot read {folder / 'config.json'} ({e}).") from None
    if cfg.get("model_type") not in SUPPORTED:
        raise UserError(f"Model type {cfg.get('model_type')!r} is not supported; "
                        f"supported: {', '.join(sorted(SUPPORTED))}.")
    return LlamaArgs.from_hf(cfg)


def load_target(folder: Path, device: torch.device, dtype: torch.dtype) -> LlamaModel:
    args = target_args(folder)
    with torch.device("meta"):
        model = LlamaModel(args)
    state = {}
    for k, v in _weights_state(folder).items():
        mk = hf_key_map(k)
        if mk is not None:
            state[mk] = v
    if args.tie_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if args.tie_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
        missing = [m for m in missing if m != "lm_head.weight"]
    if missing or unexpected:
        raise UserError(f"Weights in {folder} do not match the model its config.json describes "
                        f"(missing {missing[:3]}, unexpected {unexpected[:3]}).")
    return model.to(device=device, dtype=dtype).eval()


def load_draft_head(folder: Path, target_args: LlamaArgs) -> tuple[DraftHead, torch.Tensor | None]:
    """An EAGLE-1/2 or EAGLE-3 head, by its checkpoint's layout; returns (head, its own LM head weight
    or None). UserError for anything missing, corrupt or mismatched."""
    cfg, state = read_checkpoint(folder)
    build = head3_from_checkpoint if is_eagle3(cfg, state) else head_from_checkpoint
    return build(Path(folder), cfg, state, target_args)


def _fetch_if_id(name: str, files: list[str], what: str = "head") -> Path:
    p = local_folder(name, what)
    return p if p is not None else hub_download(name, files)


def head_label(head: str, preset=None) -> str:
    """The head as people name it, never a machine path: the preset's shipped head by the preset's
    name, a local folder by its path under the working directory (else its last component), a Hub
    id as it is."""
    p = Path(str(head)).expanduser()
    if not p.exists():
        return str(head)  # a Hub id
    p = p.resolve()
    if preset is not None and preset.head and p == Path(preset.head).resolve():
        return f"{preset.name} (shipped {preset.head_kind} head)"
    try:
        return str(p.relative_to(Path.cwd().resolve())) or p.name
    except ValueError:
        return p.name or str(head)


def check_sources(target: str | None, head: str | None) -> None:
    """Fail fast (before torch/transformers work): a path-shaped --target / --head with nothing there."""
    if target and target not in PRESETS:
        local_folder(target, "target")
    if head not in (None, "random"):
        local_folder(head, "head")


def load_bundle(target: str | None = None, head: str | None = None, device: str | None = "cpu",
                dtype: str | None = None, seed_random_head: int = 0, pack: bool = True) -> Bundle:
    """`target`: preset name, local folder or HF id. `head`: local folder, HF id, 'random', or
    None for the preset's shipped head (random if the preset has none yet). `pack`: prepack the
    frozen weights for CPU fp32 inference (llama.PackedWeight); False gives the plain matmuls.

    The backend is chosen first, from the request; each then loads what it runs (docs/layout.md,
    Backends): the embedded model in q4_1 from its GGUF alone, another q4_1 model quantised from
    its fp32 weights, fp32 / bf16 the eager modules."""
    check_sources(target, head)
    dev = pick_device(device)
    q4, dt = _precision(target, dev, dtype)
    target = target or DEFAULT_PRESET
    preset = PRESETS.get(target)
    where = resolve_target(target)
    folder = Path(where) if isinstance(where, Path) else hub_download(
        where, ["config.json", "*.safetensors", "tokenizer*", "special_tokens_map.json", "*.jinja",
                "generation_config.json", "vocab.json", "merges.txt"])
    args = target_args(folder)
    tok = load_tokenizer(folder)
    h, own, head_name = _draft_head(head, preset, args, seed_random_head)
    h = h.to(device=dev, dtype=dt).eval().requires_grad_(False)
    name = preset.description if preset else str(target)
    key = embedded_key(target)
    kernels = None
    if q4 and key is not None:   # the embedded model in its own precision: its GGUF's blocks, no fp32 model
        from .qbuild import gguf_backends
        from .weights import embedded_gguf
        kernels = gguf_backends(args, embedded_gguf(key), h, own, log=log.warning)
    model = None
    if kernels is None:
        model = load_target(folder, dev, dt).requires_grad_(False)
        if not getattr(h, "has_embed", False):
            h.embed_tokens.weight = torch.nn.Parameter(model.embed_tokens.weight.detach(), requires_grad=False)
        h.attach(model.lm_head.weight, None if own is None else own.to(dev, dt))
        model.aux_layers = h.aux_layers  # an EAGLE-3 head reads these layers' states
        if q4 and key is None:   # another model in q4_1: quantised from its fp32 weights
            from .qbuild import kernel_backends
            kernels = kernel_backends(model, h, log=log.warning)
    if q4 and kernels is None:
        log.warning("--dtype q4_1 is not available here (the line above says why); running float32.")
    if kernels is not None:
        # the backend holds what it runs: no fp32 target (nor the head, where the kernels run its step)
        fwd, draft = kernels
        keep_head = h if isinstance(draft, EagerDraft) else None
        del model, h
        trim_heap()
        return Bundle(forward=fwd, draft=draft, target=None, head=keep_head, tokenizer=tok, device=dev, dtype=dt,
                      name=name, head_name=head_name, precision=fwd.precision)
    if pack:  # frozen from here on: prepack for few-row matmuls (CPU fp32 only, PackedWeight.build)
        pack_linears(model)
        h.pack()
    packed, precision = model.lm_head.packed is not None, str(dt).removeprefix("torch.")
    fwd = EagerTarget(model, packed)
    draft = EagerDraft(h, "prepacked weights" if packed else precision)
    return Bundle(forward=fwd, draft=draft, target=model, head=h, tokenizer=tok, device=dev, dtype=dt,
                  name=name, head_name=head_name, precision=precision)


def _precision(target: str | None, dev: torch.device, dtype: str | None) -> tuple[bool, torch.dtype]:
    """(whether the q4_1 kernels are asked for, the dtype of everything else)."""
    if dtype is None and dev.type == "cpu" and embedded_key(target or DEFAULT_PRESET) is not None:
        # the embedded model's own precision: its GGUF's blocks on this project's integer kernels,
        # about 5x fp32's speed on a CPU, and greedy trees equal plain decoding by construction
        # (quantized.py); where the kernels cannot run, a line says why and fp32 serves
        dtype = "q4_1"
    if dtype in ("q4_1", "Q4_1"):
        if dev.type != "cpu":
            raise UserError("--dtype q4_1 runs on the CPU (its kernels are AVX2/VNNI); on a GPU use bfloat16.")
        return True, torch.float32   # activations, caches and the draft head stay fp32
    if dtype is None:
        # fp32 on a CPU: there greedy trees equal plain decoding token for token. In bf16 they do not
        # (its kernels round differently for 1 and N rows: 25% of prompts identical on an AMX Xeon,
        # where bf16 trees cost almost nothing over one token; benchmarks/bf16-eager-amx), and CPUs
        # without native bf16 run it far slower.
        return False, torch.float32 if dev.type == "cpu" else torch.bfloat16
    dt = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}.get(dtype)
    if dt is None:
        raise UserError(f"Unknown dtype {dtype!r}: use q4_1, float32, bfloat16 or float16.")
    return False, dt


def _draft_head(head: str | None, preset, args: LlamaArgs, seed: int) -> tuple[DraftHead, torch.Tensor | None, str]:
    """(the draft head, its own LM head weight or None, its name for people), fp32 on the CPU: the
    preset's shipped head when none is named, a random one for 'random'."""
    if head is None and preset is not None and preset.head and (Path(preset.head) / "config.json").exists():
        head = preset.head
    if head in (None, "random"):
        torch.manual_seed(seed)
        h, own, name = EagleHead(args), None, "random (untrained)"
        h.has_embed = False
    else:
        hf = _fetch_if_id(head, ["config.json", "*.safetensors", "pytorch_model.bin"])
        (h, own), name = load_draft_head(hf, args), head_label(head, preset)
    if not getattr(h, "has_embed", False):
        # it reads the target's embedding (given it by the backend): its own random table (113 MB
        # at this vocabulary) goes now, not after the target's weights have been read beside it
        h.embed_tokens.weight = torch.nn.Parameter(torch.empty(0, args.dim), requires_grad=False)
    return h, own, name
