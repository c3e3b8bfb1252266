"""The frontend stage's arithmetic (scripts/bench/frontends.py): P1-P4 per frontend, P12 per
frontend against the seed reference, P14 between the frontends, and its command line. The servers
themselves run only in `make bench-frontends`."""

import re

import pytest

from scripts.bench import frontends
from scripts.bench.stats import summarize
from scripts.bench.suite import ModeRun
from tests.unit.bench.test_bench_stats import req

P_LINE = re.compile(r"P\d+[a-z-]* \d+\.\d\d  goal [<>]= [\d.]+ (met|NOT met)  = .+ / .+")


def continuous(ttft_s: float, tokens: int) -> frontends.FrontendRun:
    """A frontend's run: one stream (ITL 6.6 ms), 8 streams (`tokens` in 1 s), Poisson 50 % and 70 %."""
    sync = summarize("synchronous", "synchronous", 1, 0, [req(0, ttft_s, ttft_s + 0.0066 * 9, 0.2, 10)])
    conc = summarize("concurrent@8", "concurrent", 8, 0, [req(0, 0.1, 1.0, 1.0, tokens)])
    at50 = summarize("p50", "poisson", 1, 2.0, [req(0, 2 * ttft_s, 0.5, 0.6, 10)])
    at70 = summarize("p70", "poisson", 1, 3.0, [req(0, 3 * ttft_s, 0.5, 0.6, 10)])
    des_conc = summarize("des", "concurrent", 8, 0, [req(0, 0.1, 1.0, 1.0, 630)])
    run = ModeRun("continuous", {}, [sync, conc, at50, at70], [None, des_conc, None, None], {"p50": 0.5, "p70": 0.7})
    return frontends.FrontendRun("x", run)


def seed_load(ttft_s: float):
    return summarize("concurrent@32 1 replica", "concurrent", 32, 0, [req(0, ttft_s, 5.0, 5.0, 250)])


def test_ratios_per_frontend_p12_and_p14():
    runs = {"torchserve": continuous(0.05, 600), "asgi": continuous(0.04, 630)}
    runs["torchserve"].seed, runs["asgi"].seed = seed_load(0.30), seed_load(0.21)
    static = ModeRun("static", {}, [summarize("p50", "poisson", 1, 2.0, [req(0, 0.8, 1.0, 1.1, 10)])], [None], {})
    static.fractions = {"p50": 0.5}
    ratios = frontends.frontend_ratios(runs, 6.6, 0.7, 0.5, static, seed_load(0.2))
    r = {x.name: x for x in ratios}
    assert list(r) == [
        *("P1-torchserve", "P2-torchserve", "P3-torchserve", "P4-torchserve"),
        *("P1-asgi", "P2-asgi", "P3-asgi", "P4-asgi"),
        *("P12-torchserve", "P12-asgi", "P14"),
    ]
    assert r["P1-asgi"].value == pytest.approx(1.0)
    assert r["P2-torchserve"].value == pytest.approx(600 / 630)
    assert r["P3-asgi"].value == pytest.approx(3.0)  # 120 ms at 70 % / 40 ms idle
    assert r["P4-torchserve"].value == pytest.approx(800 / 100)  # static 800 ms / continuous 100 ms at 50 %
    assert r["P4-asgi"].value == pytest.approx(800 / 80)
    assert r["P12-torchserve"].value == pytest.approx(1.5) and not r["P12-torchserve"].met
    assert r["P12-asgi"].value == pytest.approx(1.05) and r["P12-asgi"].met
    assert r["P14"].value == pytest.approx(630 / 600) and r["P14"].met
    assert [x.goal for x in (r["P1-asgi"], r["P4-asgi"], r["P12-asgi"], r["P14"])] == [
        "<= 1.05",
        ">= 10",
        "<= 1.1",
        ">= 1",
    ]
    assert r["P14"].line() == (
        "P14 1.05  goal >= 1 met  = ASGI served 630.0 tok/s (8 streams) / TorchServe served 600.0 tok/s (8 streams)"
    )
    assert "static TorchServe TTFT p50 800.0 ms" in r["P4-asgi"].line()
    assert "asgi continuous TTFT p50 80.0 ms" in r["P4-asgi"].line()
    assert all(P_LINE.fullmatch(x.line()) for x in ratios)
    assert not r["P3-torchserve"].met and r["P3-torchserve"].to_dict()["goal"] == "<= 1.5"


def test_one_frontend_has_no_p14_and_no_static_no_p4():
    runs = {"asgi": continuous(0.04, 630)}
    names = [x.name for x in frontends.frontend_ratios(runs, 6.6, 0.7, 0.5, None, None)]
    assert names == ["P1-asgi", "P2-asgi", "P3-asgi"]


def test_side_by_side_has_a_column_per_frontend():
    runs = {"torchserve": continuous(0.05, 600), "asgi": continuous(0.04, 630)}
    table = frontends.side_by_side(runs, frontends.frontend_ratios(runs, 6.6, 0.7, 0.5, None, None))
    lines = table.splitlines()
    assert lines[0].split() == ["torchserve", "asgi"]
    assert lines[1].split()[-2:] == ["50.00", "40.00"]  # idle TTFT p50 ms
    assert next(x for x in lines if x.startswith("P12")).split()[1:] == ["-", "-"]


def test_command_line(tmp_path):
    args = frontends.parse_args(["--frontends", "asgi", "--concurrent-rounds", "3", "--no-static"])
    assert args.frontend_list == ["asgi"] and not args.static and args.seed
    assert args.suite_argv == ["--concurrent-rounds", "3"]  # passed to the suite's loads
    assert args.asgi_environment == {} and args.seed_rounds == 8
    env = frontends.parse_args(["--asgi-env", "OMP_NUM_THREADS=1", "--asgi-env", "A=b=c"]).asgi_environment
    assert env == {"OMP_NUM_THREADS": "1", "A": "b=c"}
    for bad in (["--frontends", "torchserve,nginx"], ["--asgi-env", "OMP_NUM_THREADS"]):
        with pytest.raises(SystemExit):
            frontends.parse_args(bad)
    s = frontends.suite_setup(frontends.parse_args(["--workdir", str(tmp_path), "--concurrent-rounds", "3"]))
    assert [x.name for x in s.plan.loads][:2] == ["synchronous", "concurrent@8"]
    assert sorted(s.plan.fractions.values()) == [0.5, 0.7]  # P4's and P3's loads, no sweep
    assert s.configs["continuous"]["scheduler"]["mode"] == "continuous"
    assert frontends.static_config(s)["scheduler"] == {"mode": "static", "n_slots": 8}
