"""Values the LANTERN paper (Jang et al., ICLR 2025, arXiv 2410.03355) and its review discussion
publish, shown next to ours in ``python -m lantern.paper``'s report.

Every entry says where it comes from. A cell the paper does not publish as a number (e.g. a
value drawn only in a bar chart) is absent and reported as "not published"; nothing here is
estimated from a figure. LANTERN writes τ for the *temperature* (τ = 0 greedy, τ = 1 sampling);
this module and the report say "temperature" and keep τ for the mean accepted length.
"""

from __future__ import annotations

__all__ = [
    "SOURCES",
    "AMBIGUITY",
    "DRAFTER_TOP1",
    "RANDOM_INIT",
    "PRECISION_RECALL",
    "AR_PRECISION_RECALL",
    "HPS",
    "SPEEDUP",
    "SPEEDUP_OVER_EAGLE2",
    "PROXIMITY_COST",
    "SETTINGS",
    "PAPER_CODEBOOK",
    "NOT_PUBLISHED",
]

NOT_PUBLISHED = "not published"
PAPER_CODEBOOK = 16384  # LlamaGen's VQ-16 codebook: the paper's k (100, 300, 1000) and top-k 2000 refer to it

SOURCES = {
    "fig2": "LANTERN (ICLR 2025, revised version) Fig. 2b/2c, MS-COCO 2017 val captions",
    "rebuttal": "LANTERN review discussion (OpenReview): LlamaGen Stage I target, 1000 MS-COCO 2014 val captions",
    "table2": "LANTERN Table 2 (LlamaGen-XL Stage I, vs plain AR decoding; abstract v3 and summaries of Table 2)",
    "abstract": "LANTERN arXiv 2410.03355v3 abstract: LANTERN over EAGLE-2, 1.75x greedy and 1.82x sampling",
    "f2": "LANTERN App. F.2 (k = 1000, δ = 0.4, LlamaGen Stage I, 1000 MS-COCO 2014 val captions)",
    "f1": "LANTERN App. F.1: the measured speed-up stabilises by 1000 captions (1000 random MS-COCO val captions)",
    "settings": "the official LANTERN code's defaults (jadohu/LANTERN) and the paper's protocol notes",
}

# Fig. 2c (average top-1 probability, average top-10 probability) and Fig. 2b (drafter test accuracy)
AMBIGUITY = {"LlamaGen (Stage I)": {"top1": 0.206, "top10": 0.520}, "Anole": {"top1": 0.064, "top10": 0.204}}
DRAFTER_TOP1 = {"LlamaGen (Stage I)": 0.3880, "Anole": 0.2760}

# mean accepted length (bonus counted) of EAGLE-2 with a random-initialised vs a trained drafter
RANDOM_INIT = {
    ("random init", 0.0): 1.00,
    ("random init", 1.0): 1.00,
    ("trained, 20 epochs", 0.0): 1.60,
    ("trained, 20 epochs", 1.0): 1.20,
}

# improved precision / recall at temperature 1 over k x δ (paper k on the 16384 codebook)
AR_PRECISION_RECALL = (0.4781, 0.5633)
PRECISION_RECALL = {
    (100, 0.05): (0.4867, 0.5389),
    (100, 0.1): (0.4796, 0.5303),
    (100, 0.2): (0.4789, 0.5140),
    (100, 0.4): (0.4825, 0.4946),
    (300, 0.05): (0.4856, 0.5367),
    (300, 0.1): (0.4834, 0.5231),
    (300, 0.2): (0.4894, 0.4901),
    (300, 0.4): (0.4895, 0.4719),
    (1000, 0.05): (0.4865, 0.5334),
    (1000, 0.1): (0.4869, 0.5172),
    (1000, 0.2): (0.4880, 0.4888),
    (1000, 0.4): (0.4909, 0.4497),
}
HPS = {(100, 0.05): 24.01, (300, 0.05): 23.97, (1000, 0.05): 23.91}  # HPS v2 at δ = 0.05, temperature 1

# latency speed-up over plain AR decoding (LlamaGen-XL Stage I); temperature -> method -> speed-up
SPEEDUP = {0.0: {"EAGLE-2": 1.29, "LANTERN": 2.26}, 1.0: {"EAGLE-2": 0.93, "LANTERN": 1.69}}
SPEEDUP_OVER_EAGLE2 = {0.0: 1.75, 1.0: 1.82}

# App. F.2: building the proximity set A costs 1/9.1 of a target forward and 1/32 of a drafter forward
PROXIMITY_COST = {"target_forward_over_A": 9.1, "drafter_forward_over_A": 32.0}

SETTINGS = {
    "temperature": 1.0,
    "top_k": 2000,
    "top_p": 1.0,
    "guidance": 3.0,
    "k": 1000,
    "delta": 0.1,
    "tree": {"total_tokens": 59, "depth": 4, "top_k": 10},
    "speedup_captions": 1000,
}
