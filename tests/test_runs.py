"""Run directories (ambiguity.runs): settings records, refuse / overwrite / resume, and checked parts."""

import json

import pandas as pd
import pytest
import torch

from ambiguity.errors import UsageError
from ambiguity.run_records import settings_difference, settings_digest
from ambiguity.runs import RunDir, file_sha256


def _table(n: int, start: int = 0) -> pd.DataFrame:
    return pd.DataFrame({"image": range(start, start + n), "x": [0.5 * i for i in range(n)]})


def test_record_is_written_once_and_other_settings_are_refused(tmp_path):
    run = RunDir(tmp_path / "r", {"seed": 0, "k": 4}, command="test", outputs=("summary.json",)).open()
    record = json.loads((tmp_path / "r" / "run.json").read_text())
    assert record["settings"] == {"seed": 0, "k": 4} and record["digest"] == run.digest == settings_digest(
        {"k": 4, "seed": 0}
    )
    assert {"python", "torch", "lantern-ambiguity"} <= set(record["versions"])
    RunDir(tmp_path / "r", {"k": 4, "seed": 0}, command="test").open()  # key order does not matter
    with pytest.raises(
        UsageError,
        match=r"holds results of a run with other settings \(seed: 0 there, 1 now\); "
        r"pass another --out or add --overwrite",
    ):
        RunDir(tmp_path / "r", {"seed": 1, "k": 4}, command="test").open()
    # only some keys (the CLI options, before a model is loaded)
    RunDir(tmp_path / "r", {"seed": 0, "k": 5}, command="test").check(only=("seed",))
    with pytest.raises(UsageError, match="k: 4 there, 5 now"):
        RunDir(tmp_path / "r", {"seed": 0, "k": 5}, command="test").check()


def test_overwrite_clears_only_the_runs_own_files(tmp_path):
    d = tmp_path / "r"
    run = RunDir(d, {"a": 1}, command="test", outputs=("summary.json", "images")).open()
    run.write_part("p0", {"images": [0, 2]}, tables={"t": _table(2)})
    (d / "summary.json").write_text("{}")
    (d / "images").mkdir()
    (d / "images" / "0.png").write_bytes(b"x")
    (d / "notes.txt").write_text("mine")
    RunDir(d, {"a": 2}, command="test", outputs=("summary.json", "images")).open(overwrite=True)
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt", "parts", "run.json"]
    assert json.loads((d / "run.json").read_text())["settings"] == {"a": 2}


def test_damaged_record_and_parts_without_record_are_refused(tmp_path):
    d = tmp_path / "r"
    RunDir(d, {"a": 1}, command="test").open().write_part("p", {"i": 0}, tables={"t": _table(1)})
    (d / "run.json").write_text("{broken")
    with pytest.raises(UsageError, match="damaged run.json"):
        RunDir(d, {"a": 1}, command="test").open()
    (d / "run.json").unlink()
    with pytest.raises(UsageError, match="parts without their run.json"):
        RunDir(d, {"a": 1}, command="test").open()


def test_part_round_trip_and_manifest(tmp_path):
    run = RunDir(tmp_path / "r", {"a": 1}, command="test").open()
    png = tmp_path / "r" / "images" / "00000.png"
    png.parent.mkdir()
    png.write_bytes(b"\x89PNG fake")
    t = torch.arange(6).view(2, 3)
    run.write_part(
        "batch_00000",
        {"images": [0, 2]},
        tables={"rows": _table(2)},
        tensors={"codes": {"codes": t}},
        files=[png],
        meta={"source": "unit test"},
    )
    m = json.loads(run.manifest_path("batch_00000").read_text())
    assert m["digest"] == run.digest and m["holds"] == {"images": [0, 2]} and m["meta"] == {"source": "unit test"}
    assert m["files"]["batch_00000.rows.parquet"]["rows"] == 2
    assert m["files"]["../images/00000.png"]["sha256"] == file_sha256(png)
    part = run.read_part("batch_00000", {"images": [0, 2]})
    pd.testing.assert_frame_equal(part.tables["rows"], _table(2))
    assert torch.equal(part.tensors["codes"]["codes"], t) and part.files["00000.png"] == png
    assert run.part_names() == ["batch_00000"] and run.read_part("batch_00001", {"images": [2, 4]}) is None


