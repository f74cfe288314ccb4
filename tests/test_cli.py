"""Shared command-line plumbing (ambiguity.cli) and the package entry points."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ambiguity.cli import (
    ArgumentParser,
    add_condition_args,
    add_model_args,
    add_sampling_args,
    check_out_dir,
    cli_main,
    float_list,
    int_list,
    parse_mapping,
    sampling_from_args,
)
from ambiguity.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]


def _parser():
    p = ArgumentParser(prog="tool")
    add_model_args(p)
    add_condition_args(p)
    add_sampling_args(p)
    return p


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--cfg", "inf"], "argument --cfg: expected a finite number, got 'inf'"),
        (["--temperature", "nan"], "argument --temperature: expected a finite number, got 'nan'"),
        (["--seed", str(2**64)], "argument --seed: seeds must be in 0..2**63-1"),
        (["--seed", "-1"], "argument --seed: seeds must be in 0..2**63-1"),
        (["--num-images", "0"], "argument --num-images: must be >= 1, got 0"),
        (["--batch-size", "x"], "argument --batch-size: expected an integer, got 'x'"),
        (["--top-k", "-2"], "argument --top-k: must be >= 0, got -2"),
    ],
)
def test_value_parsers_give_one_line_and_exit_2(argv, needle, capsys):
    @cli_main
    def main(args=None):
        _parser().parse_args(args)

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and needle in err and "(see tool --help)" in err


def test_cli_main_returns_statuses(capsys):
    @cli_main
    def main(kind):
        if kind == "usage":
            raise UsageError("pass --x")
        if kind == "interrupt":
            raise KeyboardInterrupt
        if kind == "help":
            _parser().parse_args(["--help"])
        return None

    assert main("usage") == 2 and capsys.readouterr().err == "error: pass --x\n"
    assert main("interrupt") == 130 and "rerun the same command" in capsys.readouterr().err
    assert main("help") == 0 and "--num-images" in capsys.readouterr().out
    assert main("ok") == 0


def test_lists_and_mappings(tmp_path):
    assert int_list("1, 4,16", "--ks") == [1, 4, 16] and float_list("0.1,0.5", "--deltas") == [0.1, 0.5]
    for bad, fn, msg in (
        ("1,x", int_list, "comma-separated integers"),
        ("", int_list, "is empty"),
        ("0.1,inf", float_list, "finite numbers"),
        ("2", lambda t, w: float_list(t, w, 0, 1), "[0, 1]"),
    ):
        with pytest.raises(UsageError, match=msg.replace("[", r"\[").replace("]", r"\]")):
            fn(bad, "--list")
    with pytest.raises(UsageError, match=">= 1"):
        int_list("0,3", "--ks", minimum=1)
    assert parse_mapping([f"a={tmp_path}"], ["a", "b"]) == {"a": tmp_path}


def test_sampling_defaults_by_kind():
    args = _parser().parse_args([])
    assert sampling_from_args(args, "c2i").guidance == 4.0 and sampling_from_args(args, "t2i").guidance == 7.5
    assert sampling_from_args(_parser().parse_args(["--cfg", "3"]), "text").guidance == 1.0  # text: no guidance


def test_out_dir_checks(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UsageError, match="is a file"):
        check_out_dir(f)
    with pytest.raises(UsageError, match="lies below the file"):
        check_out_dir(f / "sub")
    assert check_out_dir(tmp_path / "new" / "dir") == (tmp_path / "new" / "dir").absolute()


def test_package_apis_and_command_lists():
    import ambiguity as amb
    import lantern as lt

    for name in ("load_model", "SamplingConfig", "profile_model", "model_neighbourhoods", "compare_models", "RunDir"):
        assert callable(getattr(amb, name)), name
    for name in ("AcceptanceRule", "DecodeConfig", "decode", "load_drafter", "judge", "tvd", "DraftModel"):
        assert getattr(lt, name) is not None, name
    with pytest.raises(AttributeError):
        amb.no_such_name  # noqa: B018
    for pkg, commands in (
        ("ambiguity", ("profile", "neighbourhood", "analyses", "compare")),
        ("lantern", ("generate", "replay", "train_drafter", "compare")),
    ):
        r = subprocess.run([sys.executable, "-m", pkg], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 0 and all(c in r.stdout for c in commands) and not r.stderr
        r = subprocess.run([sys.executable, "-m", pkg, "nope"], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unknown command 'nope'" in r.stderr


def test_face_names_are_the_definers_names_and_former_names_are_gone():
    import ambiguity as amb
    import lantern as lt
    from ambiguity.profile import summarize_profile
    from lantern.engine.records import summarize_decode
    from lantern.quality.scoring import QualityProtocol

    assert amb.summarize_profile is summarize_profile and lt.summarize_decode is summarize_decode
    assert lt.QualityProtocol is QualityProtocol
    for pkg, old in ((amb, "summarize"), (lt, "summarize"), (lt, "Protocol")):
        with pytest.raises(AttributeError, match=f"has no attribute '{old}'"):
            getattr(pkg, old)
    r = subprocess.run(
        [sys.executable, "-m", "lantern.drafter.comparison", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0 and "python -m lantern.drafter.comparison" in r.stdout and "--drafter-accuracy" in r.stdout


def test_settings_errors_name_the_field_and_commands_name_the_flag(capsys):
    from ambiguity.cli import flag_for
    from ambiguity.errors import FieldError
    from ambiguity.sampling import SamplingConfig
    from lantern.methods.tree.spec import TreeSpec
    from lantern.rules.acceptance import AcceptanceRule

    with pytest.raises(FieldError, match=r"^SamplingConfig\.guidance \(guidance scale\) must be at most 100") as e:
        SamplingConfig(guidance=200)
    assert "--cfg" not in str(e.value) and (e.value.owner, e.value.field) == ("SamplingConfig", "guidance")
    assert flag_for("SamplingConfig", "guidance") == "--cfg" and flag_for("TreeSpec", "top_k") == "--tree-top-k"
    assert flag_for("SamplingConfig", "top_k") == "--top-k" and flag_for("CompareSettings", "n_boot") == "--bootstrap"
    for make, line in (
        (
            lambda: SamplingConfig(guidance=200),
            "error: --cfg (guidance scale) must be at most 100 (larger scales overflow the logits), got 200",
        ),
        (lambda: SamplingConfig(top_p=0), "error: --top-p must be in (0, 1] (1 disables it), got 0"),
        (lambda: TreeSpec("dynamic", top_k=0), "error: --tree-top-k must be an integer >= 1, got 0"),
        (lambda: AcceptanceRule("lantern", k=8, delta=-1.0), "error: --delta must be >= 0 (0 is lossless)"),
    ):
        assert cli_main(lambda argv=None, make=make: make())() == 2
        err = capsys.readouterr().err
        assert err.startswith(line) and err.count("\n") == 1


def test_each_shared_flag_is_defined_once_in_the_cli_groups():
    """--data, --device, --threads, --out, --cfg, --overwrite, --no-progress, --shard-index and
    --num-shards come from ambiguity.cli's groups in every command, benchmark and script (one
    definition, one meaning)."""
    import re

    hand = re.compile(
        r"add_argument\(\s*\"--(data|device|threads|out|cfg|overwrite|no-progress|shard-index|num-shards)\""
    )
    files = [p for d in ("ambiguity", "lantern", "benchmarks", "scripts") for p in (ROOT / d).rglob("*.py")]
    typed = [
        f"{p.relative_to(ROOT)}: --{m.group(1)}"
        for p in files
        if p.name != "cli.py"
        for m in hand.finditer(p.read_text(encoding="utf-8"))
    ]
    assert not typed, typed


def test_evaluate_nearest_k_and_device_defaults():
    from lantern.evaluate import build_parser

    p = build_parser()
    assert p.parse_args(["r"]).k == 3 and p.parse_args(["r"]).device == "auto"
    assert p.parse_args(["r", "--nearest-k", "5"]).k == 5


@pytest.mark.parametrize("package", ["ambiguity", "lantern"])
def test_importing_the_library_sets_no_environment_variable_but_a_command_launch_waits_passively(package):
    """A plain import leaves OMP_WAIT_POLICY alone; while ``python -m <package>.<command>`` is being
    located (sys.argv[0] == "-m") the face sets it to PASSIVE unless it is set."""
    show = f"import os, sys; {{}}import {package}; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}

    def run(code, **extra):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env={**env, **extra})
        return r.stdout.strip()

    assert run(show.format("")) == "None"
    assert run(show.format("sys.argv[0] = '-m'; ")) == "PASSIVE"
    assert run(show.format("sys.argv[0] = '-m'; "), OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
