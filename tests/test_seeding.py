"""The seed scheme (ambiguity.seeding) and inverse-CDF sampling (ambiguity.sampling.pick / invert):
an image's tokens depend only on (seed, image index), whatever the batch, the command or the method."""

import pandas as pd
import pytest
import torch

from ambiguity.generation import sample_tokens
from ambiguity.models.gpt import GPT, GPTConfig
from ambiguity.models.llamagen import LlamaGenModel
from ambiguity.profile import profile_model
from ambiguity.runs import RunOptions
from ambiguity.sampling import SamplingConfig, invert, pick
from ambiguity.seeding import derived_seed, image_generator, image_generators, image_seed
from lantern.engine.decode import DecodeConfig, decode


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(dim=32, n_layer=2, n_head=2, vocab_size=64, block_size=16, num_classes=10, multiple_of=32))
    for p in gpt.parameters():
        torch.nn.init.normal_(p, 0.0, 0.3)
    return LlamaGenModel(gpt.eval(), name="tiny")


def test_invert_hand_cases():
    p = torch.tensor([0.2, 0.0, 0.5, 0.3], dtype=torch.float64)
    # CDF 0.2, 0.2, 0.7, 1.0: u in [0, .2) -> 0, [.2, .7) -> 2 (never the zero-mass 1), [.7, 1) -> 3
    u = torch.tensor([0.0, 0.1999, 0.2001, 0.6999, 0.7001, 0.9999999], dtype=torch.float64)
    assert invert(p.expand(6, 4), u).tolist() == [0, 0, 2, 2, 3, 3]
    assert invert(2 * p, torch.tensor(0.5)).item() == 2  # any scale: 0.5 * total = 1.0 lies in [0.4, 1.4)
    assert invert(torch.tensor([0.0, 0.0, 1.0]), torch.tensor(0.0)).item() == 2


def test_pick_follows_the_distribution_and_the_generators():
    p = torch.tensor([0.1, 0.6, 0.0, 0.3])
    draws = pick(p.expand(20000, 4), False, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=4).double() / 20000
    assert freq[2] == 0 and torch.allclose(freq, p.double(), atol=0.01)  # fixed seed: deterministic check
    # one generator per row: row i's token depends only on its own generator
    rows = p.expand(3, 4)
    a = pick(rows, False, [torch.Generator().manual_seed(s) for s in (5, 6, 7)])
    b = pick(rows[1:2], False, [torch.Generator().manual_seed(6)])
    assert a[1] == b[0]
    assert pick(p.expand(2, 4), True).tolist() == [1, 1]


def test_seeds_are_distinct_and_reproducible():
    assert image_seed(0, 1) != image_seed(1, 0) and image_seed(3, 4) == image_seed(3, 4)
    assert 0 <= image_seed(2**63 - 1, 10**9) < 2**63 and derived_seed(1, 2, 3) != derived_seed(1, 2, 4)
    g1, g2 = image_generator(7, 2), image_generators(7, [2])[0]
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))


def test_tokens_do_not_depend_on_batch_size_or_command(model):
    s = SamplingConfig(guidance=3.0, temperature=1.0, top_k=20)
    a, _ = profile_model(model, [1, 2, 3, 4, 5], s, batch_size=2, seed=11, options=RunOptions(progress=False))
    b, _ = profile_model(model, [1, 2, 3, 4, 5], s, batch_size=5, seed=11, options=RunOptions(progress=False))
    assert a["token"].tolist() == b["token"].tolist()
    pd.testing.assert_series_equal(a["guided_top1"], b["guided_top1"], atol=1e-6, rtol=0)
    # the same image through plain sampling and through lantern's AR decoding
    prompt = model.make_prompt([4], guided=True)
    alone = sample_tokens(model, prompt, s, image_generators(11, [3]))
    ar = decode(model, [4], DecodeConfig.of("ar"), s, seed=11, first_index=3)
    assert alone[0].tolist() == ar.tokens[0].tolist() == a["token"].tolist()[3 * 16 : 4 * 16]


def test_named_streams_reproduce_the_historic_formulas_exactly():
    """The shipped weights were trained with these formulas; the named functions must keep them bit for bit."""
    import numpy as np

    import ambiguity.seeding as S

    for seed in (0, 1, 7, 1234, 2**31 - 1):
        for t in (0, 1, 5, 999, 100002):
            assert S.epoch_permutation_seed(seed, t) == seed * 100003 + t
            assert S.vq_step_seed(seed, t) == seed * 7919 + t
            assert S.drafter_epoch_seed(seed, t) == seed * 1000 + t
            assert S.augment_seed(seed, t) == derived_seed(seed, t)
            assert S.random_control_seed(seed, t) == int(np.random.SeedSequence([seed, t]).generate_state(1)[0])
        assert S.vq_init_seed(seed) == S.drafter_init_seed(seed) == S.classifier_init_seed(seed) == seed
        assert S.holdout_seed(seed) == S.uncond_rows_seed(seed) == S.subset_seed(seed) == seed
        assert S.gpt_init_seed(seed) == seed + 1
        assert S.replacement_seed(seed, True, 0, 0.25, 3) == derived_seed(seed, True, 0, 250000, 3)
        assert S.replacement_seed(seed, False, 8, 0.1, 0) == derived_seed(seed, False, 8, 100000, 0)
        assert S.tagged_seed(seed, "quality-subset") == derived_seed(seed, 11)
        assert S.tagged_seed(seed, "quality-bootstrap") == derived_seed(seed, 12)
        assert S.tagged_seed(seed, "quality-prdc-reference") == derived_seed(seed, 13)
    assert S.FINGERPRINT_PROBE_SEED == 0
    # concrete values, so a change of derived_seed itself is caught too
    assert S.epoch_permutation_seed(3, 2) == 300011 and S.vq_step_seed(3, 2) == 23759
    assert derived_seed(0, 11) == S.STREAMS["quality-subset"][0](0)


def test_stream_table_is_complete_and_tags_unique():
    import ambiguity.seeding as S

    assert len(set(S.SEED_TAGS.values())) == len(S.SEED_TAGS)
    named = {n for n in S.__all__ if n.endswith("_seed") and n not in ("derived_seed", "tagged_seed")}
    in_table = {f.__name__ for f, _ in S.STREAMS.values()}
    assert named <= in_table
    with pytest.raises(KeyError):
        S.tagged_seed(0, "no-such-stream")


def test_callers_use_the_named_streams():
    """The modules that used to spell the formulas out now call the table's functions (same values)."""
    from ambiguity.train_loop import batch_indices

    g = torch.Generator().manual_seed(5 * 100003 + 0)
    assert batch_indices(0, 4, 10, 5).tolist() == torch.randperm(10, generator=g)[:4].tolist()
    from lantern.quality.scoring import BOOTSTRAP_TAG, PRDC_TAG
    from lantern.quality.sources import SUBSET_TAG

    assert (SUBSET_TAG, BOOTSTRAP_TAG, PRDC_TAG) == (11, 12, 13)
