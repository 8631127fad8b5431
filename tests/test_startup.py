"""What a user sees when starting things: `python app.py` says in the terminal when the model is
ready (or why it failed, while the page keeps serving Replay); a --head / --target that looks like
a local path and is not there says "no such folder"; bad start-up options fail at once; the page
names the head, never a machine path."""
from __future__ import annotations

import subprocess
import sys

import pytest

from app_process import REPO, App
from eagle2.errors import UserError
from eagle2.model.loading import check_sources, head_label
from eagle2.model.weights import PRESETS, is_hub_id, local_folder, looks_like_path, resolve_target



@pytest.mark.parametrize("name", ["/nonexistent", "./nope", "../nope", "~/nope-eagle2-head", "runs/stage3/head",
                                  "runs/head/", "a--b/c"])
def test_path_shaped_names_that_are_not_there_say_no_such_folder(name):
    assert looks_like_path(name)
    for what in ("head", "target"):
        with pytest.raises(UserError, match=f"no such folder: {name}"):
            local_folder(name, what)
    with pytest.raises(UserError, match="no such folder"):
        resolve_target(name)
    with pytest.raises(UserError, match="no such folder"):
        check_sources(None, name)


@pytest.mark.parametrize("name", ["yuhuili/EAGLE-LLaMA3-Instruct-8B", "owner/name", "gpt2"])
def test_hub_ids_are_not_taken_for_paths(name):
    assert is_hub_id(name) and not looks_like_path(name)
    assert local_folder(name, "head") is None       # left to the Hub
    check_sources(name, name)


def test_existing_folders_and_files(tmp_path):
    assert local_folder(str(tmp_path), "head") == tmp_path
    f = tmp_path / "weights.bin"
    f.write_bytes(b"")
    with pytest.raises(UserError, match="is a file"):
        local_folder(str(f), "head")


def test_head_label_is_a_name_not_a_machine_path(tmp_path, monkeypatch):
    preset = PRESETS["smollm2-135m"]
    assert head_label(preset.head, preset) == "smollm2-135m (shipped EAGLE-3 head)"
    assert head_label("yuhuili/EAGLE-x", preset) == "yuhuili/EAGLE-x"
    (tmp_path / "runs" / "head").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert head_label(str(tmp_path / "runs" / "head")) == "runs/head"   # under the working directory
    monkeypatch.chdir(REPO)
    assert head_label(str(tmp_path / "runs" / "head")) == "head"        # elsewhere: the folder's name


# ------------------------------------------------------------------ python app.py, for real

@pytest.mark.slow
def test_app_says_when_the_model_is_ready(tmp_path, tiny_target):
    folder, _ = tiny_target("startup", vocab=97, max_pos=64)
    app = App(tmp_path, "--target", str(folder), "--head", "random")
    try:
        out = app.wait_for("ready at", 0)
        line = next(ln for ln in out.splitlines() if ln.startswith("ready at"))
        assert line.startswith(f"ready at {app.url} (model loaded in ") and line.endswith(")"), line
        assert " s; " in line and "forward" in line, line  # and which forward runs (eager / compiled)
        assert f"serving {app.url}" in out.splitlines()[0]
        assert app.serves()
        assert "error" not in app.text()[1].lower()
    finally:
        app.stop()


@pytest.mark.slow
def test_app_with_a_missing_head_folder_says_so_and_keeps_serving(tmp_path):
    """Also: with no --host / --port, Gradio's GRADIO_SERVER_NAME / GRADIO_SERVER_PORT say where."""
    app = App(tmp_path, "--head", "/nonexistent", by_env=True)
    try:
        assert app.wait_for("serving ", 0).startswith(f"serving {app.url};")
        err = app.wait_for("no such folder", 1)
        lines = [ln for ln in err.splitlines() if "no such folder" in ln]
        assert len(lines) == 1 and lines[0].startswith("error: ") and "/nonexistent" in lines[0], err
        assert "Hugging Face" not in err and "Traceback" not in err
        assert app.serves()                                   # the page still serves Replay
        assert "ready at" not in app.text()[0]
    finally:
        app.stop()


@pytest.mark.parametrize("args, fragment", [(["--threads", "-1"], "--threads"),
                                            (["--concurrency", "0"], "--concurrency"),
                                            (["--port", "70000"], "--port"), (["--port", "0"], "--port")])
def test_app_rejects_bad_options_before_loading(args, fragment):
    r = subprocess.run([sys.executable, str(REPO / "app.py"), *args], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and fragment in r.stderr.splitlines()[-1] and "Traceback" not in r.stderr, r.stderr
    # nothing heavy was imported (so nothing loaded): app.main refuses the options with torch and
    # Gradio still absent from the process
    r = subprocess.run([sys.executable, "-c", REFUSED_BEFORE_IMPORTS, *args], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.stdout.split() == ["2", "False", "False"], (r.stdout, r.stderr[-2000:])


REFUSED_BEFORE_IMPORTS = """
import sys
import app
try:
    rc = app.main(sys.argv[1:])
except SystemExit as e:   # argparse's own refusals
    rc = e.code
print(rc, "torch" in sys.modules, "gradio" in sys.modules)
"""


@pytest.mark.slow
def test_a_port_in_use_is_one_line_and_a_clean_exit(tiny_target):
    """The port is taken while the model loads in the background: one line says so and the app
    exits 2 (the interpreter's exit under the loading thread aborted it, exit 134)."""
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        folder, _ = tiny_target("startup", vocab=97, max_pos=64)
        r = subprocess.run([sys.executable, str(REPO / "app.py"), "--host", "127.0.0.1", "--port", str(port),
                            "--target", str(folder), "--head", "random"],
                           cwd=REPO, capture_output=True, text=True, timeout=180)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: cannot serve on 127.0.0.1:{port} "), r.stderr
    assert "Traceback" not in r.stderr and "terminate" not in r.stderr, r.stderr
