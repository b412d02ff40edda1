"""lab.stamp: records that REV's code trained get today's code version only where REV's code and
today's, both trained again here, log every loss equal; otherwise nothing is stamped."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest

import compare
from configurator import ConfigError
from conftest import TINY, run_in_process
from lab import plots, runs, stamp

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def trained(plays, tmp_path_factory):
    """Two vanilla runs of 6 steps (seeds 1 and 2), compared in this process."""
    out = tmp_path_factory.mktemp("stamp") / "cmp"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runs, "launch", run_in_process)
        patch.setattr(runs, "time", types.SimpleNamespace(time=lambda: 0.0, sleep=lambda s: None))
        patch.setattr(plots, "write_all", lambda *args, **kwargs: [])
        assert compare.main([str(ROOT / "config" / "quickstart.py"), *TINY, "--max_iters=6",
                             "--eval_interval=3", f"--dataset={plays}", f"--out_dir={out}",
                             "--seeds=1,2", "--modes=vanilla", "--noise_floor=0",
                             "--analysis_samples=2", "--jobs=2"]) == 0
    return out


@pytest.fixture
def records(trained, tmp_path, monkeypatch):
    """The runs as a campaign commits them (summary.json, log.jsonl), each summary without its
    code version: records made before runs recorded their code. Temporary folders go here."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = tmp_path / "records"
    for run in ("vanilla_seed1", "vanilla_seed2"):
        (folder / run).mkdir(parents=True)
        shutil.copy(trained / run / "log.jsonl", folder / run)
        summary = json.loads((trained / run / "summary.json").read_text())
        del summary["code"]
        (folder / run / "summary.json").write_text(json.dumps(summary))
    return folder


def codes(folder):
    return [json.loads(p.read_text()).get("code") for p in sorted(folder.glob("*/summary.json"))]


def test_records_that_revs_code_and_todays_train_alike_are_stamped(records, capsys):
    """REV = HEAD, whose code is today's but for the working tree's edits: both check runs log
    every loss equal, so the records without a code version get today's."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    stamp.stamp([str(records)], head, steps=4)
    assert ("vanilla_seed1 and 1 other record(s) of its settings: trained again to step 4 by "
            "REV's code and today's: every loss equal: stamped") in capsys.readouterr().out
    assert codes(records) == [runs.code_version()] * 2


def test_an_lr_edit_in_the_loop_changes_the_losses_and_nothing_is_stamped(records, tmp_path):
    """In a clone whose train.py scales the lr inside its loop (not committed), REV = HEAD's
    code and the clone's log other losses: `python -m lab.stamp` stamps nothing."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    source = (clone / "train.py").read_text()
    loop = 'group["lr"] = lr * group["lr_scale"]'
    assert source.count(loop) == 1
    (clone / "train.py").write_text(source.replace(loop, 'group["lr"] = lr / 2 * group["lr_'
                                                         'scale"]'))
    # A clone has no data/ (it is not committed) until prepare.py runs; lab.stamp lists it.
    (clone / "data").mkdir()
    done = subprocess.run([sys.executable, "-m", "lab.stamp", "--from=HEAD", "--steps=4",
                           str(records)], cwd=clone, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "vanilla_seed1 and 1 other record(s) of its settings: trained again to step 4 by " \
           "REV's code and today's: the losses DIFFER: not stamped" in done.stdout
    assert codes(records) == [None, None]


def test_a_revision_that_is_not_there_is_one_line(records):
    with pytest.raises(ConfigError) as error:
        stamp.main(["--from=no-such-revision", str(records)])
    said = str(error.value)
    assert said.startswith("--from=no-such-revision: not a revision of this repository (")
    assert "\n" not in said and codes(records) == [None, None]
    with pytest.raises(ConfigError, match="^name the revision whose code trained the records"):
        stamp.main([str(records)])
