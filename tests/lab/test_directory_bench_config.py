"""What ``bench directory`` starts its nodes with (the run itself is the benchmark)."""

from __future__ import annotations

from p2pinfer.engines import load_engine
from p2pinfer.lab.directory_bench import bench_engine_options
from p2pinfer.lab.idle_bench import idle_node_config


def test_the_benchmarks_nodes_keep_no_checked_prompt_unless_asked():
    """The simulator models no answer checking: an entry that kept the prompts it checked of its
    peers' probation answers would serve them locally, so by default the live swarm does not keep
    them either (as ``lab nat`` and ``bench liar``); ``--check-cache`` runs the product default."""
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
