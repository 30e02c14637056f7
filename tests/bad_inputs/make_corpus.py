"""Remake the bad-input corpus: the malformed graphs, the edited schedules and ``cases.json``.

    cd tests/bad_inputs && python make_corpus.py

Every case is a command line (run from this folder) that must exit 2 with exactly one line on stderr naming the
file or "command line" (``source``) and no traceback: ``tests/cli/test_bad_inputs.py`` runs them all. The edited
schedules start from ``tiny.greedy.schedule.json`` (``ho-plan tiny.json --hbm 9MB --planner greedy -o ...``); if
the schedule format changes, remake that file first, then run this script.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

HERE = Path(__file__).parent
GRAPH = "tiny.json"
SCHEDULE = "tiny.greedy.schedule.json"
CL = "command line"
# Every case plans on the tiny graph; options are parsed before any planning, so each case takes milliseconds.
PLAN = [GRAPH, "--hbm", "9MB", "--no-output"]

# A value of the wrong type for each kind of planner option (api.OptionType.kind).
WRONG = {int: "1.5", float: "fast", bool: "maybe", str: "sideways", dict: "[1,2]"}


def graph_cases() -> list[dict]:
    base = json.loads((HERE / GRAPH).read_text())

    def edit(fn) -> dict:
        doc = copy.deepcopy(base)
        fn(doc)
        return doc

    def cycle(d: dict) -> None:
        d["nodes"][0]["inputs"] = ["x", "w", "y"]  # mm1 reads y, which mm2 makes from mm1's h

    graphs: dict[str, object] = {
        "graph_unknown_field.json": edit(lambda d: d["tensors"][0].update(colour="red")),
        "graph_missing_nodes.json": edit(lambda d: d.pop("nodes")),
        "graph_wrong_format.json": edit(lambda d: d.update(format="ho-graph/9")),
        "graph_unknown_tensor.json": edit(lambda d: d["nodes"][1]["inputs"].append("ghost")),
        "graph_cycle.json": edit(cycle),
        "graph_negative_size.json": edit(lambda d: d["tensors"][4].update(bytes=-5)),
        "graph_unknown_kind.json": edit(lambda d: d["tensors"][3].update(kind="scratch")),
        "graph_unknown_dtype.json": edit(lambda d: d["tensors"][0].update(dtype="float13")),
        "graph_produced_twice.json": edit(lambda d: d["nodes"][1]["outputs"].append("h")),
        "graph_home_pool.json": edit(lambda d: d["tensors"][1].update(home="pool")),
        "graph_empty.json": edit(lambda d: (d.update(nodes=[]), d.update(tensors=[]))),
    }
    out = []
    for name, doc in graphs.items():
        (HERE / name).write_text(json.dumps(doc, indent=1) + "\n")
        out.append({"name": name.removesuffix(".json"), "args": [name, "--hbm", "9MB", "--no-output"],
                    "source": name})
    (HERE / "graph_syntax.json").write_text('{"format": "ho-graph/1", "name": "tiny", "tensors": [\n')
    out.append({"name": "graph_syntax", "args": ["graph_syntax.json", "--hbm", "9MB"], "source": "graph_syntax.json"})
    return out


def schedule_cases() -> list[dict]:
    base = json.loads((HERE / SCHEDULE).read_text())

    def at(doc: dict, key: str, name: str) -> dict:
        return next(e for e in doc[key] if e.get("name", e.get("tensor")) == name)

    edits = {
        # steps
        "steps_unknown_kind": lambda d: d["program"][0].update(kind="teleport"),
        "steps_unknown_node": lambda d: d["program"][1].update(node="mm9"),
        "steps_unknown_stream": lambda d: d["program"][0].update(stream="d2p"),
        "steps_wait_later": lambda d: d["program"][1].update(waits=[2]),
        "steps_unknown_tensor": lambda d: d["program"][0].update(tensor="ghost"),
        # the tensor table
        "table_size": lambda d: at(d, "tensors", "w").update(bytes=524288),
        "table_kind": lambda d: at(d, "tensors", "h").update(kind="gradient"),
        "table_extra": lambda d: d["tensors"].append({"bytes": 1, "home": "hbm", "kind": "input", "name": "z"}),
        "table_missing": lambda d: d["tensors"].pop(),
        # hardware
        "hardware_capacity_text": lambda d: d["hardware"]["tiers"][0].update(capacity_bytes="9MB"),
        "hardware_unknown_field": lambda d: d["hardware"].update(colour="red"),
        "hardware_missing_link": lambda d: d["hardware"]["links"].pop(),
        "hardware_zero_channels": lambda d: d["hardware"]["links"][0].update(channels=0),
        # options
        "options_wrong_type": lambda d: d["planner"]["options"].update(select_num=1.5),
        "options_unknown": lambda d: d["planner"]["options"].update(colour="red"),
        "options_unknown_planner": lambda d: d["planner"].update(name="magic"),
        # placement
        "placement_unknown_tier": lambda d: at(d, "placement", "w2").update(tier="pool"),
        "placement_pinned_moved": lambda d: at(d, "placement", "w").update(tier="hbm"),
        "placement_unknown_tensor": lambda d: d["placement"].append({"tensor": "ghost", "tier": "hbm"}),
        # offsets
        "offsets_negative": lambda d: at(d, "offsets", "w").update(offset=-8),
        "offsets_unknown_name": lambda d: at(d, "offsets", "w").update(name="ghost"),
        # the file as a whole
        "format": lambda d: d.update(format="ho-schedule/0"),
        "graph_sha": lambda d: d["graph"].update(sha256="0" * 64),
    }
    out = []
    for name, fn in edits.items():
        doc = copy.deepcopy(base)
        fn(doc)
        path = f"schedule_{name}.json"
        (HERE / path).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        out.append({"name": f"schedule_{name}", "args": ["validate", path, GRAPH], "source": path})
    out.append({"name": "schedule_other_hardware",
                "args": ["validate", SCHEDULE, GRAPH, "--hbm", "10MB"], "source": SCHEDULE})
    return out


def hardware_file_cases() -> list[dict]:
    base = json.loads((HERE / SCHEDULE).read_text())["hardware"]
    bad = copy.deepcopy(base)
    bad["links"][0]["latency_s"] = "10us"
    (HERE / "hardware_bad_latency.json").write_text(json.dumps(bad, indent=1) + "\n")
    return [
        {"name": "hardware_file_bad", "args": [*PLAN, "--hardware", "hardware_bad_latency.json"],
         "source": "hardware_bad_latency.json"},
        {"name": "hardware_file_missing", "args": [*PLAN, "--hardware", "no_such_hardware.json"],
         "source": "no_such_hardware.json"},
        {"name": "hardware_file_syntax", "args": [*PLAN, "--hardware", "graph_syntax.json"],
         "source": "graph_syntax.json"},
        {"name": "hardware_unknown_preset", "args": [*PLAN, "--hardware", "tpu9"], "source": CL},
    ]


def option_cases() -> list[dict]:
    units = {
        "hbm_text": ["--hbm", "lots"], "hbm_negative": ["--hbm", "-5GB"], "d2h_bare": ["--d2h", "40"],
        "h2d_size": ["--h2d", "40GB"], "d2p_missing_link": ["--d2p", "40GB/s"], "link_bare": ["--link", "d2h=40"],
        "latency_bare": ["--latency", "d2h=5"], "latency_no_pair": ["--latency", "5us"],
        "channels_text": ["--channels", "d2h=two"], "tier_text": ["--tier", "host=lots"],
        "peak_flops_text": ["--peak-flops", "fast"], "hbm_bandwidth_bare": ["--hbm-bandwidth", "1.6"],
        "launch_overhead_bare": ["--launch-overhead", "5"], "time_unit_bare": ["--time-unit", "10"],
        "size_unit_text": ["--size-unit", "lots"], "time_limit_text": ["--time-limit", "abc"],
        "time_limit_negative": ["--time-limit", "-1"], "dim_text": ["--dim", "batch=x"],
        "unknown_option": ["--hbmm", "1GB"],
    }
    out = [{"name": f"unit_{k}", "args": [GRAPH, "--hbm", "9MB", "--no-output", *v] if v[0] != "--hbm" else
            [GRAPH, "--no-output", *v], "source": CL} for k, v in units.items()]
    out += [
        {"name": "planner_unknown", "args": [*PLAN, "--planner", "magic"], "source": CL},
        {"name": "home_unknown_kind", "args": [*PLAN, "--home", "scratch=host"], "source": CL},
        {"name": "home_unknown_tier", "args": [*PLAN, "--home", "weight=pool"], "source": CL},
        {"name": "home_no_pair", "args": [*PLAN, "--home", "weight"], "source": CL},
        {"name": "subcommand_unknown", "args": ["valdate", "a", "b"], "source": CL},
        {"name": "sweep_subcommand_unknown", "args": ["sweep", "seqln"], "source": CL},
        {"name": "option_no_pair", "args": [*PLAN, "--planner", "greedy", "-O", "select_num"], "source": CL},
        {"name": "option_internal", "args": [*PLAN, "--planner", "cpsat", "-O", "progress=1"], "source": CL},
        {"name": "option_unknown", "args": [*PLAN, "--planner", "greedy", "-O", "colour=blue"], "source": CL},
        {"name": "option_negative", "args": [*PLAN, "--planner", "greedy", "-O", "select_num=-1"], "source": CL},
        {"name": "option_grid_values", "args": [*PLAN, "--planner", "greedy-sweep", "-O", 'grid={"select_num":["x"]}'],
         "source": CL},
        {"name": "range_reversed", "args": ["sweep", "seqlen", "inference", "--range", "10:5", "-q"], "source": CL},
        {"name": "range_text", "args": ["sweep", "seqlen", "inference", "--range", "short:long", "-q"], "source": CL},
        {"name": "range_one_end", "args": ["sweep", "seqlen", "inference", "--range", "4096", "-q"], "source": CL},
        {"name": "sweep_generator_unknown", "args": ["sweep", "seqlen", "llama", "-q"], "source": CL},
        {"name": "sweep_generator_arg", "args": ["sweep", "seqlen", "inference", "-G", "colour=1", "-q"],
         "source": CL},
        {"name": "sweep_option_planner", "args": ["sweep", "budget", GRAPH, "-O", "magic.x=1", "-q"], "source": CL},
        {"name": "sweep_option_type", "args": ["sweep", "budget", GRAPH, "-O", "reactive.lookahead=x", "-q"],
         "source": CL},
        {"name": "backend_unknown", "args": ["sweep", "budget", GRAPH, "--backend", "slurm", "-q"], "source": CL},
        {"name": "ray_address_local", "args": ["sweep", "budget", GRAPH, "--ray-address", "auto", "-q"], "source": CL},
        {"name": "paper_ray_address_local", "args": ["paper", "--ray-address", "auto", "-q"], "source": CL},
        {"name": "bench_resume_no_output", "args": ["bench", "--quick", "--resume"], "source": CL},
        {"name": "generate_unknown_workload", "args": ["generate", "llama", "-o", "x.json"], "source": CL},
        {"name": "generate_bad_value", "args": ["generate", "inference", "--seq-len", "long", "-o", "x.json"],
         "source": CL},
    ]
    return out


def typed_options() -> list[tuple[str, str, object]]:
    """(planner, option, type) of every -O that has a wrong value: all but free text (a path, say)."""
    from planner import api
    from planner.planners import PLANNERS

    out = []
    for name in PLANNERS:
        for key, spec in api.option_types(name).items():
            if key not in api.INTERNAL_OPTIONS and not (spec.kind is str and not spec.choices):
                out.append((name, key, spec))
    return out


def planner_option_cases() -> list[dict]:
    """Every -O of every planner, with a value of the wrong type."""
    out = []
    for name, key, spec in typed_options():
        assert spec.kind in WRONG, (name, key, spec)
        out.append({"name": f"O_{name}_{key}", "args": [*PLAN, "--planner", name, "-O", f"{key}={WRONG[spec.kind]}"],
                    "source": CL})
    return out


def main() -> None:
    cases = graph_cases() + schedule_cases() + hardware_file_cases() + option_cases() + planner_option_cases()
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)), "case names repeat"
    (HERE / "cases.json").write_text(json.dumps(cases, indent=1) + "\n")
    print(f"{len(cases)} cases")


if __name__ == "__main__":
    main()
