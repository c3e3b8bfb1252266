"""`make bench`'s P9 stage: scripts/bench/constrained.py run by the suite in its own process, on the
tiny tokenizer, its report in the tables and P9 the last line. No timing is asserted."""

from __future__ import annotations

import json

from scripts.bench import suite as bench_suite
from tests.support.bench import P9_LINE, SUITE_LINE


def test_the_suite_stages_p9_and_prints_it_last(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """`make bench`'s wiring with no scheduler mode and no replicas: the real script in its own
    process (on the tiny tokenizer, briefly), its report in the tables, P9 the last line."""
    real = bench_suite.run_constrained
    tiny = ["--llama3-tokenizer", str(tiny_model_dir), "--rows", "2", "--generations", "2", "--repeats", "1"]
    tiny += ["--sampler-steps", "100", "--sampler-repeats", "1"]
    monkeypatch.setattr(bench_suite, "run_constrained", lambda workdir: real(workdir, tiny))
    monkeypatch.setattr(bench_suite.bench_sampling, "measure", lambda **_: [])  # no P8: tested elsewhere
    out = tmp_path / "bench-sim"
    argv = ["--out", str(out), "--workdir", str(tmp_path), "--modes", "none", "--no-replicas", "--des-requests", "0"]
    bench_suite.main(argv)

    text = capsys.readouterr().out
    assert "constrained decoding per step (scripts/bench/constrained.py): 2 rows x 512" in text
    assert P9_LINE.search(text) and "not P9's vocabulary" in text
    assert SUITE_LINE.fullmatch(text.strip().splitlines()[-1])
    meta = json.loads(out.with_suffix(".json").read_text())["meta"]
    assert set(meta["ratios"]) == {"P9"} and meta["ratios"]["P9"] == meta["constrained"]["p9"]
    figures = meta["constrained"]
    assert figures["vocab"] == tiny_model_dir.name and figures["rows"] == 2
    assert figures["outputs"] >= 2 and figures["valid"] == figures["outputs"]

    assert bench_suite.main(argv + ["--no-constrained"]) is None
    assert "P9" not in capsys.readouterr().out
