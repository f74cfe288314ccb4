"""entropy-sd's entropy-dependent window (lantern.rules.jacobi.entropy_window, lantern.methods.jacobi.method).

* hand-computed windows L(H) = clamp(round(L exp(-H / scale)), L_min, L) for given entropies and
  for the entropies of hand-written distributions;
* on the engine (float64 tiny models): every forward's window equals the rule applied to the
  entropy of the distribution the image's newest token was drawn from, recomputed by teacher
  forcing the decoded tokens; greedy decoding with the dynamic window equals greedy AR token for
  token; batch 3 gives batch 1's tokens and records, images entering freed slots;
* ``entropy_min_window >= L`` fixes the window; the defaults reach the records;
* bad knobs end in one line naming the option (the config and the generate CLI).
"""

import numpy as np
import pytest
import torch
from test_engine import _same_records
from test_trees import tiny

from ambiguity.errors import UsageError
from ambiguity.generation import sample_tokens
from ambiguity.sampling import SamplingConfig, distribution, expand_rows
from ambiguity.stats import entropy
from lantern.engine.decode import DecodeConfig, decode
from lantern.methods.jacobi.config import JacobiConfig
from lantern.rules.jacobi import entropy_window

DYNAMIC = dict(window=8, entropy_min_window=2, entropy_window_scale=1.5)
SAMPLINGS = [
    SamplingConfig(guidance=1.0, temperature=1.0),
    SamplingConfig(guidance=3.0, temperature=0.8, top_k=12),
    SamplingConfig(guidance=2.0, temperature=1.2, top_p=0.9),
    SamplingConfig(guidance=2.0, temperature=0.0),
]


def _model():
    return tiny(vocab=32, block=16, dim=32, std=2.0)


def test_entropy_window_hand_cases():
    """16 exp(-H / 6): H = 0 -> 16, 6 ln 2 -> 8, 6 ln(16/5) -> 5, the nearest window either side of
    7.5, and 6 ln 8 -> 2, clamped up to the shortest window 4."""
    h = np.array([0.0, 6 * np.log(2), 6 * np.log(16 / 5), 6 * np.log(16 / 7.6), 6 * np.log(16 / 7.4), 6 * np.log(8)])
    assert entropy_window(h, 16, 4, 6.0).tolist() == [16, 8, 5, 8, 7, 4]
    assert entropy_window(np.array([100.0]), 16, 4, 6.0).tolist() == [4]
    assert entropy_window(np.array([0.0, 5.0]), 8, 8, 1.0).tolist() == [8, 8]  # shortest = longest: fixed
    # from distributions: two equal codes, H = ln 2: 24 * 2^(-1/3) = 19.05 -> 19;
    # four equal codes with scale ln 4: 16 / e = 5.89 -> 6; a certain code: the longest window
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    h = entropy(p).numpy()
    assert entropy_window(h[:1], 24, 4, 3.0).tolist() == [19]
    assert entropy_window(h[1:2], 16, 1, float(np.log(4))).tolist() == [6]
    assert entropy_window(h[2:], 16, 4, 6.0).tolist() == [16]


def _newest_entropies(m, labels, tokens, s):
    """H of the target distribution at every position of the decoded images (len(labels), N), by
    teacher forcing their tokens (the distribution each token was drawn from)."""
    prompt = m.make_prompt(labels, guided=s.guided)
    with torch.no_grad():
        logits = m.teacher_force(prompt, expand_rows(tokens, s.guided)).logits
    return entropy(distribution(logits, s, s.guided).double()).numpy()


@pytest.mark.parametrize("sampling", SAMPLINGS[:2] + SAMPLINGS[3:], ids=["plain", "cfg-topk", "greedy"])
def test_each_window_follows_the_entropy_of_the_newest_token(sampling):
    """Step at n committed tokens (n - 1 the newest): drafted = min(L(H_{n-1}) - 1, N - 1 - n)."""
    m = _model()
    labels = [0, 3, 5, 7, 1]
    cfg = JacobiConfig("entropy-sd", **DYNAMIC)
    out = decode(m, labels, DecodeConfig(None, params=cfg), sampling, seed=4, batch_size=2)
    H = _newest_entropies(m, labels, out.tokens, sampling)
    N = m.num_tokens
    steps = out.steps
    windows = set()
    for j, image in enumerate(out.images["image"]):
        rows = np.asarray(steps["image"]) == image
        n, drafted = np.asarray(steps["position"])[rows], np.asarray(steps["drafted"])[rows]
        want = np.minimum(entropy_window(H[j, n - 1], 8, 2, 1.5) - 1, N - 1 - n)
        assert drafted.tolist() == want.tolist(), (image, n, drafted, want)
        windows |= set(entropy_window(H[j, n - 1], 8, 2, 1.5).tolist())
    assert len(windows) >= 3, windows  # the windows really vary


