"""Token ids outside a model's vocabulary are refused where they enter an adapter (issue item 1):
prompt ids from a tokenizer (or given directly), image codes given to ``to_vocab_ids`` / ``embed`` /
``teacher_force``, and token files. One UsageError line naming the id, its source and the valid
range; never an ``IndexError`` from the embedding, never a negative code wrapped to the last token."""

import pytest
import torch
from hf_tiny import tiny_emu3, tiny_janus, tiny_llama
from safetensors.torch import save_file
from test_chameleon import tiny_config, tiny_vocab
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import ChameleonForConditionalGeneration

from ambiguity.errors import UsageError
from ambiguity.models.base import check_ids
from ambiguity.models.chameleon import ChameleonModel, make_template
from ambiguity.models.emu3 import Emu3Model
from ambiguity.models.hf_text import HFCausalLM
from ambiguity.models.janus import JanusModel
from ambiguity.models.registry import load_model
from lantern.drafter.data import check_tokens, load_token_file


@pytest.fixture(scope="module")
def embedded():
    return load_model("embedded", device="cpu")


def _refused(fn) -> str:
    with pytest.raises(UsageError) as err:
        fn()
    msg = str(err.value)
    assert "\n" not in msg
    return msg


# --------------------------------------------------------------------------- the shared check
def test_check_ids_names_the_first_bad_id_its_source_and_the_range():
    ids = torch.tensor([[3, 9, 12], [-1, 0, 2]])
    assert _refused(lambda: check_ids(ids, 10, "codes.pt")) == (
        "codes.pt: image code 12 is outside the valid range 0..9; pass image codes of this model "
        "(made by its own tokenizer)"
    )
    assert _refused(lambda: check_ids(torch.tensor([-1]), 10, "x", "token id", "fix it")) == (
        "x: token id -1 is outside the valid range 0..9; fix it"
    )
    assert "are float32 values" in _refused(lambda: check_ids(torch.tensor([0.5]), 10, "x"))
    check_ids(torch.tensor([[0, 9]]), 10, "x")  # the ends of the range pass
    check_ids(torch.zeros(0, dtype=torch.long), 10, "x")


# --------------------------------------------------------------------------- LlamaGen architecture
def test_embedded_refuses_codes_beyond_and_below_its_1024_codes(embedded):
    prompt = embedded.make_prompt([0])
    assert _refused(lambda: embedded.embed(torch.tensor([[5, 1024]]))).startswith(
        "the codes given to embedded.embed: image code 1024 is outside the valid range 0..1023"
    )
    assert _refused(lambda: embedded.to_vocab_ids(torch.tensor([-1]))).startswith(
        "the codes given to embedded.to_vocab_ids: image code -1 is outside the valid range 0..1023"
    )
    assert _refused(lambda: embedded.teacher_force(prompt, torch.tensor([[7, -3]]))).startswith(
        "the codes given to embedded.teacher_force: image code -3"
    )
    ok = torch.tensor([[0, 1023]])
    assert torch.equal(embedded.embed(ok), embedded.gpt.tok_embeddings.weight[[0, 1023]][None])
    assert torch.equal(embedded.to_vocab_ids(ok), ok)  # LlamaGen's code c is vocabulary id c


def test_text_twin_refuses_prompt_ids_beyond_its_vocabulary():
    twin = load_model("text-twin", device="cpu")
    V = twin.vocab_size
    msg = _refused(lambda: twin.make_prompt(torch.tensor([[5, V]])))
    assert msg.startswith(f"the prompts given to text-twin: token id {V} is outside the valid range 0..{V - 1}")


