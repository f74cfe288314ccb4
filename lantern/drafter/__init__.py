"""The EAGLE drafter and its training.

* :mod:`.model` — the drafter (one decoder layer over the target's features), the ``DraftModel``
  seam, loading the shipped drafters, its q (:func:`.model.draft_q`, over a draft vocabulary when it has one);
* :mod:`.vocab` — choosing a draft vocabulary by the target's mass, ``python -m lantern.drafter.vocab``;
* :mod:`.data` — token files and the target's teacher-forced feature cache;
* :mod:`.sequences` — a training run's sequences from its flags;
* :mod:`.objective` — the loss and the test accuracy (LANTERN Fig. 2b);
* :mod:`.train` — ``python -m lantern.drafter.train``;
* :mod:`.report` — the accuracy figure and table;
* :mod:`.comparison` — ``python -m lantern.drafter.comparison`` (LANTERN Fig. 2).
"""