def test_greedy_dynamic_window_equals_greedy_ar():
    m = _model()
    labels = [2, 6, 8, 4]
    s = SamplingConfig(guidance=3.0, temperature=0.0)
    out = decode(m, labels, DecodeConfig.of("entropy-sd", **DYNAMIC), s, batch_size=3)
    ar = torch.cat([sample_tokens(m, m.make_prompt([c], guided=s.guided), s) for c in labels])
    assert torch.equal(out.tokens, ar) and int(out.steps["accepted"].sum()) > 0
    assert len(set(np.asarray(out.steps["drafted"]).tolist())) >= 3


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["plain", "cfg-topk", "topp", "greedy"])
def test_float64_batch_three_equals_batch_one(sampling):
    """7 images through 3 slots (images finish at different steps, later ones take freed slots):
    tokens and every non-timing record equal batch 1's, window lengths included."""
    m = _model()
    labels = [0, 3, 5, 7, 1, 9, 4]
    cfg = DecodeConfig.of("entropy-sd", **DYNAMIC)
    one = decode(m, labels, cfg, sampling, seed=11, first_index=5)
    many = decode(m, labels, cfg, sampling, seed=11, first_index=5, batch_size=3)
    assert torch.equal(one.tokens, many.tokens)
    _same_records(one, many)
    assert many.steps["active"].max() == 3 and len(set(np.asarray(many.steps["drafted"]).tolist())) >= 3


def test_min_window_at_least_the_window_fixes_it():
    """entropy_min_window >= L: every forward reads L tokens (fewer only at the end of an image)."""
    m = _model()
    s = SamplingConfig(guidance=2.0, temperature=1.0)
    N = m.num_tokens
    for shortest in (8, 20):
        cfg = JacobiConfig("entropy-sd", window=8, entropy_min_window=shortest)
        assert not cfg.entropy_dynamic
        out = decode(m, [1, 2], DecodeConfig(None, params=cfg), s, seed=3)
        n = np.asarray(out.steps["position"])
        assert np.asarray(out.steps["drafted"]).tolist() == np.minimum(7, N - 1 - n).tolist()
    assert JacobiConfig("entropy-sd", window=8, entropy_min_window=7).entropy_dynamic
    assert not JacobiConfig("sjd", window=8, entropy_min_window=2).entropy_dynamic  # only entropy-sd reads it


def test_defaults_reach_the_settings():
    c = JacobiConfig("entropy-sd")
    assert (c.window, c.entropy_min_window, c.entropy_window_scale) == (24, 4, 6.0) and c.entropy_dynamic
    d = c.as_dict()
    assert d["entropy_min_window"] == 4 and d["entropy_window_scale"] == 6.0 and d["jacobi_window"] == 24
    assert "entropy_min_window" not in JacobiConfig("sjd").as_dict()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(entropy_min_window=0), "--entropy-min-window must be an integer >= 1"),
        (dict(entropy_min_window=2.5), "--entropy-min-window must be an integer >= 1"),
        (dict(entropy_min_window=True), "--entropy-min-window must be an integer >= 1"),
        (dict(entropy_window_scale=0.0), r"--entropy-window-scale \(nats\) must be > 0"),
        (dict(entropy_window_scale=-1.0), r"--entropy-window-scale \(nats\) must be > 0"),
        (dict(entropy_window_scale=float("nan")), r"--entropy-window-scale \(nats\) must be > 0"),
        (dict(entropy_window_scale=float("inf")), r"--entropy-window-scale \(nats\) must be > 0"),
    ],
)
def test_bad_window_knobs_are_refused(kwargs, match):
    with pytest.raises(UsageError, match=match) as e:
        JacobiConfig("entropy-sd", **kwargs)
    assert "\n" not in str(e.value)


def test_generate_cli_refuses_bad_window_knobs(tmp_path, capsys):
    from lantern.generate import main

    for argv, match in (
        (["--method", "entropy-sd", "--entropy-min-window", "0"], "--entropy-min-window must be an integer >= 1"),
        (["--method", "entropy-sd", "--entropy-window-scale", "-2"], "--entropy-window-scale (nats) must be > 0"),
        (["--method", "sjd", "--entropy-window-scale", "3"], "--entropy-window-scale does not apply to --method sjd"),
    ):
        assert main(argv + ["--num-images", "1", "--out", str(tmp_path / "r"), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and match in err[0], err
