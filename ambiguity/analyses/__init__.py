"""Analyses that test LANTERN's premise on any model (Jang et al., ICLR 2025, Sec. 4.1).

* :mod:`.concentration`: how much of the target's probability lies on the latent neighbours
  B_k of its top-1 token, against k random tokens and the best possible k tokens.
* :mod:`.interchangeability`: pixel error after swapping tokens for latent neighbours, against
  swapping them for random tokens.

Run ``python -m ambiguity.analyses {concentration,interchangeability} --help``.
"""
