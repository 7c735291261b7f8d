"""What ``bench directory`` starts its nodes with (the run itself is the benchmark)."""

from __future__ import annotations

from p2pinfer.engines import load_engine
from p2pinfer.lab.directory_bench import bench_engine_options
from p2pinfer.lab.idle_bench import idle_node_config


def test_the_benchmarks_nodes_keep_no_checked_prompt_unless_asked():
    """An entry that kept the prompts it checked of its peers' probation answers would serve
    those subjects locally from then on, so by default the live swarm does not keep them (as
    ``lab nat`` and ``bench liar``); ``--check-cache`` runs the product default."""
    off = idle_node_config((), discovery="directory", engine_options=bench_engine_options(False))
    on = idle_node_config((), discovery="directory", engine_options=bench_engine_options(True))
    assert off.discovery == on.discovery == "directory"
    assert load_engine(off.engine, **dict(off.engine_options)).check_cache is False
    assert load_engine(on.engine, **dict(on.engine_options)).check_cache is True


def test_the_cli_runs_check_cache_off_by_default():
    import typer

    from p2pinfer.cli.main import app

    command = typer.main.get_command(app).commands["bench"].commands["directory"]
    (option,) = [p for p in command.params if p.name == "check_cache"]
    assert option.default is False
    assert option.opts == ["--check-cache"] and option.secondary_opts == ["--no-check-cache"]


def test_ttft_is_split_by_path_and_by_whether_the_answer_was_held_for_a_check():
    from p2pinfer.lab.directory_bench import ttft_by_path

    results = [
        {"ttft_s": 1.0, "served_locally": True, "attempts": []},
        {"ttft_s": 3.0, "served_locally": True, "attempts": []},
        {"ttft_s": 8.0, "served_locally": False, "attempts": [{"held_tokens": 4, "check": "passed"}]},
        {"ttft_s": 4.0, "served_locally": False, "attempts": [{"held_tokens": 0, "check": None}]},
        {"ttft_s": 2.0, "served_locally": False, "attempts": [{"check": "after"}]},
    ]
    assert ttft_by_path(results) == {
        "ttft_ms_mean_served_locally": 2000.0,
        "ttft_ms_mean_forwarded": 4666.7,  # rounded to 0.1 ms
        "ttft_ms_mean_forwarded_held": 8000.0,
        "ttft_ms_mean_forwarded_unheld": 3000.0,
        "forwarded_held": 1,
    }
    assert ttft_by_path(results[:2])["ttft_ms_mean_forwarded_held"] is None


def test_no_verify_turns_probation_and_spot_checks_off_and_leaves_the_rest():
    from p2pinfer.lab.directory_bench import bench_verify

    default = idle_node_config((), discovery="gossip")
    checked = idle_node_config((), discovery="gossip", verify=bench_verify(True))
    unchecked = idle_node_config((), discovery="gossip", verify=bench_verify(False))
    assert checked == default and default.router.verify.enabled
    assert not unchecked.router.verify.enabled
    assert unchecked.router.verify.probation_answers == 0 and unchecked.router.verify.fraction == 0.0
    assert unchecked.replace(router=default.router) == default  # nothing else differs


def test_sim_only_predicts_with_the_nodes_checks_and_without():
    """``--sim-only``: the simulator's side alone; with checks (the default) it also gives the
    same swarm without them, and the checked prediction is the slower one."""
    import json

    from typer.testing import CliRunner

    from p2pinfer.cli.main import app

    runner = CliRunner()
    checked = runner.invoke(app, ["bench", "directory", "--nodes", "8", "--sim-only", "--json"])
    bare = runner.invoke(app, ["bench", "directory", "--nodes", "8", "--sim-only", "--no-verify", "--json"])
    assert checked.exit_code == 0 and bare.exit_code == 0, (checked.output, bare.output)
    runs = json.loads(checked.stdout)["runs"]
    plain = json.loads(bare.stdout)["runs"]
    assert [r["discovery"] for r in runs] == ["gossip", "directory"] == [r["discovery"] for r in plain]
    for with_checks, without in zip(runs, plain):
        assert with_checks["sim_ttft_ms_mean_without_checks"] == without["sim_ttft_ms_mean"]
        assert with_checks["sim_ttft_ms_mean"] > without["sim_ttft_ms_mean"]
        assert with_checks["sim_forwarded_held"] > 0 and "sim_forwarded_held" not in without
        assert with_checks["sim_hit_rate"] == without["sim_hit_rate"]  # check_cache off: checks move no prefix
