"""llama.cpp as a peer row of the bench (eagle2/tools/llamacpp.py): the F32 conversion of a GGUF keeps
every metadata field and tensor (a tiny synthetic file, no llama_cpp needed), the rows are skipped with
one line where llama_cpp is missing, and, where it is installed, llama.cpp's greedy tokens on the F32
file against the engine's eager plain decoding."""
from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFValueType as V, GGUFWriter  # noqa: E402

from eagle2.tools import llamacpp  # noqa: E402
from eagle2.tools.bench import Row, without_missing_peers  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def write_tiny_gguf(path: Path) -> dict[str, np.ndarray]:
    """A small llama-shaped GGUF: metadata of every kind the real file has (strings, ints, floats,
    bools, string and int arrays, a non-ASCII string) and F32, Q8_0 and Q4_1 tensors. Returns the
    float values each tensor holds (the quantised ones as dequantised)."""
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), "llama")
    w.add_string("general.name", "tiny ë model")
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.rope.freq_base", 10000.5)
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_Q4_1))
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", ["<|endoftext|>", "Ġthe", "ä", "a b"])
    w.add_key_value("tokenizer.ggml.token_type", [3, 1, 1, 1], V.ARRAY, sub_type=V.INT32)
    w.add_array("tokenizer.ggml.scores", [0.0, -1.5, -2.25, 3.0])
    w.add_uint32("tokenizer.ggml.eos_token_id", 0)
    w.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    values = {}
    norm = rng.standard_normal(64).astype(np.float32)
    w.add_tensor("blk.0.attn_norm.weight", norm)
    values["blk.0.attn_norm.weight"] = norm
    for name, qtype, shape in [("token_embd.weight", Q.Q8_0, (8, 64)), ("blk.0.ffn_up.weight", Q.Q4_1, (4, 96)),
                               ("blk.0.attn_q.weight", Q.Q4_1, (3, 32))]:
        x = rng.standard_normal(shape).astype(np.float32)
        q = gguf.quants.quantize(x, qtype)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
        values[name] = gguf.quants.dequantize(q, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return values


def fields_of(r: GGUFReader) -> dict:
    """{key: (types, value)} of a file's metadata, strings as their bytes."""
    out = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF."):
            continue
        if f.types[0] == V.ARRAY and f.types[-1] == V.STRING:
            val = [bytes(f.parts[i]) for i in f.data]
        elif f.types[0] == V.STRING:
            val = bytes(f.parts[-1])
        else:
            val = f.contents()
        out[k] = ([t.name for t in f.types], val)
    return out


def test_the_f32_conversion_keeps_every_field_and_tensor(tmp_path):
    src, dst = tmp_path / "tiny.Q4_1.gguf", tmp_path / "out" / "tiny.f32.gguf"
    values = write_tiny_gguf(src)
    llamacpp.dequantize_gguf(src, dst)
    assert sorted(p.name for p in dst.parent.iterdir()) == ["tiny.f32.gguf"]  # no part left behind
    a, b = GGUFReader(str(src)), GGUFReader(str(dst))
    fa, fb = fields_of(a), fields_of(b)
    assert list(fa) == list(fb)  # every field, in the file's order
    assert fb.pop("general.file_type") == (["UINT32"], int(gguf.LlamaFileType.ALL_F32))
    assert fa.pop("general.file_type") == (["UINT32"], int(gguf.LlamaFileType.MOSTLY_Q4_1))
    assert fa == fb
    assert fb["tokenizer.ggml.token_type"] == (["ARRAY", "INT32"], [3, 1, 1, 1])
    assert fb["general.name"][1] == "tiny ë model".encode()
    assert [t.name for t in b.tensors] == [t.name for t in a.tensors] == list(values)
    for ta, tb in zip(a.tensors, b.tensors):
        assert tb.tensor_type == Q.F32 and list(tb.shape) == list(ta.shape)
        np.testing.assert_array_equal(np.asarray(tb.data).reshape(values[tb.name].shape), values[tb.name])


def test_the_rows_are_skipped_in_one_line_without_llama_cpp(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` now raises ImportError
    assert "Error" in llamacpp.missing_reason() and "llama_cpp" in llamacpp.missing_reason()
    rows = [Row("plain"), Row("llama.cpp-f32"), Row("eagle2"), Row("llama.cpp-q4_1")]
    kept, skipped = without_missing_peers(rows)
    assert kept == [Row("plain"), Row("eagle2")] and set(skipped) == {"llama.cpp-f32", "llama.cpp-q4_1"}
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("llama.cpp rows skipped (llama.cpp-f32, llama.cpp-q4_1): "
                          'pip install -e ".[llamacpp]"')
    assert without_missing_peers([Row("plain"), Row("hf")]) == ([Row("plain"), Row("hf")], {})
    assert capsys.readouterr().err == ""  # no peer asked for: nothing said
    assert Row("llama.cpp-f32").baseline and Row.parse("llama.cpp-q4_1").label == "llama.cpp-q4_1"


def test_the_extra_is_optional_and_pinned():
    """`llamacpp` is an extra of its own (it builds llama.cpp from source): one exact pin, in no
    requirements file nor in `dev`."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (pin,) = extras["llamacpp"]
    assert pin.startswith("llama-cpp-python==")
    for other in ("requirements.txt", "requirements-dev.txt"):
        assert "llama" not in (REPO / other).read_text()
    assert not any("llama" in d for d in extras["dev"])


@pytest.mark.slow
def test_llama_cpp_f32_greedy_against_the_engine(real_bundle):
    """llama.cpp on the F32 file decodes the engine's eager plain greedy tokens from the same prompt ids."""
    pytest.importorskip("llama_cpp")
    from eagle2.decoding.decoder import Decoder
    from eagle2.model.chat import chat_ids
    from eagle2.policies.registry import PLAIN

    msgs = [{"role": "user", "content": "What is 12 plus 30?"}]
    ids = chat_ids(real_bundle.tokenizer, msgs)
    d = Decoder(real_bundle, PLAIN, max_new_tokens=24, record=False)  # the fp32 bundle: the eager forward
    d.start(input_ids=ids)
    d.generate()
    plain = d.summary()["token_ids"]
    peer = llamacpp.LlamaCppPeer("llama.cpp-f32", "smollm2-135m", threads=1,
                                 n_ctx=real_bundle.args.max_positions)
    r = peer.run(ids, 24, real_bundle.eos_ids)
    assert r["new_tokens"] == len(r["token_ids"]) == r["target_forwards"] and r["wall_s"] > 0
    assert r["token_ids"] == plain
    assert peer.run(ids, 24, real_bundle.eos_ids)["token_ids"] == plain  # a second run prefills afresh