def test_drop_part_removes_its_own_files_and_keeps_the_others(tmp_path):
    run = RunDir(tmp_path / "r", {"a": 1}, command="test").open()
    png = tmp_path / "r" / "images" / "00000.png"
    png.parent.mkdir()
    png.write_bytes(b"\x89PNG fake")
    run.write_part("pending_1", {}, tables={"rows": _table(2)}, files=[png])
    run.write_part("pending_10", {}, tables={"rows": _table(3)})  # a name that starts like the other's
    run.drop_part("pending_1")
    assert run.read_part("pending_1") is None and png.is_file()
    assert sorted(p.name for p in run.parts_dir.iterdir()) == ["pending_10.json", "pending_10.rows.parquet"]
    run.drop_part("pending_1")  # absent: nothing happens
    assert run.read_part("pending_10").tables["rows"].shape[0] == 3


@pytest.mark.parametrize(
    "damage, why",
    [
        ("truncate", "checksum mismatch"),
        ("delete", "is missing"),
        ("foreign", "holds {'images': [2, 4]} instead of {'images': [0, 2]}"),
        ("manifest", "manifest is unreadable"),
        ("png", "checksum mismatch"),
    ],
)
def test_damaged_or_foreign_parts_are_not_reused(tmp_path, damage, why):
    notes = []
    run = RunDir(tmp_path / "r", {"a": 1}, command="test", report=notes.append).open()
    png = tmp_path / "r" / "x.png"
    png.write_bytes(b"image bytes")
    run.write_part("batch_00000", {"images": [0, 2]}, tables={"rows": _table(2)}, files=[png])
    run.write_part("batch_00001", {"images": [2, 4]}, tables={"rows": _table(2, 2)})
    data = run.parts_dir / "batch_00000.rows.parquet"
    if damage == "truncate":
        data.write_bytes(data.read_bytes()[:-20])
    elif damage == "delete":
        data.unlink()
    elif damage == "foreign":  # another batch's complete part copied over this one
        for suffix in (".json", ".rows.parquet"):
            (run.parts_dir / f"batch_00000{suffix}").write_bytes((run.parts_dir / f"batch_00001{suffix}").read_bytes())
    elif damage == "manifest":
        run.manifest_path("batch_00000").write_text("{not json")
    else:
        png.write_bytes(b"other bytes")
    assert run.read_part("batch_00000", {"images": [0, 2]}) is None
    assert len(notes) == 1 and why in notes[0] and "recomputing" in notes[0] and "\n" not in notes[0]
    assert run.read_part("batch_00001", {"images": [2, 4]}) is not None  # the intact part is still reused


def test_parts_of_other_settings_are_not_reused(tmp_path):
    d = tmp_path / "r"
    RunDir(d, {"a": 1}, command="test").open().write_part("p", {"i": 0}, tables={"t": _table(1)})
    run = RunDir(d, {"a": 2}, command="test")  # e.g. run.json replaced by hand; the digest tells
    notes = []
    run.report = notes.append
    assert run.read_part("p", {"i": 0}) is None and "other settings" in notes[0]


def test_settings_difference_names_the_first_nested_key():
    assert (
        settings_difference({"s": {"guidance": 4.0, "seed": 0}}, {"s": {"guidance": 2.0, "seed": 0}})
        == "s.guidance: 4.0 there, 2.0 now"
    )
    assert settings_difference(None, {"a": 1}) == "unreadable run file"


def test_settings_difference_names_the_model_before_what_follows_from_it():
    """A rerun with another model changes its defaults too (guidance, grid): the model is named,
    not the alphabetically first key; below it, the name before the facts that follow."""
    old = {"guidance": 4.0, "model": {"grid": [8, 8], "name": "embedded"}, "seed": 0}
    new = {"guidance": 7.5, "model": {"grid": [16, 16], "name": "embedded-16"}, "seed": 0}
    assert settings_difference(old, new) == "model.name: 'embedded' there, 'embedded-16' now"
    assert (
        settings_difference({**old, "model": "embedded"}, {**new, "model": "anole"})
        == "model: 'embedded' there, 'anole' now"
    )
    assert (
        settings_difference({"b": 1, "a": 1, "method": "sd"}, {"b": 2, "a": 2, "method": "sd"}) == "a: 1 there, 2 now"
    )


