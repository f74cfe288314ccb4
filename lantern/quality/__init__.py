"""Image-quality measurement for generation runs: feature extractors, distribution metrics, scoring.

* :mod:`lantern.quality.features` — the extractor interface and the five extractors
  (``inception``, ``clip``, ``dinov2``, ``mobilenet``, ``fmnist``) with the resize and crop rule;
* :mod:`lantern.quality.metrics` — Fréchet distance, KID, precision / recall / density /
  coverage and bootstrap intervals, on feature matrices;
* :mod:`lantern.quality.sources` — runs, image folders and data-set splits as image sets;
* :mod:`lantern.quality.scoring` — the protocol record, cached reference statistics, metric rows;
* :mod:`lantern.quality.text` — CLIP score and HPS v2.1;
* :mod:`lantern.quality.mobilenet`, :mod:`lantern.quality.fmnist` — the two offline networks.

The command and the high-level API are in :mod:`lantern.evaluate`.
"""
