"""``--compile`` (lantern.engine.decode.compile_forwards): torch.compile of the target's and the drafter's
cached forwards on a tiny float64 LlamaGen GPT gives the same tokens and records (probabilities to
5e-5) as eager decoding, batch 1 (the append path through the compiled rows forward) and batched
(in-place slot writes), AR, a LANTERN chain, a static SD tree and a LANTERN dynamic tree; the
compiled graph writes the KV cache in place (no copy of the buffer); a chain at batch 1 compiles
three drafter graphs, whatever the strides of its masks; a model whose forward cannot be compiled is
refused with one line.
"""

import re

import numpy as np
import pytest
import torch
from test_trees import tiny

from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.llamagen import LlamaGenModel
from ambiguity.neighbourhood import build_neighbourhoods
from ambiguity.sampling import SamplingConfig
from lantern.drafter.model import Drafter
from lantern.engine.decode import DecodeConfig, compile_forwards, decode
from lantern.methods.tree.spec import TreeSpec

CONFIGS = [
    DecodeConfig.of("ar"),
    DecodeConfig.of("lantern", 3, k=8, delta=0.2),
    DecodeConfig.of("sd", tree=TreeSpec("static", ((0,), (1,), (0, 0), (0, 1), (0, 0, 0)))),
    # the EAGLE-2 dynamic tree LANTERN (python -m lantern.paper --compile decodes with it)
    DecodeConfig.of("lantern", tree=TreeSpec("dynamic", total_tokens=8, depth=3, top_k=3), k=8, delta=0.2),
]


def _close_records(a, b):
    """Every non-timing column is equal; probabilities agree to 5e-5 (the model's RMSNorm and rotary
    run in float32 even in a float64 model, and inductor's fused float32 kernels round differently,
    by an amount that depends on the CPU's vector kernels: 1.1e-5 relative on one machine)."""
    for key in ("steps", "drafts", "images"):
        A, B = getattr(a, key), getattr(b, key)
        for c in A:
            if c.endswith("_s") or c in ("batch_step", "active"):
                continue
            x, y = np.asarray(A[c]), np.asarray(B[c])
            assert x.shape == y.shape, (key, c)
            if x.dtype.kind == "f":
                np.testing.assert_allclose(x, y, rtol=5e-5, atol=1e-9, err_msg=f"{key}.{c}")
            else:
                assert np.array_equal(x, y), (key, c)


def _pair():
    """The same tiny float64 target and drafter twice: one stays eager, one is compiled."""
    eager, compiled = tiny(vocab=32, block=16, dim=32, std=0.5), tiny(vocab=32, block=16, dim=32, std=0.5)
    de, dc = Drafter.for_target(eager, seed=2).eval(), Drafter.for_target(compiled, seed=2).eval()
    return (eager, de), (compiled, dc)


@pytest.mark.slow  # torch.compile of the forwards: about a minute on 2 CPU cores
def test_compiled_decoding_equals_eager_float64():
    (eager, de), (compiled, dc) = _pair()
    compile_forwards(compiled, dc)
    sampling = SamplingConfig(guidance=2.0, temperature=1.0)
    conds = [1, 4, 7]
    table = build_neighbourhoods(eager.input_embeddings(), 8, "l2", cache=False).indices
    for config in CONFIGS:
        for B in (1, 2):
            a = decode(eager, conds, config, sampling, de, table, seed=3, batch_size=B)
            b = decode(compiled, conds, config, sampling, dc, table, seed=3, batch_size=B)
            assert torch.equal(a.tokens, b.tokens), (config.method, B)
            _close_records(a, b)


def test_a_compiled_chain_compiles_three_drafter_graphs_at_batch_1():
    """At batch 1 a LANTERN chain calls the compiled drafter layer with one token seeing one slot, one
    token, and several (the pending positions): three graphs. Its masks arrive as broadcast views
    on some calls and as fresh tensors on others; passed as they came, every stride compiled a
    graph of its own (four here, the recompile limit of 8 hit on embedded-16 over batch sizes 1, 2
    and 8, after which the layer ran eager)."""
    torch._dynamo.reset()
    (eager, de), (compiled, dc) = _pair()
    compile_forwards(compiled, dc)
    table = build_neighbourhoods(eager.input_embeddings(), 8, "l2", cache=False).indices
    sampling = SamplingConfig(guidance=2.0, temperature=1.0)
    a = decode(eager, [1, 4], CONFIGS[1], sampling, de, table, seed=3, batch_size=1)
    with torch._dynamo.config.patch(recompile_limit=3, fail_on_recompile_limit_hit=True):
        b = decode(compiled, [1, 4], CONFIGS[1], sampling, dc, table, seed=3, batch_size=1)
    assert torch.equal(a.tokens, b.tokens)


def test_slot_write_is_in_place_in_the_compiled_graph():
    """The generated code of a compiled rows forward holds no copy of the KV buffer (the write is one
    index_put_ on the static buffer, not on a per-layer view) and leaves the cache as eager's."""
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    config = GPTConfig(dim=32, n_layer=2, n_head=2, vocab_size=32, block_size=16, num_classes=10, multiple_of=16)
    gpt = GPT(config).double().eval()  # two layers: one layer's write alone was already reinplaced
    model = LlamaGenModel(gpt, name="tiny")
    model.compile_forwards()  # what --compile runs (dynamic shapes)
    R, T = 2, 3
    eager, comp = gpt.new_cache(R, 20), gpt.new_cache(R, 20)
    slots = torch.tensor([[4, 5, 6], [9, 10, 11]])
    mask = torch.arange(20)[None, None, None] <= slots[:, None, :, None]
    h = torch.randn(R, T, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = gpt.forward_rows(h, eager, slots, slots, mask)
        got, code = run_and_get_code(model.compiled, h, comp, slots, slots.clone(), mask)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # float32 RMSNorm/rotary, fused differently
    torch.testing.assert_close(comp.k, eager.k, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(comp.v, eager.v, rtol=1e-5, atol=1e-6)
    assert comp.k[:, 0, :, 4:7].abs().sum() > 0 and comp.k[:, 0, :, 7:].abs().sum() == 0  # row 0's slots only
    # inductor names each kernel after the aten ops it fuses: an in-place write leaves no aten.copy_
    # (the epilogue that copied the whole functionalised buffer back into the cache); _to_copy is a cast
    assert not re.search(r"(?<!_to)_copy__|\bcopy_\(", "\n".join(code))


def test_generate_compile_on_a_transformers_adapter_is_one_line(tmp_path, capsys):
    """``lantern.generate --model hf:<tiny llama> --compile`` ends with one line and exit 2, nothing written."""
    from hf_tiny import save, tiny_llama

    from lantern.generate import main

    src = save(*tiny_llama(), tmp_path / "llama")
    (tmp_path / "prompts.txt").write_text("ab\n")
    argv = ["--model", f"hf:{src}", "--method", "ar", "--captions", str(tmp_path / "prompts.txt"), "--num-images", "1"]
    argv += ["--cfg", "1", "--device", "cpu", "--compile", "--out", str(tmp_path / "run")]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()  # refused from the registry, before any weights load
    assert err[-1] == (
        f"error: --compile works for the LlamaGen-architecture models (embedded, embedded-16, llamagen-*, text-twin); "
        f"hf:{src} runs eager only, drop --compile"
    )
    assert not (tmp_path / "run").exists()