def test_shard_units_and_assemble_units_split_resume_and_merge(tmp_path):
    """Three shards of five units: each shard gets units i % 3 == index, finished parts come back
    as resumed, and the merging shard reads every unit in order; a missing unit is refused."""
    import pandas as pd

    from ambiguity.distributed import Shard, merging_shard
    from ambiguity.runs import assemble_units, shard_units

    units = [(f"u{i}", {"i": i}) for i in range(5)]
    run = RunDir(tmp_path / "r", {"s": 1}, command="test").open(shards=3)
    table = lambda i: pd.DataFrame({"i": [i]})
    for index in range(3):
        shard = Shard(index, 3)
        seen = [(i, part) for i, part in shard_units(run, units, shard)]
        assert [i for i, _ in seen] == [i for i in range(5) if i % 3 == index]
        assert all(part is None for _, part in seen)
        for i, _ in seen[:1]:  # each shard finishes only its first unit
            run.write_part(*units[i], tables={"t": table(i)})
        assert assemble_units(run, units, shard, [], lambda p: p) is None  # independent shards: merge later
    again = [(i, part is not None) for i, part in shard_units(run, units, Shard(0, 3))]
    assert again == [(0, True), (3, False)]
    with pytest.raises(UsageError, match="lacks the intact part u3"):
        assemble_units(run, units, merging_shard(3), [], lambda p: p)
    for i in (3, 4):
        run.write_part(*units[i], tables={"t": table(i)})
    got = assemble_units(run, units, merging_shard(3), [], lambda p: int(p.tables["t"]["i"][0]))
    assert got == [0, 1, 2, 3, 4]
    # one process: its own results, nothing read back; no run directory: nothing resumed
    assert assemble_units(None, units, Shard(0, 1), ["a"], lambda p: p) == ["a"]
    assert [(i, p) for i, p in shard_units(None, units, Shard(0, 1))] == [(i, None) for i in range(5)]


def test_assemble_units_without_own_results_reads_the_parts_in_one_process(tmp_path):
    """own=None (lantern's generate, the paper's sessions): one process reads every part back in
    unit order, and a missing one is refused as on a merging shard."""
    from ambiguity.distributed import SINGLE
    from ambiguity.runs import assemble_units

    units = [(f"u{i}", {"i": i}) for i in range(3)]
    run = RunDir(tmp_path / "r", {"s": 1}, command="test").open()
    for i in (2, 0):
        run.write_part(*units[i], tables={"t": pd.DataFrame({"i": [10 * i]})})
    with pytest.raises(UsageError, match="lacks the intact part u1"):
        assemble_units(run, units, SINGLE, None, lambda p: p)
    run.write_part(*units[1], tables={"t": pd.DataFrame({"i": [10]})})
    assert assemble_units(run, units, SINGLE, None, lambda p: int(p.tables["t"]["i"][0])) == [0, 10, 20]


class _Recorder:
    """A shard of ``count`` in a process group that records its barriers (no group is started)."""

    def __init__(self, index: int, count: int, events: list):
        self.index, self.count, self.group, self.merging, self.events = index, count, True, False, events

    def owns(self, unit: int) -> bool:
        return unit % self.count == self.index

    def barrier(self) -> None:
        self.events.append("barrier")


def test_shard_units_every_shard_yields_every_unit_and_waits_after_each(tmp_path):
    """every_shard (the paper's items): shard 1 of 2 also gets units 0 and 2, finished ones with
    their parts, and the barrier comes after the driver's work on each unit, never before it."""
    from ambiguity.runs import shard_units

    units = [(f"u{i}", {"i": i}) for i in range(3)]
    run = RunDir(tmp_path / "r", {"s": 1}, command="test").open(shards=None)
    run.write_part(*units[1], tables={"t": pd.DataFrame({"i": [1]})})
    events: list = []
    for i, done in shard_units(run, units, _Recorder(1, 2, events), every_shard=True):
        events.append(f"unit {i}" + (" resumed" if done is not None else ""))
    assert events == ["unit 0", "barrier", "unit 1 resumed", "barrier", "unit 2", "barrier"]
    events.clear()
    assert [i for i, _ in shard_units(run, units, _Recorder(1, 2, events))] == [1] and events == []


def test_open_shared_records_the_shard_count_and_a_merge_never_clears(tmp_path):
    from ambiguity.distributed import Shard, merging_shard

    run = RunDir(tmp_path / "r", {"s": 1}, command="test", outputs=("summary.json",))
    run.open_shared(Shard(1, 2))
    run.write_part("u1", {"i": 1}, tables={"t": _table(1)})
    assert json.loads(run.run_file.read_text())["shards"] == 2
    with pytest.raises(UsageError, match="started with 2 shard"):
        run.open_shared(Shard(0, 3))
    run.open_shared(merging_shard(2), overwrite=True)  # `ambiguity merge` of an evaluate run with --overwrite
    assert run.part_names() == ["u1"]
    run.open_shared(Shard(0, 1), overwrite=True)
    assert run.part_names() == [] and json.loads(run.run_file.read_text())["shards"] == 1
    free = RunDir(tmp_path / "free", {"s": 1}, command="test").open_shared(Shard(0, 2), any_count=True)
    assert json.loads(free.run_file.read_text())["shards"] is None
    free.open_shared(Shard(2, 3), any_count=True)  # any number of shards may continue it


