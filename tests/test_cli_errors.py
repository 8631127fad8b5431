"""`python -m eagle2 generate` (and `python -m eagle2_train`) on bad input: exit code 2 and one clear
"error: ..." line on stderr, never a traceback; and the --json summary on good input.

Most cases call eagle2.tools.cli.main in-process on a tiny random model folder (fast); a few go through
a real `python -m eagle2` subprocess to check what a user actually sees.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle2.tools.cli import main

REPO = Path(__file__).resolve().parent.parent
JSON_KEYS = {"policy", "text", "token_ids", "new_tokens", "target_forwards", "tau", "wall_s", "tokens_per_s"}


@pytest.fixture(scope="module")
def tiny(tiny_target):
    folder, _ = tiny_target("cli", vocab=97, max_pos=32, lm_std=0.3)
    return str(folder)


@pytest.fixture(scope="module")
def corrupt_head(tmp_path_factory):
    d = tmp_path_factory.mktemp("corrupt-head")
    (d / "config.json").write_text('{"hidden_size": 64, "num_attention_heads": ')  # truncated JSON
    (d / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    return str(d)


def run_main(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_clean_error(code, err, *fragments):
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert "Traceback" not in err
    for f in fragments:
        assert f.lower() in lines[0].lower(), lines[0]


def base(tiny, *extra, prompt="w1 w2 w3 w4"):
    return ["generate", "--target", tiny, "--head", "random", "--prompt", prompt, "--max-new-tokens", "6",
            *extra]


CASES = {
    "empty-prompt": (dict(prompt=""), [], "prompt is empty"),
    "blank-prompt": (dict(prompt="   \n"), [], "prompt is empty"),
    "prompt-too-long": (dict(prompt=" ".join(f"w{i % 90 + 1}" for i in range(40))), [], "context"),
    "total-tokens-0": ({}, ["--total-tokens", "0"], "total tokens"),
    "depth-0": ({}, ["--depth", "0"], "depth"),
    "top-k-0": ({}, ["--top-k", "0"], "top k"),
    "temperature-negative": ({}, ["--temperature", "-1"], "temperature"),
    "top-p-0": ({}, ["--top-p", "0"], "top-p"),
    "max-new-tokens-0": ({}, ["--max-new-tokens", "0"], "max new tokens"),
    "unknown-policy": ({}, ["--policy", "nonsense"], "unknown policy"),
    "unknown-dtype": ({}, ["--dtype", "float7"], "dtype"),
    "unknown-device": ({}, ["--device", "tpu"], "device"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2(capsys, tiny, case):
    kw, extra, fragment = CASES[case]
    code, out, err = run_main(capsys, base(tiny, *extra, **kw))
    assert_clean_error(code, err, fragment)


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a model fails the test: what it guards must be reported before any loading."""
    import eagle2.model.loading as loading

    def refuse(*a, **kw):
        raise AssertionError("a model was loaded before the input was checked")
    monkeypatch.setattr(loading, "load_bundle", refuse)
    monkeypatch.setattr(loading, "load_target", refuse)


EARLY = {  # bad input reported before the model loads (prompt-too-long needs the tokenizer)
    **{k: CASES[k] for k in ("empty-prompt", "unknown-policy", "max-new-tokens-0", "total-tokens-0", "depth-0",
                             "top-p-0")},
    "typo-policy": ({}, ["--policy", "eagle"], "unknown policy"),
    "threads-negative": ({}, ["--threads", "-2"], "--threads"),
    "foreign-flag": ({}, ["--policy", "plain", "--ddd-threshold", "0.5"], "--ddd-threshold"),
}


@pytest.mark.parametrize("case", list(EARLY))
def test_bad_input_is_reported_before_loading(capsys, tiny, no_loading, case):
    kw, extra, fragment = EARLY[case]
    code, out, err = run_main(capsys, base(tiny, *extra, **kw))
    assert_clean_error(code, err, fragment)


def test_missing_head_or_target_folder_says_no_such_folder_before_loading(capsys, tiny, monkeypatch):
    import eagle2.model.loading as loading
    monkeypatch.setattr(loading, "load_target", lambda *a, **kw: pytest.fail("the target was loaded"))
    for flag, value in (("--head", "/nonexistent"), ("--target", "./no-such-model-folder"),
                        ("--head", "runs/stage3/head")):
        argv = base(tiny)
        argv[argv.index(flag) + 1] = value
        code, _, err = run_main(capsys, argv)
        assert_clean_error(code, err, f"no such folder: {value}")
        assert "hugging face" not in err.lower()


def test_generate_defaults_to_the_policy_that_pays_on_the_device():
    from eagle2.policies.registry import default_policy
    from eagle2.tools.cli import build_parser, resolve_policy
    a = build_parser().parse_args(["generate", "--prompt", "hi"])
    assert a.policy is None and resolve_policy(a) == default_policy("cpu")
    a = build_parser().parse_args(["generate", "--prompt", "hi", "--device", "cuda:0"])
    assert resolve_policy(a) == default_policy("cuda")
    a = build_parser().parse_args(["generate", "--prompt", "hi", "--device", "cuda", "--policy", "static"])
    assert resolve_policy(a) == "static"


