"""lab.stamp: a record made before runs knew their code gets today's probe only where today's
code, trained again, logs the record's losses; with --steps=N only the first N steps count."""
import contextlib
import io
import json

import pytest

import compare
from configurator import ConfigError
from lab import stamp
from test_compare import TINY, data_dir  # noqa: F401 (the fixture the tiny comparison uses)


@pytest.fixture
def old_records(data_dir, tmp_path):  # noqa: F811
    """Two vanilla runs of 4 steps as an older version left them: summaries with no probe."""
    out = tmp_path / "cmp"
    with contextlib.redirect_stdout(io.StringIO()):
        assert compare.main(TINY + [f"--dataset={data_dir}", f"--out_dir={out}", "--seeds=1,2",
                                    "--modes=vanilla", "--noise_floor=0", "--max_iters=4",
                                    "--lr_decay_iters=4"]) == 0
    summaries = sorted(out.glob("*/summary.json"))
    assert len(summaries) == 2
    for path in summaries:
        record = json.loads(path.read_text())
        assert record.pop("probe")
        path.write_text(json.dumps(record))
    return out, summaries


def change_loss(run_dir, at_iter):
    """The record's logged training loss at one step, moved as other code would move it."""
    log = run_dir / "log.jsonl"
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    for entry in entries:
        if entry["kind"] == "train" and entry["iter"] == at_iter:
            entry["loss"] += 0.01
            break
    else:
        raise AssertionError(f"no training line at step {at_iter}")
    log.write_text("".join(json.dumps(e) + "\n" for e in entries))


def probes(summaries):
    return [json.loads(p.read_text()).get("probe") for p in summaries]


def test_records_that_today_s_code_reproduces_are_stamped(old_records, capsys):
    out, summaries = old_records
    stamp.stamp([str(out)], steps=2)
    assert all(probes(summaries))
    assert "every loss equal; stamped: 2 run(s)" in capsys.readouterr().out
    assert not list(out.glob("*.check"))  # the run trained again is gone once it agreed


def test_a_loss_that_differs_within_the_steps_is_refused(old_records, capsys):
    out, summaries = old_records
    first = summaries[0].parent  # the run of the first seed is the one trained again
    change_loss(first, at_iter=1)
    stamp.stamp([str(out)], steps=2)
    assert probes(summaries) == [None, None]
    assert "the losses DIFFER; not stamped: 2 run(s)" in capsys.readouterr().out
    assert (out / (first.name + ".check") / "log.jsonl").exists()  # kept to look at


def test_steps_bounds_what_is_compared(old_records, capsys):
    """A difference after step N is not looked at with --steps=N, and is without it."""
    out, summaries = old_records
    change_loss(summaries[0].parent, at_iter=4)
    stamp.stamp([str(out)], steps=2)
    assert all(probes(summaries))
    for path in summaries:
        record = json.loads(path.read_text())
        del record["probe"]
        path.write_text(json.dumps(record))
    stamp.stamp([str(out)])
    assert probes(summaries) == [None, None]
    assert capsys.readouterr().out.count("DIFFER") == 1


def test_a_bad_steps_value_is_one_line():
    with pytest.raises(ConfigError, match=r"--steps=abc: a whole number of steps"):
        stamp.main(["--steps=abc", "somewhere"])
