"""Batched decoding on the transformers adapters (Anole / Chameleon, Lumina-mGPT, Janus, Emu3, HF text
LMs): tiny random-weight models in float64, no download.

* ``extend_slots`` over a slots cache (prompts of different lengths prefilled into rows in reverse
  order, the prefix region widened by a longer prompt admitted later, ragged chunks across the
  end-of-row separators of Emu3 / Lumina-mGPT) gives each row the logits of its own teacher-forced
  sequence; ``move_slots`` and ``select_slots`` keep what they keep;
* ``lantern.decode(..., batch_size=3)`` over 5 captions (continuous batching, a draining batch, CFG)
  gives batch 1's tokens and non-timing records for AR, SD and LANTERN chains on every adapter, and
  for static and dynamic draft trees where the adapter verifies trees (Anole, Janus);
* ``ambiguity.profile`` at batch 3 gives batch 1's table;
* draft trees on an end-of-row layout are refused in one line (batched as at batch 1).
"""

import copy

import numpy as np
import pandas as pd
import pytest
import torch
from hf_tiny import tiny_emu3, tiny_janus, tiny_llama
from reference.decode import decode_one_by_one
from test_chameleon import adapter, tiny_config
from test_engine import _same_records
from transformers import ChameleonForConditionalGeneration

from ambiguity.errors import UsageError
from ambiguity.models.emu3 import Emu3Model
from ambiguity.models.hf_text import HFCausalLM
from ambiguity.models.janus import JanusModel
from ambiguity.neighbourhood import build_neighbourhoods
from ambiguity.profile import profile_model
from ambiguity.runs import RunOptions
from ambiguity.sampling import SamplingConfig
from lantern.drafter.model import Drafter
from lantern.engine.decode import DecodeConfig, decode
from lantern.methods.tree.spec import STATIC_TREES, TreeSpec

CAPTIONS = ["a cat", "a dog", "red", "two birds", "a big dog on green grass"]  # the longest is admitted last
WORD_CAPTIONS = ["w26 w27", "w28 w30", "w29", "w31 w32 w33", "w34 w35 w36 w37 w38 w39"]  # the tiny Chameleon's words


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    cham = ChameleonForConditionalGeneration(tiny_config()).eval().double()
    janus, jtok = tiny_janus()
    emu3, etok = tiny_emu3(codebook=20)
    return {
        "anole": (adapter(cham, "chameleon"), WORD_CAPTIONS),
        "lumina": (adapter(cham, "lumina"), WORD_CAPTIONS),
        "janus": (JanusModel(janus.double(), jtok, name="janus-tiny"), CAPTIONS),
        "emu3": (Emu3Model(emu3.double(), etok, name="emu3-tiny", grid=(3, 4), negative_prompt="ugly"), CAPTIONS),
    }