def test_run_options_take_a_path_or_options():
    from ambiguity.distributed import SINGLE, Shard
    from ambiguity.runs import RunOptions

    assert RunOptions.of("runs/x") == RunOptions(out="runs/x", overwrite=False, progress=True, shard=SINGLE)
    opts = RunOptions("o", True, False, Shard(1, 2))
    assert RunOptions.of(opts) is opts
    assert RunOptions.of() == RunOptions()
    with pytest.raises(TypeError):  # the old keywords are gone (no shims)
        RunOptions.of(None, out="o")

    class Args:
        out, overwrite, no_progress = "a", True, True

    assert RunOptions.from_args(Args(), Shard(0, 2)) == RunOptions("a", True, False, Shard(0, 2))
    assert RunOptions.from_args(Args(), out="b").out == "b"


def test_a_record_made_before_the_weights_digest_continues_and_a_foreign_digest_is_refused(tmp_path):
    d = tmp_path / "r"
    legacy = {"model": {"model": "embedded", "grid": [8, 8]}, "seed": 0}
    old = RunDir(d, legacy, command="test").open()
    old.write_part("p0", {"i": 0}, tables={"t": _table(2)})
    notes = []
    now = {"model": {"model": "embedded", "grid": [8, 8], "weights_digest": "aaaa"}, "seed": 0}
    run = RunDir(d, now, command="test", report=notes.append).open()
    # continued under its own record: the old digest, so its parts are reused
    assert run.settings == legacy and run.digest == old.digest and run.read_part("p0", {"i": 0}) is not None
    assert notes == [f"{d} was recorded without model.weights_digest, so that cannot be checked; continuing it"]
    assert json.loads((d / "run.json").read_text())["settings"] == legacy
    # anything else differing is still refused, naming it
    with pytest.raises(UsageError, match="seed: 0 there, 1 now"):
        RunDir(d, {**now, "seed": 1}, command="test").open()
    # a run recorded with a digest refuses other weights
    d2 = tmp_path / "r2"
    RunDir(d2, now, command="test").open()
    other = {**now, "model": {**now["model"], "weights_digest": "bbbb"}}
    with pytest.raises(UsageError, match="model.weights_digest: 'aaaa' there, 'bbbb' now"):
        RunDir(d2, other, command="test").open()
    with pytest.raises(UsageError, match="model.weights_digest: 'aaaa' there, None now"):
        RunDir(d2, legacy, command="test").open()  # dropping a recorded digest is no legacy case


def test_a_later_seal_keeps_the_checksums_of_the_files_it_does_not_name(tmp_path):
    """A pass that rewrites some outputs (a merge with --no-figures) reseals those and keeps the rest."""
    from ambiguity.runs import RUN_FILE, SEAL_KEY

    run = RunDir(tmp_path / "r", {"a": 1}, command="test").open()
    (run.path / "t.csv").write_text("x\n1\n")
    (run.path / "img.png").write_bytes(b"png bytes")
    run.seal(["t.csv", "img.png"])
    (run.path / "t.csv").write_text("x\n2\n")
    run.seal(["t.csv"])
    sealed = json.loads((run.path / RUN_FILE).read_text())[SEAL_KEY]
    assert sealed == {"t.csv": file_sha256(run.path / "t.csv"), "img.png": file_sha256(run.path / "img.png")}
    assert sealed["t.csv"] != sealed["img.png"]


def test_a_resumed_run_sweeps_the_debris_of_a_killed_write(tmp_path):
    """A process killed inside atomic_path (while writing a figure) leaves ``.<name>.*.tmp``; resuming
    the run removes it, and keeps the temporary file of a writer that is still alive."""
    import os
    import subprocess
    import sys

    from ambiguity.io import _writer

    run = RunDir(tmp_path / "r", {"a": 1}, command="test", outputs=("figures",)).open()
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; from ambiguity.io import atomic_path\n"
            "with atomic_path(sys.argv[1]) as tmp:\n    tmp.write_bytes(b'half a png'); os._exit(9)",
            str(run.path / "figures" / "grid.png"),
        ],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert killed.returncode == 9
    (debris,) = (run.path / "figures").glob(".grid.png.*.tmp")
    old = run.path / ".summary.json.k3x_9abc.tmp"  # named before writers were recorded
    old.write_text("{")
    live = run.path / "figures" / f".other.png.{_writer()}.abcd1234.tmp"  # this process, writing now
    live.write_bytes(b"...")
    RunDir(tmp_path / "r", {"a": 1}, command="test", outputs=("figures",)).open()
    assert not debris.exists() and not old.exists() and live.exists()
    assert not (run.path / "figures" / "grid.png").exists()
