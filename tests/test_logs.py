"""The engine's lines go through logging; the entry points show them on stderr, once each."""
import logging

from eagle2.logs import show_on_stderr


def test_an_engine_line_reaches_the_current_stderr_once(capsys):
    show_on_stderr()
    show_on_stderr()   # a second entry point in the same process (the tests call main() often)
    logging.getLogger("eagle2.model.weights").info("converting x.gguf to safetensors (once, ~30 s)...")
    logging.getLogger("eagle2.model.weights").debug("not shown")
    err = capsys.readouterr().err
    assert err.splitlines().count("eagle2: converting x.gguf to safetensors (once, ~30 s)...") == 1
    assert "not shown" not in err