def test_unknown_model(capsys):
    code, _, err = run_main(capsys, ["generate", "--target", "no-such-model", "--prompt", "hi"])
    assert_clean_error(code, err, "unknown model")


@pytest.mark.parametrize("flag, value", [("--target", "bad..name"), ("--head", "owner.git"),
                                         ("--head", "ends-with-")])
def test_malformed_hub_id_fails_before_loading(capsys, monkeypatch, tiny, flag, value):
    """A name that is neither a folder here nor a Hub id (huggingface_hub's rules) is refused before
    the target loads or the Hub is asked, saying what is wrong with it."""
    import eagle2.model.loading as loading
    monkeypatch.setattr(loading, "load_target", lambda *a, **kw: pytest.fail("the target was loaded"))
    monkeypatch.setattr(loading, "hub_download", lambda *a, **kw: pytest.fail("the Hub was asked"))
    argv = base(tiny)
    argv[argv.index(flag) + 1] = value
    code, _, err = run_main(capsys, argv)
    assert_clean_error(code, err, f"{flag[2:]} {value!r} is neither a local folder nor a hugging face id (")


def test_target_folder_without_config(capsys, tmp_path):
    code, _, err = run_main(capsys, ["generate", "--target", str(tmp_path), "--prompt", "hi"])
    assert_clean_error(code, err, "config.json")


def test_corrupt_head_folder(capsys, tiny, corrupt_head):
    argv = base(tiny)
    argv[argv.index("--head") + 1] = corrupt_head
    code, _, err = run_main(capsys, argv)
    assert_clean_error(code, err, "config")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_gpu(capsys, tiny):
    code, _, err = run_main(capsys, base(tiny, "--device", "cuda"))
    assert_clean_error(code, err, "cuda")


def test_json_summary_in_process(capsys, tiny, tmp_path):
    trace = tmp_path / "trace.json"
    code, out, err = run_main(capsys, base(tiny, "--json", "--policy", "eagle2", "--total-tokens", "8",
                                           "--depth", "2", "--top-k", "3", "--trace-out", str(trace)))
    assert code == 0, err
    s = json.loads(out.strip().splitlines()[-1])
    assert JSON_KEYS <= set(s)
    assert s["policy"] == "eagle2" and s["new_tokens"] == len(s["token_ids"]) == 6
    assert s["target_forwards"] >= 1 and s["tau"] == pytest.approx(6 / s["target_forwards"])
    from eagle2.policies.registry import TRACES
    t = TRACES.load(trace)
    assert sum(len(st.new_tokens) for st in t.steps) == 6
    assert [tok for st in t.steps for tok in st.new_tokens] == s["token_ids"]


def test_generation_stops_at_context_end(capsys, tiny):
    """A prompt that fits but leaves little room: generation ends cleanly ("context")."""
    prompt = " ".join(f"w{i + 1}" for i in range(20))
    argv = base(tiny, "--json", "--policy", "static", prompt=prompt)
    argv[argv.index("--max-new-tokens") + 1] = "100"
    code, out, err = run_main(capsys, argv)
    assert code == 0, err
    s = json.loads(out.strip().splitlines()[-1])
    assert s["finished"] == "context" and 1 <= s["new_tokens"] < 100


# ------------------------------------------------------------------ real subprocesses

def run_cli(*args, timeout=240, module="eagle2"):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if (os.cpu_count() or 1) <= 2:
        env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow   # the full suite's: fresh interpreters importing torch (the fast tier stays under two minutes)
def test_subprocess_bad_input(tiny):
    r = run_cli(*base(tiny, "--depth", "0"))
    assert_clean_error(r.returncode, r.stderr, "depth")
    assert r.stdout == ""


@pytest.mark.parametrize("cmd", ["train", "prompts"])
def test_training_commands_name_their_own_entry_point(capsys, cmd):
    code, _, err = run_main(capsys, [cmd, "--out", "runs/x"])
    assert_clean_error(code, err, f"python -m eagle2_train {cmd}")


@pytest.mark.slow   # the full suite's: a fresh interpreter importing torch (the fast tier stays under two minutes)
def test_subprocess_training_entry_point(tmp_path):
    """`python -m eagle2_train train` parses its own options and reports a UserError as one line."""
    r = run_cli("train", "--out", str(tmp_path / "run"), "--ttt-steps", "0", module="eagle2_train")
    assert_clean_error(r.returncode, r.stderr, "--ttt-steps must be in [1, 8]")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.real_model
def test_subprocess_json_default_model():
    """The default preset end to end (its default head), small output."""
    r = run_cli("generate", "--prompt", "Name three colours.", "--max-new-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert JSON_KEYS <= set(s)
    from eagle2.policies.registry import default_policy
    assert s["policy"] == default_policy("cpu")                 # no --policy: the one that pays here
    assert 1 <= s["new_tokens"] == len(s["token_ids"]) <= 8
    assert isinstance(s["text"], str) and s["wall_s"] > 0
    assert s["tokens_per_s"] == pytest.approx(s["new_tokens"] / s["wall_s"])
    assert s["tau"] == pytest.approx(s["new_tokens"] / s["target_forwards"])