# --------------------------------------------------------------------------- transformers adapters
def test_janus_refuses_a_tokenizer_word_beyond_the_embedding_table_and_bad_codes():
    model, tok = tiny_janus()
    n = model.get_input_embeddings().num_embeddings
    tok.add_tokens(["zebra"])  # a tokenizer.json of a larger vocabulary: "zebra" -> id n
    assert tok.convert_tokens_to_ids("zebra") == n
    jm = JanusModel(model, tok, name="janus-tiny")
    msg = _refused(lambda: jm.make_prompt(["a zebra"], guided=True))
    assert msg == (
        f"prompt 'a zebra' of janus-tiny: the tokenizer gives token id {n} ('zebra'), outside the valid "
        f"range 0..{n - 1} of the model's embedding table; use the tokenizer files of this checkpoint"
    )
    prompt = jm.make_prompt(["a cat"])
    assert "janus-tiny.teacher_force: image code 24 " in _refused(
        lambda: jm.teacher_force(prompt, torch.tensor([[1, 24]]))
    )
    assert "janus-tiny.embed: image code -1 " in _refused(lambda: jm.embed(torch.tensor([[-1]])))


def test_emu3_refuses_codes_outside_its_20_visual_tokens():
    model, tok = tiny_emu3(codebook=20)
    em = Emu3Model(model, tok, name="emu3-tiny", grid=(2, 3), negative_prompt="ugly")
    assert "emu3-tiny.to_vocab_ids: image code 20 is outside the valid range 0..19" in _refused(
        lambda: em.to_vocab_ids(torch.tensor([20]))
    )
    assert "emu3-tiny.embed: image code -1 " in _refused(lambda: em.embed(torch.tensor([[-1, 0]])))
    last = em.image_token_ids[19]
    assert torch.equal(em.to_vocab_ids(torch.tensor([19])), last[None])


def test_chameleon_tokenizer_json_beyond_the_embedding_table_is_refused():
    """Lumina-mGPT's case: the official LANTERN code crashes in the embedding with an IndexError."""
    torch.manual_seed(0)
    lm = ChameleonForConditionalGeneration(tiny_config()).eval()  # 48 embedding rows
    vocab = dict(tiny_vocab(), wide=60)  # a tokenizer.json mapping "wide" past them
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    cm = ChameleonModel(lm, make_template(tiny_vocab(), 1, "lumina", resolution=8, downsample=2), tok, name="lumina")
    assert _refused(lambda: cm.make_prompt(["w26 wide"])) == (
        "prompt 'w26 wide' of lumina: the tokenizer gives token id 60 ('wide'), outside the valid range 0..47 "
        "of the model's embedding table; use the tokenizer files of this checkpoint"
    )
    assert "token id -2," in _refused(lambda: cm.make_prompt([[26, -2]]))  # token-id captions too
    # a negative code was wrapped to the last image token before
    assert "lumina.to_vocab_ids: image code -1 " in _refused(lambda: cm.to_vocab_ids(torch.tensor([-1])))
    assert "lumina.embed: image code 16 " in _refused(lambda: cm.embed(torch.tensor([[16]])))


def test_hf_causal_lm_refuses_an_added_token_beyond_the_embedding():
    model, tok = tiny_llama()
    n = model.get_input_embeddings().num_embeddings
    tok.add_tokens(["<extra>"])
    lm = HFCausalLM(model, tok, name="hf:tiny")
    assert f"token id {n} ('<extra>'), outside the valid range 0..{n - 1}" in _refused(
        lambda: lm.make_prompt(["ab<extra>"])
    )
    lm.make_prompt(["ab"])  # ordinary prompts pass


# --------------------------------------------------------------------------- token files
def test_token_file_with_a_negative_code_names_the_file(embedded, tmp_path):
    tokens = torch.zeros(4, 64, dtype=torch.long)
    tokens[2, 5] = -1  # indexed silently as the last code before
    save_file({"tokens": tokens, "labels": torch.zeros(4, dtype=torch.long)}, str(tmp_path / "t.safetensors"))
    ts = load_token_file(tmp_path / "t.safetensors")
    msg = _refused(lambda: check_tokens(ts, embedded))
    assert msg.startswith(
        f"the token sequences of {tmp_path / 't.safetensors'} (for embedded): image code -1 is outside the valid "
        f"range 0..1023; store code indices"
    )
