"""The ho-plan command end to end, through click's CliRunner and as a subprocess."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import GRAPHS

from planner.cli import main

TB = str(GRAPHS / "transformer_block.json")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_plan_writes_a_schedule_that_validates(tmp_path):
    out = tmp_path / "tb.schedule.json"
    r = run(TB, "--hbm", "1GB", "--planner", "reactive", "-o", out)
    assert r.exit_code == 0, r.output
    assert "peak HBM" in r.output and "overhead vs no offload" in r.output
    doc = json.loads(out.read_text())
    assert doc["valid"] and doc["metrics"]["peak_bytes"]["hbm"] <= 10**9
    v = run("validate", out, TB)
    assert v.exit_code == 0, v.output and "valid" in v.output


def test_json_summary(tmp_path):
    r = run(TB, "--hbm", "1.5GB", "--planner", "reactive", "--json", "-o", tmp_path / "s.json")
    assert r.exit_code == 0
    d = json.loads(r.output)
    assert d["valid"] and d["hbm_budget_bytes"] == 1_500_000_000
    assert d["peak_hbm_bytes"] <= d["hbm_budget_bytes"] < d["no_offload_peak_hbm_bytes"]
    assert d["makespan_us"] >= d["no_offload_makespan_us"]


def test_budget_below_minimum_exits_1_with_the_minimum():
    r = run(TB, "--hbm", "100MB", "--planner", "reactive", "--no-output")
    assert r.exit_code == 1
    assert "largest single-op working set" in r.output and "704.6 MB" in r.output


def test_invalid_plan_exits_1_and_writes_nothing(tmp_path):
    out = tmp_path / "none.json"
    r = run(TB, "--hbm", "1GB", "--planner", "none", "-o", out)
    assert r.exit_code == 1 and "capacity" in r.output
    assert not out.exists()


def test_validate_rejects_other_graph(tmp_path):
    out = tmp_path / "tb.json"
    assert run(TB, "--hbm", "2GB", "--planner", "reactive", "-o", out).exit_code == 0
    r = run("validate", out, GRAPHS / "remote_weights_chain.json")
    assert r.exit_code == 2 and "made for graph" in r.output


def test_validate_detects_tampering(tmp_path):
    out = tmp_path / "tb.json"
    assert run(TB, "--hbm", "2GB", "--planner", "reactive", "-o", out).exit_code == 0
    doc = json.loads(out.read_text())
    doc["metrics"]["stall_us"] += 5
    out.write_text(json.dumps(doc))
    r = run("validate", out, TB)
    assert r.exit_code == 1 and "mismatch metrics.stall_us" in r.output


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--hbm", "-5GB"], "--hbm"),
        (["--hbm", "lots"], "--hbm"),
        (["--d2h", "0GB/s"], "--d2h"),
        (["--hardware", "tpu9"], "unknown preset"),
        (["--planner", "magic"], "unknown planner"),
        (["--link", "warp=5GB/s"], "no link 'warp'"),
        (["--tier", "host"], "NAME=VALUE"),
        (["-O", "colour=blue"], "-O colour"),
    ],
)
def test_bad_options_exit_2_one_line(args, expected):
    r = run(TB, "--no-output", *args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and expected in lines[0], r.output


def test_home_tier_missing_from_hardware():
    r = run(GRAPHS / "remote_weights_chain.json", "--hardware", "h100-pcie", "--no-output")
    assert r.exit_code == 2 and "home tier 'pool'" in r.output


def test_pool_hardware_plans_remote_weights(tmp_path):
    r = run(GRAPHS / "remote_weights_chain.json", "--hardware", "cloudmatrix384", "--hbm", "500MB",
            "--planner", "reactive", "-o", tmp_path / "c.json", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["bytes_moved"]["p2d"] > 0


def test_subprocess_end_to_end(tmp_path):
    out = tmp_path / "sub.json"
    p = subprocess.run(
        [sys.executable, "-m", "planner", TB, "--hbm", "1GB", "--planner", "reactive", "-o", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stderr
    bad = subprocess.run([sys.executable, "-m", "planner", str(tmp_path / "missing.json")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().count("\n") == 0 and "no such file" in bad.stderr
    v = subprocess.run([sys.executable, "-m", "planner", "validate", str(out), TB], capture_output=True,
                       text=True, timeout=120)
    assert v.returncode == 0, v.stdout + v.stderr


def test_help_shows_examples():
    r = run("--help")
    assert r.exit_code == 0 and "Examples:" in r.output and "ho-plan graphs/" in r.output


def test_typed_options_are_what_the_schedule_records(tmp_path):
    out = tmp_path / "g.json"
    r = run(TB, "--hbm", "1GB", "--planner", "greedy", "-O", "offsets=no", "-O", "select_num=16", "-o", out)
    assert r.exit_code == 0, r.output
    options = json.loads(out.read_text())["planner"]["options"]
    assert options["offsets"] is False and options["select_num"] == 16


def test_hardware_spec_file_and_validate_checks_the_file(tmp_path):
    out = tmp_path / "r.json"
    assert run(TB, "--hbm", "1GB", "--planner", "reactive", "-o", out).exit_code == 0
    doc = json.loads(out.read_text())
    spec = tmp_path / "hw.json"
    spec.write_text(json.dumps(doc["hardware"]))
    r = run(TB, "--hardware", spec, "--planner", "reactive", "--json", "--no-output")
    assert r.exit_code == 0 and json.loads(r.output)["hbm_budget_bytes"] == 10**9
    assert run("validate", out, TB, "--hardware", spec).exit_code == 0
    for t in doc["tensors"]:
        t["bytes"] //= 4  # an edited tensor table: one line per tensor, exit 2
    out.write_text(json.dumps(doc))
    r = run("validate", out, TB)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.stderr.count("\n") == min(len(doc["tensors"]), 20) + (len(doc["tensors"]) > 20)
    assert "bytes is" in r.stderr.splitlines()[0]


def test_sweep_seqlen_takes_the_generate_names(tmp_path):
    r = run("sweep", "seqlen", "inference", "--hbm", "7.5GB", "--range", "1024:2048", "--planners", "none",
            "-G", "layers=1", "-G", "decode_steps=1", "-q", "-o", tmp_path / "s")
    assert r.exit_code == 0, r.output
    assert "none: >= 2048 tokens" in r.output
