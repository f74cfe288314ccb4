"""Every adapter runs the two research paths end to end on a tiny random model: the ambiguity
profile (generation with CFG where the model has it) and the drafter-accuracy path (features,
one training epoch, per-epoch top-k accuracy table)."""

import math

import pytest
import torch
from hf_tiny import tiny_emu3, tiny_gpt2, tiny_janus, tiny_llama
from test_chameleon import adapter as chameleon_adapter
from test_chameleon import tiny_config as chameleon_config
from transformers import ChameleonForConditionalGeneration

from ambiguity.models.emu3 import Emu3Model
from ambiguity.models.hf_text import HFCausalLM
from ambiguity.models.janus import JanusModel
from ambiguity.profile import profile_model
from ambiguity.runs import RunOptions
from ambiguity.sampling import SamplingConfig
from lantern.drafter.data import TokenSet
from lantern.drafter.train import TrainConfig, train_drafter

CAPTIONS = ["a cat", "a big dog on grass"]


def _chameleon():
    torch.manual_seed(0)
    return chameleon_adapter(ChameleonForConditionalGeneration(chameleon_config()).eval())


def _janus():
    model, tok = tiny_janus()
    return JanusModel(model, tok, name="janus-tiny")


def _emu3():
    model, tok = tiny_emu3(codebook=20)
    return Emu3Model(model, tok, name="emu3-tiny", grid=(3, 4), negative_prompt="ugly")


def _llama():
    model, tok = tiny_llama()
    return HFCausalLM(model, tok, name="hf:tiny-llama", length=6)


def _gpt2():
    model, tok = tiny_gpt2()
    return HFCausalLM(model, tok, name="hf:tiny-gpt2", length=6)


ADAPTERS = {"chameleon": _chameleon, "janus": _janus, "emu3": _emu3, "llama": _llama, "gpt2": _gpt2}


@pytest.fixture(scope="module", params=sorted(ADAPTERS))
def model(request):
    return ADAPTERS[request.param]()


def test_profile_runs_on_every_adapter(model):
    cfg = 1.0 if model.kind == "text" else 2.0
    table, summary = profile_model(
        model,
        conditions=CAPTIONS,
        sampling=SamplingConfig(guidance=cfg),
        num_images=2,
        batch_size=2,
        options=RunOptions(progress=False),
    )
    assert len(table) == 2 * model.num_tokens
    for col in ("guided_top1", "guided_top10", "guided_entropy", "cond_top1", "cond_chosen_rank"):
        assert table[col].notna().all() and table[col].map(math.isfinite).all()
    assert (table.guided_top10 >= table.guided_top1 - 1e-6).all()
    assert table.token.between(0, model.vocab_size - 1).all()


def test_drafter_accuracy_path_runs_on_every_adapter(model, tmp_path):
    gen = torch.Generator().manual_seed(0)
    seqs = torch.randint(0, model.vocab_size, (6, model.num_tokens), generator=gen)
    train = TokenSet(seqs[:4], CAPTIONS * 2, source="random")
    test = TokenSet(seqs[4:], CAPTIONS, source="random")
    cfg = TrainConfig(epochs=1, batch_size=2, warmup_steps=1, uncond_fraction=0.0 if model.kind == "text" else 0.25)
    drafter, table = train_drafter(model, train, test, tmp_path / "run", cfg, progress=False)
    assert table.epoch.tolist() == [0, 1]
    assert ((0 <= table.top1) & (table.top1 <= table.top2) & (table.top2 <= table.top3) & (table.top3 <= 1)).all()
    assert table.test_positions.iloc[-1] == 2 * (model.num_tokens - 1)  # position i predicts token i + 1
    assert drafter.target["name"] == model.name
