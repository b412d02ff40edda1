"""Tests for sample.py and lab/real_words.py on tiny models trained once, in this process, on
the made-up plays. Run: python -m pytest -q tests/test_sample.py"""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import configurator
import data
import sample
import train
from conftest import TINY
from configurator import ConfigError
from lab import real_words
from model import VALUE_MODES, GPTConfig

ROOT = Path(__file__).resolve().parent.parent  # the repository root
SEPARATOR = "\n---------------\n"  # what sample.py prints after each sample


@pytest.fixture(scope="module")
def runs(plays, tmp_path_factory):
    """A run of each value mode on the plays: runs/<mode>/; svformer trained 20 steps, the
    others 5."""
    root = tmp_path_factory.mktemp("runs")
    for mode in VALUE_MODES:
        train.main([f"--dataset={plays}", f"--out_dir={root / mode}", f"--value_mode={mode}",
                    f"--max_iters={20 if mode == 'svformer' else 5}", *TINY])
    return root


def sampled(capsys, out_dir, *argv):
    """sample.sample on the CPU with these settings: (the texts, stdout, stderr)."""
    texts = sample.sample(configurator.parse_args(
        sample.SETTINGS, [f"--out_dir={out_dir}", "--device=cpu", *argv], ""))
    out, err = capsys.readouterr()
    return texts, out, err


def test_samples_are_printed_whole_and_repeatable_by_seed(runs, capsys):
    """num_samples texts, each followed by the separator line; the same seed prints the same
    text, another seed another; at temperature 0 (greedy) every sample is the same."""
    argv = ["--num_samples=3", "--max_new_tokens=20", "--top_k=0"]
    texts, out, _ = sampled(capsys, runs / "svformer", "--seed=7", *argv)
    assert len(texts) == 3 and out == "".join(text + SEPARATOR for text in texts)
    assert len(set(texts)) == 3  # one seed a run, not one a sample
    assert sampled(capsys, runs / "svformer", "--seed=7", *argv)[1] == out
    assert sampled(capsys, runs / "svformer", "--seed=8", *argv)[1] != out
    texts, out, _ = sampled(capsys, runs / "svformer", "--temperature=0", *argv)
    assert len(texts) == 3 and len(set(texts)) == 1 and out == 3 * (texts[0] + SEPARATOR)


@pytest.mark.parametrize("mode", VALUE_MODES)
def test_cached_and_uncached_greedy_text_are_equal(runs, capsys, mode):
    """The KV cache changes the speed, never the text: a prompt of 4 tokens and 30 new ones run
    past block_size 16, so the cache is refilled from the cropped context too."""
    argv = ["--temperature=0", "--max_new_tokens=30", "--start=KING", "--num_samples=1"]
    cached, out, err = sampled(capsys, runs / mode, *argv)
    uncached, out_uncached, err_uncached = sampled(capsys, runs / mode, *argv, "--use_cache=False")
    assert out == out_uncached and len(cached) == 1 and cached[0].startswith("KING")
    assert f"{mode}, cache on" in err and f"{mode}, cache off" in err_uncached


@pytest.mark.parametrize("mode, tensors", [("svformer", "2 key + 1 value"),
                                           ("vanilla", "2 key + 2 value")])
def test_the_report_gives_the_speed_and_the_cache_against_vanillas(runs, capsys, mode, tensors):
    """stderr: the checkpoint loaded, then tokens/s and the KV cache's bytes against a vanilla
    cache's: SVFormer's holds L keys and one value tensor, (L+1)/(2L) = 0.750 of vanilla's."""
    ckpt = data.load_checkpoint(str(runs / mode / "ckpt.pt"))
    config = GPTConfig.from_dict(ckpt["model_args"])
    tensor = config.kv_heads * config.block_size * config.head_dim * 4  # float32 bytes
    L = config.n_layer
    _, out, err = sampled(capsys, runs / mode, "--num_samples=2", "--max_new_tokens=10")
    loaded, report = err.splitlines()
    assert loaded == (f"{runs / mode}/ckpt.pt: {mode}, step {ckpt['iter_num']}, val loss "
                      f"{ckpt['val_loss']:.4f}")
    cache = (L + 1) * tensor if mode == "svformer" else 2 * L * tensor
    assert re.fullmatch(
        rf"{mode}, cache on, cpu float32: 20 tokens in [\d.]+ s, [\d.]+ tokens/s; a KV cache of "
        rf"16 positions holds {cache:,} bytes \({re.escape(tensors)} tensors\), a vanilla one "
        rf"{2 * L * tensor:,} \(ratio {cache / (2 * L * tensor):.3f}\)", report), report
    assert L == 2 and ("(ratio 0.750)" if mode == "svformer" else "(ratio 1.000)") in report


def test_mistakes_are_one_line(runs, tmp_path):
    """No checkpoint names the train command; the weights of another model.py (a tensor
    today's has not) say so."""
    with pytest.raises(data.DataError) as e:
        sample.main([f"--out_dir={tmp_path / 'none'}", "--device=cpu"])
    assert str(e.value) == (f"no checkpoint at {tmp_path / 'none'}/ckpt.pt: train one first, "
                            f"e.g. python train.py --out_dir={tmp_path / 'none'}")
    ckpt = torch.load(runs / "vanilla" / "ckpt.pt", weights_only=True)
    ckpt["model"]["transformer.h.0.attn.extra"] = torch.zeros(1)
    (tmp_path / "edited").mkdir()
    torch.save(ckpt, tmp_path / "edited" / "ckpt.pt")
    with pytest.raises(ConfigError) as e:
        sample.main([f"--out_dir={tmp_path / 'edited'}", "--device=cpu"])
    assert str(e.value) == (f"{tmp_path / 'edited'}/ckpt.pt: it does not fit today's model.py "
                            f"(transformer.h.0.attn.extra): other code trained it")


def test_a_bad_setting_exits_1_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "sample.py"), "--temperature=-1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (1, "") and done.stderr.count("\n") == 1
    assert done.stderr.startswith("error: --temperature=-1.0: must be from 0.0 to inf (")


def test_real_words_share_of_a_known_text(plays, tmp_path):
    """Words are runs of letters, any case: of king, lear, says, what, ships, the, ships, the,
    ships, the plays' training text holds 7 (king, what, the, ships), 4 of the 6 distinct."""
    byte = data.get_tokenizer("byte")
    text = "King Lear says: what ships? The 3 ships, the SHIPS!"
    assert real_words.real_words(plays, byte, text) == ((7 / 9, 4 / 6), 9)
    assert real_words.real_words(str(tmp_path / "gone"), byte, text) == (
        None, f"the training text ({tmp_path / 'gone'}) is not here")


def test_real_words_of_a_runs_samples(runs, capsys, tmp_path):
    """python -m lab.real_words OUT_DIR SAMPLES.txt: the share in sample.py's output, for the
    training text the checkpoint names."""
    _, out, _ = sampled(capsys, runs / "svformer", "--num_samples=2", "--max_new_tokens=60")
    (tmp_path / "samples.txt").write_text(out, encoding="utf-8")
    real_words.main([str(runs / "svformer"), str(tmp_path / "samples.txt")])
    data_dir = data.load_checkpoint(str(runs / "svformer" / "ckpt.pt"))["config"]["dataset"]
    (share, distinct), n = real_words.real_words(data_dir, data.get_tokenizer("byte"), out)
    assert n > 0 and capsys.readouterr().out == (
        f"real words: {share:.1%} of the {n:,} sampled words occur in the training text of "
        f"{data_dir} ({distinct:.1%} of the distinct ones)\n")
