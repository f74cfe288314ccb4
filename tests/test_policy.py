def test_calibration_uses_the_distribution_of_the_last_committed_token():
    """Image 0: round 1 at n = 1 drafts positions 1, 2 (the draft at 2 rejected, so x_2 came from
    p at position 2); round 2 at n = 3 drafts 3, 4: its drafts take position 2's target statistics.
    Round 3 at n = 5 follows a round that accepted everything (x_4 a bonus token: no draft row at
    4 is the last one... position 4 was reached, so it is used). Round 1 has no earlier token: left out."""
    from lantern.calibrate import lagged

    rows = dict(
        image=[0, 0, 0, 0, 0],
        position=[1, 2, 3, 4, 5],
        draft_index=[0, 1, 0, 1, 0],
        p_top1=[0.1, 0.2, 0.3, 0.4, 0.5],
        p_entropy=[1.1, 1.2, 1.3, 1.4, 1.5],
        q_top1=[0.6, 0.7, 0.8, 0.9, 0.95],
        accepted=[True, False, True, True, False],
        reached=[True, True, True, True, True],
    )
    got = lagged(rows)
    assert got["p_top1"].tolist() == [0.2, 0.2, 0.4] and got["p_entropy"].tolist() == [1.2, 1.2, 1.4]
    assert got["q_top1"].tolist() == [0.8, 0.9, 0.95] and got["accepted"].tolist() == [True, True, False]