def _codes(rows, n, V, seed=0):
    return torch.randint(0, V, (rows, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", ["anole", "lumina", "janus", "emu3"])
def test_extend_slots_gives_each_row_its_teacher_forced_logits(models, name):
    """Three images, CFG (6 rows): two prefilled together into slots 2 and 0, the third (the longest
    prompt, widening the prefix region) later into slot 1; then ragged chunks at each image's own
    positions (across row ends: 4 codes a row) equal teacher forcing of each image alone."""
    m, conds = models[name]
    N = m.num_tokens
    codes = _codes(3, N, m.vocab_size, seed=1)
    cache = m.new_slots_cache(3, True, N, 4)
    rows = lambda slots: torch.tensor(slots + [s + 3 for s in slots])  # CFG rows of slots
    firsts = {}
    first = m.prefill_slots(cache, rows([2, 0]), m.make_prompt([conds[0], conds[1]], guided=True))
    firsts[2], firsts[0] = first.logits[[0, 2]], first.logits[[1, 3]]
    P = cache.prefix
    first = m.prefill_slots(cache, rows([1]), m.make_prompt([conds[4]], guided=True))
    firsts[1] = first.logits
    assert cache.prefix > P  # the longer prompt widened every row's prefix region
    image_of = {2: 0, 0: 1, 1: 2}
    want = {
        s: m.teacher_force(m.make_prompt([conds[[0, 1, 4][i]]], guided=True), codes[[i, i]])
        for s, i in image_of.items()
    }
    for s in range(3):
        torch.testing.assert_close(firsts[s], want[s].logits[:, :1], rtol=1e-10, atol=1e-10)
    n = np.array([0, 0, 0])  # image tokens in the cache per slot
    got = {s: [] for s in range(3)}
    for chunk in ([1, 3, 2], [5, 2, 6], [3, 4, 1], [6, 6, 6]):  # ragged: every slot its own count
        T = max(chunk)
        slots = torch.as_tensor(n)[:, None] + torch.arange(T)
        toks = torch.stack([codes[image_of[s]][slots[s].clamp(max=N - 1)] for s in range(3)])
        pad = torch.arange(T)[None] >= torch.tensor(chunk)[:, None]
        toks = torch.where(pad, (toks + 1) % m.vocab_size, toks)  # a shorter row's padding: other codes, never seen
        S = int(slots.max()) + 1
        visible = torch.arange(S)[None, None] <= slots[:, :, None]
        out = m.extend_slots(
            cache, toks.repeat(2, 1), slots.repeat(2, 1), slots.clamp(max=N - 1).repeat(2, 1), visible.repeat(2, 1, 1)
        )
        for s in range(3):
            k = min(chunk[s], N - 1 - n[s])
            got[s].append(out.logits[[s, s + 3], :k])
            n[s] += k
    for s in range(3):
        torch.testing.assert_close(torch.cat(got[s], 1), want[s].logits[:, 1:], rtol=1e-10, atol=1e-10)


def test_move_and_select_slots(models):
    """move_slots copies each row's entries at image slots src to dst in every layer (all read before
    any is written); select_slots keeps the given rows (keys, values, prompt mask, start positions)."""
    m, conds = models["janus"]
    cache = m.new_slots_cache(3, False, 8, 4)
    m.prefill_slots(cache, torch.tensor([0, 1, 2]), m.make_prompt([conds[0], conds[2], conds[3]]))
    kv, P = cache.kv, cache.prefix
    g = torch.Generator().manual_seed(0)
    for x in kv.keys:
        x.normal_(generator=g)
    for x, y in zip(kv.values, kv.keys):
        x.copy_(-y)
    k0 = [x.clone() for x in kv.keys]
    src = torch.tensor([[3, 5], [2, 2], [4, 2]])
    dst = torch.tensor([[1, 3], [2, 2], [2, 4]])  # row 0: slot 3 is read before it is overwritten; row 2 swaps
    m.move_slots(cache, src, dst)
    for layer, x in enumerate(kv.keys):
        want = k0[layer].clone()
        for r in range(3):
            for s_, d_ in zip(src[r].tolist(), dst[r].tolist()):
                want[r, :, P + d_] = k0[layer][r, :, P + s_]
        assert torch.equal(x, want) and torch.equal(kv.values[layer], -want)
    start, mask = cache.start.clone(), cache.key_mask.clone()
    m.select_slots(cache, torch.tensor([2, 0]))
    assert torch.equal(cache.start, start[[2, 0]]) and torch.equal(cache.key_mask, mask[[2, 0]])
    assert torch.equal(kv.keys[1], -kv.values[1]) and kv.keys[1].shape[0] == 2
    assert len(set(start.tolist())) == 3  # the three prompts have different lengths


SAMPLING = SamplingConfig(guidance=2.0, temperature=1.0, top_k=8)
CHAINS = [DecodeConfig.of("ar"), DecodeConfig.of("sd", 3), DecodeConfig.of("lantern", 3, k=4, delta=0.2)]
TREES = [
    DecodeConfig.of("lantern", k=4, delta=0.2, tree=TreeSpec("dynamic", total_tokens=6, depth=3, top_k=2)),
    DecodeConfig.of("sd", tree=TreeSpec("static", STATIC_TREES["mc_sim_7b_63"], name="mc_sim_7b_63")),
]


@pytest.mark.parametrize("name", ["anole", "lumina", "janus", "emu3"])
def test_float64_batched_equals_batch_one(models, name, monkeypatch):
    """5 captions through 3 slots, CFG: tokens and every non-timing record equal batch 1 for AR, SD
    and LANTERN chains and (Anole, Janus) a dynamic and a static draft tree; images sit at different
    positions in one forward and the draining batch drops its empty slots."""
    m, conds = models[name]
    drafter = Drafter.for_target(m, seed=2).eval()
    table = build_neighbourhoods(m.input_embeddings(), 4, "l2", cache=False).indices
    kept = []
    select = type(m).select_slots
    monkeypatch.setattr(
        type(m), "select_slots", lambda self, cache, rows: (kept.append(len(rows)), select(self, cache, rows))[1]
    )
    mixed = 0
    for cfg in CHAINS + (TREES if name in ("anole", "janus") else []):
        one = decode_one_by_one(m, conds, cfg, SAMPLING, drafter, table, seed=3)
        many = decode(m, conds, cfg, SAMPLING, drafter, table, seed=3, batch_size=3)
        assert torch.equal(one.tokens, many.tokens), cfg.method
        _same_records(one, many)
        steps = many.steps
        assert steps["active"].max() == 3
        by_batch = {}
        for b, pos in zip(steps["batch_step"], steps["position"]):
            by_batch.setdefault(b, set()).add(pos)
        mixed += sum(len(v) > 1 for v in by_batch.values())
    assert mixed > 0 and kept and all(k == 2 for k in kept)  # ragged positions; one busy image (2 CFG rows) kept


def test_float64_batched_text_lm_equals_batch_one():
    """A Hugging Face text LM (tiny Llama; prompts of different lengths, no CFG): AR and SD batched equal batch 1."""
    lm, tok = tiny_llama()
    m = HFCausalLM(lm.double(), tok, name="hf:tiny-llama", length=10)
    drafter = Drafter.for_target(m, seed=2).eval()
    s = SamplingConfig(guidance=1.0, temperature=1.0, top_k=20)
    conds = ["ab", "hello there", "x", "long prompt here", "q"]
    for cfg in (DecodeConfig.of("ar"), DecodeConfig.of("sd", 3)):
        one = decode_one_by_one(m, conds, cfg, s, drafter, seed=3)
        many = decode(m, conds, cfg, s, drafter, seed=3, batch_size=3)
        assert torch.equal(one.tokens, many.tokens), cfg.method


@pytest.mark.parametrize("name", ["anole", "emu3"])
def test_float64_profile_batch_three_equals_batch_one(models, name):
    m, conds = models[name]
    one, _ = profile_model(m, conds, SAMPLING, batch_size=1, seed=5, options=RunOptions(progress=False))
    three, _ = profile_model(m, conds, SAMPLING, batch_size=3, seed=5, options=RunOptions(progress=False))
    assert list(one.columns) == list(three.columns) and len(one) == len(conds) * m.num_tokens
    for c in one.columns:
        if one[c].dtype.kind == "f":
            np.testing.assert_allclose(one[c], three[c], rtol=1e-10, atol=1e-12, err_msg=c)
        else:
            assert (one[c] == three[c]).all(), c


def test_batched_trees_on_end_of_row_layouts_are_refused(models):
    """Lumina-mGPT / Emu3 insert end-of-row tokens, which draft trees do not model: batched tree
    decoding stops with the one-line error of batch 1."""
    for name in ("lumina", "emu3"):
        m, conds = models[name]
        drafter = Drafter.for_target(m, seed=2).eval()
        for bs in (1, 2):
            with pytest.raises(UsageError, match=r"inserts end-of-row tokens, .*use chain drafting \(--tree chain\)$"):
                decode(m, conds[:2], TREES[1], SAMPLING, drafter, seed=0, batch_size=bs)


def test_generate_batch_size_on_a_transformers_adapter(tmp_path, monkeypatch):
    """``lantern.generate --model janus-pro-1b --batch-size 2 --dtype float64`` (the tiny Janus in the
    local HF cache, 3 captions, CFG) writes batch 1's codes."""
    from hf_tiny import save, save_to_hf_cache, use_hf_cache

    from ambiguity.models.janus import JANUS_PRO_1B_REPO
    from lantern.generate import main

    model, tok = tiny_janus()
    save_to_hf_cache(tmp_path / "hub", JANUS_PRO_1B_REPO, save(model, tok, tmp_path / "janus"))
    use_hf_cache(monkeypatch, tmp_path / "hub")
    (tmp_path / "caps.txt").write_text("\n".join(CAPTIONS[2:]) + "\n")
    common = ["--model", "janus-pro-1b", "--method", "ar", "--captions", str(tmp_path / "caps.txt")]
    common += ["--num-images", "3", "--cfg", "2", "--dtype", "float64", "--device", "cpu"]
    for b in ("1", "2"):
        assert main([*common, "--batch-size", b, "--out", str(tmp_path / f"b{b}")]) == 0
    a, b = (pd.read_parquet(tmp_path / r / "images.parquet") for r in ("b1", "b2"))
    assert [list(c) for c in a["codes"]] == [list(c) for c in b["codes"]]
    assert pd.read_parquet(tmp_path / "b2" / "steps.parquet")["active"].max() == 2


def test_chunked_attention_text_lm_is_refused_in_one_line(tmp_path, capsys):
    """A decoder with chunked-attention layers (a tiny Llama given ``attention_chunk_size``, as Llama 4's
    layers) cannot use the slots cache every decode runs on: ``lantern.generate`` at any batch size and
    ``python -m ambiguity.profile`` end with one line naming why and exit 2. (Sliding-window layers
    decode: ``tests/test_hf_text.py``.)"""
    from hf_tiny import char_tokenizer, save
    from transformers import LlamaConfig, LlamaForCausalLM

    from ambiguity.profile import main as profile_main
    from lantern.generate import main

    tok = char_tokenizer([], bos="<s>", eos="</s>", pad="<pad>", prepend_bos=True)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        max_position_embeddings=256,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    cfg.attention_chunk_size = 4
    src = save(LlamaForCausalLM(cfg).eval(), tok, tmp_path / "chunked")
    why = "its decoder has chunked-attention layers, which the per-image slots cache does not model"
    (tmp_path / "prompts.txt").write_text("ab\nhello\n")
    common = ["--model", f"hf:{src}", "--captions", str(tmp_path / "prompts.txt"), "--num-images", "2"]
    common += ["--cfg", "1", "--device", "cpu"]
    for B in ("2", "1"):
        capsys.readouterr()
        assert main([*common, "--method", "ar", "--batch-size", B, "--out", str(tmp_path / f"b{B}")]) == 2
        err = capsys.readouterr().err.strip().splitlines()  # transformers' weight-loading bars, then the error
        assert err[-1] == f"error: hf:{src} cannot decode on the slot engine: {why}"
    assert profile_main([*common, "--out", str(tmp_path / "profile"), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: hf:{src} cannot decode: {why}"


def test_batch_limit_is_decided_once_per_decoder_config(monkeypatch):
    """``batch_limit`` builds one empty DynamicCache per decoder config (not one per access) and keeps
    its answer: '' for a full-attention Llama and for a sliding-window Mistral (its windows kept); a
    decoder given a new config is decided again (chunked attention: refused in one line)."""
    from transformers import MistralConfig, MistralForCausalLM

    import ambiguity.models.hf_cache as hf  # slots_cache_plan builds its probe cache there

    built = []
    real = hf.new_dynamic_cache
    monkeypatch.setattr(hf, "new_dynamic_cache", lambda config=None: built.append(config) or real(config))
    lm, tok = tiny_llama()
    llama = HFCausalLM(lm, tok)
    mistral_cfg = MistralConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=48,
        sliding_window=4,
    )
    mistral = HFCausalLM(MistralForCausalLM(mistral_cfg).eval(), tok)
    built.clear()
    assert [llama.batch_limit, llama.batch_limit, llama.can_batch_decode] == ["", "", True]
    assert built == [llama.decoder.config]
    assert [mistral.batch_limit, mistral.batch_limit, mistral.can_batch_decode] == ["", "", True]
    assert mistral._plan()[1] == (4, 4)  # every layer windowed
    assert built == [llama.decoder.config, mistral.decoder.config]
    chunked = copy.deepcopy(lm.config)
    chunked.attention_chunk_size = 4
    llama.decoder.config = chunked
    why = "its decoder has chunked-attention layers, which the per-image slots cache does not model"
    assert [llama.batch_limit, llama.can_batch_decode] == [why, False] and len(built) == 3
    with pytest.raises(UsageError, match=f"^{llama.name} cannot decode: {why}$"):
        llama.new_slots_cache(1, False, 4)
