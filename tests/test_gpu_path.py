"""The GPU path without a GPU (issues 64, 69): lab.evaluate's chunked whole-split loss, lab.memory's
batches and its estimate against a CPU's measured peak, lab.fineweb's download (the hub faked),
the GPU presets' numbers, MFU, what each device gets, bench.py and its --gpu_check, each on the
CPU at a tiny size, with mocks where a card's memory or name matters, and a fault planted in each
of the check's parts. The one slow test runs the GPU check's commands (about 40 s)."""
import ast
import contextlib
import io
import json
import os
import shutil
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import bench
import compare
import configurator
import data
import train
from conftest import TINY
from lab import cards, evaluate, fineweb, gpu_check, memory
from lab.analysis import LOGIT_TOLERANCE
from lab.grid import parse_modes
from model import GPT, VALUE_MODES, GPTConfig, KVCache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_CLASS, GPT2 = (os.path.join(ROOT, "config", f"{n}.py") for n in ("gpu_class", "gpt2_124m"))
SHAPE = {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "batch_size": 4}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """config/gpu_class.py's training settings at a tiny shape, 4 steps on 800 random GPT-2
    ids (a padded vocabulary of 50,304), and train.py's clock saying the first step took 1,000
    s (as compiling does, a little): (out_dir, what it printed)."""
    root = tmp_path_factory.mktemp("gpu_class")
    dataset = gpu_check.synthetic_dataset(str(root / "data"), 800)
    settings = {k: v for k, v in configurator.read_preset(GPU_CLASS).items() if k in train.SETTINGS}
    settings.update(SHAPE, dataset=dataset, out_dir=str(root / "run"), max_iters=4,
                    eval_interval=2, eval_iters=2, log_interval=2, compile=False, device="cpu")
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        compiled, step = [0.0], train.training_step
        mp.setattr(train, "time", SimpleNamespace(time=lambda: time.time() + compiled[0]))
        mp.setattr(train, "training_step", lambda *a: compiled.__setitem__(0, 1e3) or step(*a))
        train.main([f"--{k}={v}" for k, v in settings.items()])
    return settings["out_dir"], printed.getvalue()


def log_of(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


# ---- lab.evaluate: every token of the split once, LOGITS_AT_ONCE logits at a time ----

def test_split_loss_in_chunks_is_the_cross_entropy_of_every_window_once(monkeypatch):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=64)).eval()
    rng = np.random.default_rng(0)
    shards = [rng.integers(0, 64, n).astype(np.uint16) for n in (100, 37, 17, 2)]
    rows = []
    model.lm_head.register_forward_hook(lambda module, args, out: rows.append(len(out)))
    by_hand, tokens = 0.0, 0
    with torch.no_grad():
        for t in shards:
            for s in range(0, len(t) - 1, 16):
                w = torch.from_numpy(t[s:s + 17].astype(np.int64))[None]
                by_hand += model(w[:, :-1], w[:, 1:])[1].item() * (w.size(1) - 1)
                tokens += w.size(1) - 1
    assert tokens == sum(len(t) - 1 for t in shards)  # Each shard's first token is no target.
    results = {}
    for at_once, batch in ((2**40, 100), (64 * 5, 3), (64 * 5, 1)):
        monkeypatch.setattr(evaluate, "LOGITS_AT_ONCE", at_once)
        rows.clear()
        results[at_once, batch] = evaluate.split_loss(model, shards, batch,
                                                      contextlib.nullcontext())
        assert sum(rows) == tokens and max(rows) <= at_once // 64
    assert max(rows) == 5 and len(rows) > 2 * len(shards)  # Each batch ran in chunks.
    for loss, n in results.values():
        assert n == tokens and loss == pytest.approx(by_hand / tokens, abs=1e-6)


def test_the_pass_at_gpt2s_vocabulary_never_holds_more_than_logits_at_once(monkeypatch):
    """32 x 1,024 tokens a batch at 50,304 ids would be 6.1 GiB of logits at once: lm_head is
    given at most LOGITS_AT_ONCE // 50,304 tokens at a time, every token once. (The logits and
    their loss are stand-ins of the real shape: only the sizes matter here, not 32 GFLOPs.)"""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=1024, vocab_size=50304))
    shard = np.random.default_rng(0).integers(0, 50257, 40_000).astype(np.uint16)
    sizes = []
    monkeypatch.setattr(model.lm_head, "forward", lambda h: h.new_empty(len(h), 50304))
    model.lm_head.register_forward_hook(lambda module, args, out: sizes.append(out.shape))
    monkeypatch.setattr(evaluate, "F", SimpleNamespace(
        cross_entropy=lambda logits, targets, reduction: logits.new_zeros(())))
    evaluate.split_loss(model, [shard], 32, contextlib.nullcontext())
    assert max(rows * vocab for rows, vocab in sizes) <= evaluate.LOGITS_AT_ONCE
    assert sum(rows for rows, _ in sizes) == 39_999 and len(sizes) > 32 * 1024 * 50304 // 2**25


def test_evaluate_writes_one_final_entry_and_prints_the_loss(run, capsys):
    """python -m lab.evaluate --out_dir=DIR, twice and with another --batch_size: one "final"
    entry for the step, the rest of the log as train.py wrote it, the same loss to 1e-6."""
    out_dir, _ = run
    trained = [e for e in log_of(out_dir) if e["kind"] != "final"]
    val = [s["tokens"] for s in data.load_meta(os.path.join(os.path.dirname(out_dir), "data"))[
        "shards"] if s["split"] == "val"]
    losses = []
    for argv in ([], [], ["--batch_size=3"]):
        evaluate.main([f"--out_dir={out_dir}", *argv])
        log = log_of(out_dir)
        assert log[:-1] == trained and log[-1]["kind"] == "final" and log[-1]["iter"] == 4
        final = log[-1]
        assert final["val_tokens"] == sum(val) - len(val)  # Each shard's first is no target.
        printed = capsys.readouterr().out
        assert printed.count("\n") == 1 and out_dir in printed and "step 4" in printed
        assert f"({final['val_tokens']:,} tokens): {final['val_loss_full']:.4f}" in printed
        losses.append(final["val_loss_full"])
    assert losses[0] == losses[1] and losses[2] == pytest.approx(losses[0], abs=1e-6)


# ---- lab.memory: the batch that fits a card, and a step's peak ----

def test_the_gpu_class_keeps_16_x_4_on_a_16_gb_card_in_vanilla_and_value_embed():
    """Vanilla and value embeddings (the preset's largest variant: 116M parameters more) at the
    preset's real size (weights left uninitialised: only their bytes count) fit a T4 at the
    preset's batch, the estimate under HEADROOM of the card."""
    cfg = configurator.parse_args(compare.SETTINGS, [GPU_CLASS], "")
    free = memory.CARDS[16] * 2**30
    variants = dict(parse_modes(cfg.modes))
    for name in ("vanilla", "value_embed"):
        overrides = variants[name]
        with torch.device("meta"):
            model = GPT(GPTConfig.from_dict({**vars(cfg), **overrides, "vocab_size": 50304}))
        model.to_empty(device="cpu")
        model.transformer.wte.weight = model.lm_head.weight  # to_empty untied them.
        batch, accum, need, _ = memory.fit(model, cfg, free)
        assert (batch, accum) == (16, 4) and need <= memory.HEADROOM * free, name


def test_a_batch_too_big_is_halved_with_the_same_tokens_a_step_or_does_not_fit():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=320))
    cfg = SimpleNamespace(batch_size=16, gradient_accumulation_steps=4, block_size=64)
    peak = memory.step_peak(model, 64)
    room_for_8 = peak(8 * 64) / memory.HEADROOM + 1
    batch, accum, need, _ = memory.fit(model, cfg, room_for_8)
    assert (batch, accum) == (8, 8) and need <= memory.HEADROOM * room_for_8
    assert memory.fit(model, cfg, 2**40)[:2] == (16, 4)
    assert memory.fit(model, cfg, peak(64) / 2) is None  # Not even one sequence fits.


def test_the_cpus_measure_of_a_peak_sums_each_allocation_and_free():
    def step():
        a = torch.empty(2**20, dtype=torch.uint8)
        del a
        b, c = torch.empty(2**21, dtype=torch.uint8), torch.empty(2**20, dtype=torch.uint8)
        return b, c
    assert memory.measured_peak(step, "cpu") == 3 * 2**20


def measured_step(model, batch, block_size, dtype="bfloat16"):
    """A training step's peak on this CPU: the weights and AdamW's moments held before it (a
    first step makes the moments), and the most the step adds, as torch.profiler records it."""
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95))
    x = torch.randint(model.config.vocab_size, (batch, block_size))
    amp = data.setup_device("cpu", dtype)[2], torch.amp.GradScaler("cpu", enabled=False)
    batches = SimpleNamespace(next=lambda: (x, x))
    train.training_step(model, optimizer, batches, 1, 1.0, amp)
    held = sum(t.nbytes for t in [*model.parameters(), *(
        v for s in optimizer.state.values() for v in s.values())])
    return held + memory.measured_peak(
        lambda: train.training_step(model, optimizer, batches, 1, 1.0, amp), "cpu")


@pytest.mark.parametrize("mode,vocab,n_embd,batch,block_size", [
    ("vanilla", 4096, 64, 8, 128),  # The logits and activations make the peak.
    ("value_embed", 50304, 16, 4, 32),  # The logits of GPT-2's vocabulary.
    ("value_embed", 50304, 64, 1, 8),  # The parameters: 16 bytes each, the least a step holds.
])
def test_the_estimate_is_within_10_percent_of_a_training_steps_peak_on_this_cpu(
        mode, vocab, n_embd, batch, block_size):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=n_embd, block_size=block_size,
                          vocab_size=vocab, value_mode=mode))
    peak = measured_step(model, batch, block_size)
    assert memory.step_peak(model, block_size)(batch * block_size) == pytest.approx(peak, rel=0.1)


def test_the_logits_held_through_the_backward_are_in_the_estimate():
    """training_step holds a micro-step's logits (2 bytes each in bf16) until it returns: left
    out, the estimate falls short of the measured peak by more than 10%."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=50304))
    peak, estimate = measured_step(model, 4, 32), memory.step_peak(model, 32)(4 * 32)
    assert estimate == pytest.approx(peak, rel=0.02)
    assert estimate - 2 * 50304 * 4 * 32 < 0.9 * peak


def test_python_m_lab_memory_prints_the_table_for_a_16_gb_card(tmp_path, capsys):
    """The mechanics at a small width (the preset's batch, block and variants kept)."""
    memory.main([GPU_CLASS, "--gpu_memory=16", "--n_layer=1", "--n_head=2", "--n_embd=16",
                 f"--dataset={tmp_path / 'none'}"])
    out = capsys.readouterr().out
    assert "32,768 tokens a step as the preset asks (16 x 4 at block_size 512)" in out
    assert "| variant | 16 GB |" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "GiB" in line]
    assert len(rows) == 5 and all("| 16 x 4 (" in row for row in rows)


# ---- lab.fineweb: the shards a preset reads, downloaded whole through huggingface_hub ----

def test_shards_needed_by_each_preset_and_the_dataset_it_names():
    """Each preset names the dataset lab.fineweb writes for the shards it reads."""
    assert fineweb.shards_needed(GPT2) == (99, 19073 * 524_288)  # 10B tokens: all 99.
    assert fineweb.shards_needed(GPU_CLASS) == (1, 1500 * 32_768)
    for preset in (GPT2, GPU_CLASS):
        named = configurator.read_preset(preset)["dataset"]
        out_dir = fineweb.SETTINGS["out_dir"][0]
        assert data.dataset_dir(named) == fineweb.dataset_dir(out_dir,
                                                              fineweb.shards_needed(preset)[0])
    assert fineweb.dataset_dir("data/fineweb_edu_gpt2", 1) == "data/fineweb_edu_gpt2_1shard"


@pytest.fixture
def hub(monkeypatch):
    """huggingface_hub.hf_hub_download faked, with made-up llm.c shards: each written whole into
    local_dir; hub.cut's first half only (a connection that closed cleanly half way); hub.lost
    raising as a connection reset does."""
    import huggingface_hub
    rng = np.random.default_rng(0)
    hub = SimpleNamespace(files={}, asked=[], cut=None, lost=None)
    for name, n in (("finewebedu_val_000000.bin", 300), ("finewebedu_train_000001.bin", 500),
                    ("finewebedu_train_000002.bin", 400)):
        ids = rng.integers(0, 50257, n).astype("<u2")
        hub.files[name] = (ids, np.array([20240520, 1, n] + [0] * 253, "<i4").tobytes()
                           + ids.tobytes())

    def hf_hub_download(repo_id, filename, repo_type, local_dir):
        assert (repo_id, repo_type) == ("kjj0/finewebedu10B-gpt2", "dataset")
        hub.asked.append(filename)
        if filename == hub.lost:
            raise ConnectionResetError("connection reset by peer\n(and more lines)")
        body = hub.files[filename][1]
        with open(os.path.join(local_dir, filename), "wb") as f:
            f.write(body[:len(body) // 2] if filename == hub.cut else body)
        return os.path.join(local_dir, filename)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    monkeypatch.setattr(fineweb, "VAL_TOKENS", 100)
    return hub


def test_download_writes_the_shards_and_a_dataset_that_names_them(hub, tmp_path, capsys):
    out = tmp_path / "fineweb_edu_gpt2"
    dataset = fineweb.download(str(out), 2)
    assert dataset == f"{out}_2shards" and hub.asked == list(hub.files)
    val = out / "finewebedu_val_000000_first100.bin"  # The speedrun's scored first tokens.
    assert val.stat().st_size == 1024 + 2 * 100
    shards, meta = data.load_dataset(dataset)
    assert [s["file"] for s in meta["shards"]] == [os.path.join("..", "fineweb_edu_gpt2", name)
                                                   for name in (val.name, *list(hub.files)[1:])]
    assert np.array_equal(shards["val"][0], hub.files["finewebedu_val_000000.bin"][0][:100])
    assert [np.array_equal(s, hub.files[f"finewebedu_train_00000{i}.bin"][0])
            for i, s in enumerate(shards["train"], 1)] == [True, True]
    assert (meta["tokenizer"], meta["train_tokens"], meta["val_tokens"]) == ("gpt2", 900, 100)
    assert data.padded_vocab(meta) == 50304
    assert "next: python train.py --dataset=fineweb_edu_gpt2_2shards\n" in capsys.readouterr().out


def test_a_smaller_preset_drops_no_shard_and_a_runs_tokens_never_depend_on_what_came_before(
        hub, tmp_path):
    """One shard, then two, then one again: the files stay, each dataset names its own count,
    and the one-shard dataset reads the same tokens throughout."""
    out = str(tmp_path / "fineweb_edu_gpt2")
    with contextlib.redirect_stdout(io.StringIO()):
        one = fineweb.download(out, 1)
        before = data.load_meta(one)
        two = fineweb.download(out, 2)
        fineweb.download(out, 1)
    assert data.load_meta(one) == before and len(before["shards"]) == 2
    assert [s["split"] for s in data.load_meta(two)["shards"]] == ["val", "train", "train"]
    assert len(os.listdir(out)) == 4 and hub.asked == list(hub.files)  # Each file once.


def test_a_shard_cut_short_is_fetched_again_by_the_same_command(hub, tmp_path):
    """A connection that closes cleanly half way: the part is not kept, the error says to run
    the command again, and that command fetches it whole; a cut shard already there (an older
    download's) is fetched again too."""
    out, argv = tmp_path / "fw", [f"--out_dir={tmp_path / 'fw'}", "--train_shards=2"]
    hub.cut = "finewebedu_train_000001.bin"
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(data.DataError) as cut:
        fineweb.main(argv)
    assert str(cut.value) == ("finewebedu_train_000001.bin came cut short: run the same "
                              "command again")
    assert not (out / hub.cut).exists()
    hub.cut, hub.asked = None, []
    whole = hub.files["finewebedu_train_000002.bin"][1]
    (out / "finewebedu_train_000002.bin").write_bytes(whole[:len(whole) // 2])
    with contextlib.redirect_stdout(io.StringIO()):
        fineweb.main(argv)
    assert hub.asked == ["finewebedu_train_000001.bin", "finewebedu_train_000002.bin"]
    assert data.load_meta(f"{out}_2shards")["train_tokens"] == 900


def test_a_lost_connection_keeps_the_files_before_it_and_the_same_command_goes_on(hub,
                                                                                 tmp_path):
    out, argv = tmp_path / "fw", [f"--out_dir={tmp_path / 'fw'}", "--train_shards=1"]
    hub.lost = "finewebedu_train_000001.bin"
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(data.DataError) as lost:
        fineweb.main(argv)
    assert str(lost.value) == ("could not download finewebedu_train_000001.bin "
                               "(ConnectionResetError: connection reset by peer): run the same "
                               "command again")
    assert sorted(os.listdir(out)) == ["finewebedu_val_000000.bin",
                                       "finewebedu_val_000000_first100.bin"]
    assert not os.path.exists(f"{out}_1shard")  # No dataset names a missing shard.
    hub.lost, hub.asked = None, []
    with contextlib.redirect_stdout(io.StringIO()):
        fineweb.main(argv)
    assert hub.asked == ["finewebedu_train_000001.bin"]
    assert data.load_meta(f"{out}_1shard")["train_tokens"] == 500


def test_without_huggingface_hub_the_download_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # Its import fails.
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(data.DataError) as missing:
        fineweb.download(str(tmp_path / "fw"), 1)
    assert str(missing.value) == ("lab.fineweb downloads through huggingface_hub: pip install "
                                  "huggingface_hub")


# ---- the presets' numbers, MFU and peak memory ----

def test_the_gpu_class_takes_32768_tokens_a_step_and_49m_a_run_from_one_shard(tmp_path,
                                                                            capsys):
    """1,500 steps of 16 x 512 x 4 tokens read 49M tokens: one 100M shard holds them (no note);
    a smaller training split is seen more than once, and the start line says so."""
    p = configurator.read_preset(GPU_CLASS)
    assert p["batch_size"] * p["gradient_accumulation_steps"] * p["block_size"] == 32_768
    cfg = configurator.parse_args(train.SETTINGS, [
        f"--{k}={v}" for k, v in p.items() if k in train.SETTINGS] + [f"--out_dir={tmp_path}"], "")
    record = dict(tokens_per_step=32_768, num_params=1, device="cuda", dtype="bfloat16")
    train.start_run(cfg, None, {**record, "train_tokens": 100_000_000})
    assert capsys.readouterr().out.endswith("in bfloat16, 32,768 tokens a step\n")
    train.start_run(cfg, None, {**record, "train_tokens": 40_000_000})
    assert capsys.readouterr().out.endswith(
        "\nnote: the run reads its 40,000,000 training tokens 1.23 times\n")


def test_the_tiny_gpu_class_run_says_it_rereads_its_data_and_logs_its_speed(run):
    """The speed of the steps after the first (on a GPU, compiling): of the training alone."""
    out_dir, printed = run
    assert "256 tokens a step\nnote: the run reads its 800 training tokens 1.28 times\n" in printed
    ckpt = data.load_checkpoint(os.path.join(out_dir, "ckpt.pt"))
    steps = [e for e in log_of(out_dir) if e["kind"] == "train"]
    assert [e["iter"] for e in steps] == [2, 4]
    assert max(e["ms_per_step"] for e in steps) < 1e5  # Step 1's 1,000 s is not in.
    for e in steps:  # the speed, from which the lab's MFU is the model's FLOPs over the peak
        assert e["tokens_per_sec"] == pytest.approx(ckpt["tokens_per_step"] * 1000
                                                    / e["ms_per_step"], rel=1e-6)
        assert f"iter {e['iter']}/4: loss {e['loss']:.4f}" in printed
    assert ckpt["flops_per_token"] == GPT.from_checkpoint(ckpt).flops_per_token(16)


@pytest.mark.parametrize("card,dtype,peak", [
    ("NVIDIA H100 80GB HBM3", "bfloat16", "H100"), ("NVIDIA H100 NVL", "bfloat16", "H100 NVL"),
    ("NVIDIA H100 PCIe", "float16", "H100 PCIe"), ("NVIDIA A100-SXM4-80GB", "bfloat16", "A100"),
    ("NVIDIA A10", "bfloat16", "A10"), ("NVIDIA A10G", "bfloat16", "A10G"),
    ("Tesla T4", "float16", "T4"), ("NVIDIA L40S", "bfloat16", "L40S"),
    ("NVIDIA A100-SXM4-80GB", "float32", None), ("Some Future GPU", "bfloat16", None),
])
def test_the_peak_behind_mfu_is_found_by_the_cards_name(monkeypatch, card, dtype, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: card)
    assert cards.peak_flops("cuda", dtype) == (peak and cards.PEAK_FLOPS[peak])
    assert cards.peak_flops("cpu", "bfloat16") is None


@pytest.mark.parametrize("card", ["NVIDIA L40", "NVIDIA RTX A1000", "NVIDIA T400"])
def test_a_card_not_listed_gets_no_peak_though_a_listed_name_is_in_its_own(monkeypatch, card):
    """peak_flops' docstring: None "for another card". An L40 is no L4, an RTX A1000 no A100, a
    T400 no T4: a peak by substring gives them another card's MFU."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: card)
    assert cards.peak_flops("cuda", "bfloat16") is None


# ---- setup_device: what auto picks on each device ----

@pytest.mark.parametrize("card,native_bf16,mps,expected", [
    ("NVIDIA A100-SXM4-80GB", True, False, ("cuda", "bfloat16")),
    ("Tesla T4", False, False, ("cuda", "float16")),  # Emulated bf16 does not count.
    (None, False, True, ("mps", "float32")), (None, False, False, ("cpu", "float32")),
])
def test_auto_picks_each_devices_native_precision(monkeypatch, card, native_bf16, mps, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: card is not None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(card is not None))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: card)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",  # torch's default counts emulation.
                        lambda including_emulation=True: native_bf16 or including_emulation)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    device, dtype, autocast = data.setup_device("auto", "auto")
    assert (device, dtype) == expected
    assert isinstance(autocast, contextlib.nullcontext) == (dtype == "float32")
    refused = {"cuda:1": "--device=cuda:1: not here; use auto or cpu",
               "float64": "--dtype=float64: use auto, float32, float16 or (not on a T4 or V100)"}
    if card and not native_bf16:
        refused["bfloat16"] = "--dtype=bfloat16: use auto, float32, float16 or (not on a T4"
    if not card:
        refused["cuda"] = "--device=cuda: not here; use auto or cpu"
    for asked, message in refused.items():
        with pytest.raises(configurator.ConfigError) as error:
            data.setup_device(*(("auto", asked) if "float" in asked else (asked, "auto")))
        assert str(error.value).startswith(message) and "\n" not in str(error.value)


# ---- bench.py --gpu_check ----

TINY_RUN = {**SHAPE, "n_layer": 2, "block_size": 32}


def test_the_gpu_check_runs_every_step_on_the_cpu_and_every_row_passes(tmp_path, monkeypatch,
                                                                       capfd):
    """Its real commands at a tiny shape, bf16 standing in for a card's dtype (compile off: on a
    CPU it costs half a minute): PASS on every row that must hold, the MFU rows reported."""
    monkeypatch.setattr(gpu_check, "OUT", str(tmp_path / "out-gpu-check"))
    assert gpu_check.gpu_check("cpu", "bfloat16", {**TINY_RUN, "compile": False}, steps=4,
                               tokens=20_000) == 0
    checks = json.load(open(tmp_path / "out-gpu-check" / "report.json"))["checks"]
    verdicts = [c["verdict"] for c in checks]
    assert verdicts.count("PASS") == 2 + 6 + 1 + 2 + 1 + 1 and verdicts.count("") == 3
    assert checks[-1] == {**checks[-1], "check": "all of the above", "verdict": "PASS"}
    assert [c["measured"] for c in checks if c["check"].startswith("MFU") or "MFU" in
            c["check"]] == ["-, no peak FLOP/s known for this device"] * 3
    assert all(c["seconds"].isdigit() for c in checks if c["seconds"])
    assert sum(int(c["seconds"] or 0) for c in checks[:-1]) <= int(checks[-1]["seconds"]) + 5
    table = capfd.readouterr().out.split("## bench.py --gpu_check on cpu, torch ")[1]
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[3] for row in rows] == [c["verdict"] or "-" for c in checks]


def test_a_wrong_cache_fails_every_cache_row_in_float32_and_in_the_cards_dtype(monkeypatch):
    """Each cached key one position late: float32 past its tolerance, bf16 past 4 times its own
    rounding; SVFormer's bytes are still exact. A cache that keeps a value per layer in every mode
    fails the bytes row."""
    store = KVCache.store

    def keys_one_late(self, layer, k, v):
        keys, values = store(self, layer, k, v)
        return keys.roll(1, dims=2), values
    monkeypatch.setattr(KVCache, "store", keys_one_late)
    rows = gpu_check.cache_rows("cpu", "bfloat16", TINY_RUN)
    assert [row[3] for row in rows] == ["FAIL"] * 5 + ["PASS"]
    for check, measured, tolerance, _ in rows[:5]:
        exact, low = (float(m.split()[1]) for m in measured.split(", "))
        assert exact > LOGIT_TOLERANCE and low > 4 * float(tolerance.rpartition("(")[2][:-1])
    monkeypatch.setattr(KVCache, "store", store)
    monkeypatch.setattr(KVCache, "nbytes", lambda self: 2 * sum(t.nbytes for t in self.keys))
    assert [row[3] for row in gpu_check.cache_rows("cpu", "bfloat16", TINY_RUN)] == [
        "PASS"] * 5 + ["FAIL"]


@pytest.mark.parametrize("off,verdict", [(0.5, "FAIL"), (1, "PASS"), (2, "FAIL")])
def test_an_estimate_2x_off_either_way_fails_the_memory_rows(monkeypatch, off, verdict):
    step_peak = memory.step_peak
    monkeypatch.setattr(memory, "step_peak", lambda *a: lambda tokens: off * step_peak(*a)(tokens))
    rows = gpu_check.memory_rows("cpu", "bfloat16", TINY_RUN)
    assert [row[3] for row in rows] == [verdict, "", verdict, ""]
    assert rows[0][0].startswith("config/gpt2_124m.py, vanilla, eager, bfloat16: peak memory")


def train_in_process(*args):
    """gpu_check.run's stand-in for train.py: this process, seconds rather than a Python each."""
    assert args[0] == "train.py"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        try:
            train.main(list(args[1:]))
        except configurator.UserError:
            return False, printed.getvalue()
    return True, printed.getvalue()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_resume_that_is_not_exact_fails_the_resume_row(plays, tmp_path, monkeypatch, dtype):
    """Exact, in bf16 and in float16 (the loss scaler's path): PASS. AdamW's moments not
    restored: FAIL."""
    monkeypatch.setattr(gpu_check, "OUT", str(tmp_path))
    monkeypatch.setattr(gpu_check, "run", train_in_process)
    argv = [f"--dataset={plays}", f"--dtype={dtype}", *TINY, "--max_iters=4",
            "--eval_interval=2", "--lr_decay_iters=4"]
    assert train_in_process("train.py", *argv, f"--out_dir={tmp_path / 'whole'}")[0]
    row = gpu_check.resume_row("the plays", argv, 4, str(tmp_path / "whole"))
    assert row == ("the plays resumed at step 2", "equal",
                   "the uninterrupted run's train and val losses, 4 decimals", "PASS")
    monkeypatch.setattr(torch.optim.Optimizer, "load_state_dict", lambda self, state: None)
    shutil.rmtree(tmp_path / "resumed-whole")
    assert gpu_check.resume_row("the plays", argv, 4, str(tmp_path / "whole"))[2:] == (
        "the uninterrupted run's train and val losses, 4 decimals", "FAIL")


def test_bench_gpu_check_without_a_gpu_says_so_in_one_line_and_exits_0(monkeypatch, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the check would run")
    monkeypatch.setattr(sys, "argv", ["bench.py", "--gpu_check"])
    with pytest.raises(SystemExit) as done:
        configurator.run_main(bench.main)
    assert done.value.code == 0
    assert capsys.readouterr().out == ("bench.py --gpu_check: no CUDA GPU here (torch sees none):"
                                       " nothing to check\n")


def test_bench_imports_the_gpu_check_only_when_asked_and_never_the_reverse():
    trees = {p: ast.parse(open(os.path.join(ROOT, p)).read())
             for p in ("bench.py", "lab/gpu_check.py")}
    names = {p: [(f"{n.module}.{a.name}" if isinstance(n, ast.ImportFrom) else a.name, n)
                 for n in ast.walk(t) if isinstance(n, (ast.Import, ast.ImportFrom))
                 for a in n.names] for p, t in trees.items()}
    assert not [name for name, _ in names["lab/gpu_check.py"] if "bench" in name]
    assert not [name for name, n in names["bench.py"] if "gpu_check" in name
                and n in trees["bench.py"].body]  # None is at the top.
    main = next(f for f in trees["bench.py"].body if getattr(f, "name", "") == "main")
    assert [n.module for n in ast.walk(main) if isinstance(n, ast.ImportFrom)] == ["lab.gpu_check"]


# ---- bench.py: speed, the cache, its settings ----

BENCH = [f"--{k}={v}" for k, v in {**SHAPE, "n_layer": 2, "batch_size": 2}.items()] + [
    "--contexts=8", "--decode_tokens=4", "--decode_batch_sizes=1", "--train_steps=2",
    "--warmup_steps=1", "--device=cpu", "--dtype=float32"]


def test_a_tiny_bench_run_writes_every_field(tmp_path, capsys):
    bench.main(BENCH + [f"--json_out={tmp_path / 'b.json'}"])
    result = json.load(open(tmp_path / "b.json"))
    assert {"config", "device", "dtype", "device_name", "torch", "threads", "model", "sizes",
            "train", "decode", "cache", "wall_s"} <= set(result)
    modes = result["train"]["modes"]
    assert list(modes) == list(VALUE_MODES) == list(result["sizes"])
    for mode, m in modes.items():
        assert len(m["step_ms"]) == 2 and m["mfu"] is None and m["peak_mem_bytes"] is None
        assert m["tokens_per_s"] == pytest.approx(2 * 16 / (m["ms_per_step"] / 1000))
    rows = result["decode"]["rows"]
    assert {(r["mode"], r["context"]) for r in rows} == {(m, c) for m in VALUE_MODES
                                                         for c in (8, 16)}
    for r in rows:
        assert r["cached_tok_s"] > 0 and r["uncached_tok_s"] > 0 and r["tokens_match"]
        assert r["fp32_logit_error"] <= LOGIT_TOLERANCE and r["cache_exact"]
    assert result["decode"]["cache_exact"]
    cache = result["cache"]
    assert cache["expected_svformer_ratio"] == 3 / 4  # It is (L+1)/(2L) at L = 2.
    assert {(r["mode"], r["n_kv_head"]) for r in cache["rows"]} == {
        (m, h) for m in VALUE_MODES for h in (2, 1)}
    for r in cache["rows"]:
        assert r["vs_vanilla"] == (0.75 if r["mode"] == "svformer" else 1.0)
        assert r["exact_svformer_ratio"] is (True if r["mode"] == "svformer" else None)
    printed = capsys.readouterr().out
    assert "training step" in printed and "decoding" in printed and "KV cache" in printed


def test_any_subset_of_the_modes_runs_and_resformers_settings_shape_the_resformer_alone():
    """No vanilla among the modes: vanilla is still the cache table's
    reference; --learnable_lambda is the resformer's (every other mode's model refuses it)."""
    result = bench.main(BENCH + ["--modes=resformer,value_embed", "--parts=train,cache",
                                 "--learnable_lambda", "--json_out="])
    assert list(result["train"]["modes"]) == ["resformer", "value_embed"]
    assert {r["mode"] for r in result["cache"]["rows"]} == {"vanilla", "resformer", "value_embed"}
    resformer = GPT(bench.model_config(result["config"], "resformer"))
    assert resformer.config.learnable_lambda and result["train"]["modes"]["resformer"][
        "params"] == resformer.num_params()


def test_a_wrong_cache_is_caught_in_float32(monkeypatch):
    store = bench.KVCache.store

    def keys_one_late(self, layer, k, v):  # Each cached key moves one position late.
        keys, values = store(self, layer, k, v)
        return keys.roll(1, dims=2), values
    monkeypatch.setattr(bench.KVCache, "store", keys_one_late)
    result = bench.main(BENCH + ["--parts=decode", "--modes=resformer", "--json_out="])
    assert result["decode"]["cache_exact"] is False
    assert all(r["fp32_logit_error"] > LOGIT_TOLERANCE for r in result["decode"]["rows"])


@pytest.mark.parametrize("argv,message", [
    (["--parts=train,speed"], "--parts=train,speed: name some of train, decode, cache"),
    (["--modes=vanilla,transformer"], "--modes=vanilla,transformer: name some of vanilla, "),
    (["--parts=decode", "--contexts=16", "--decode_tokens=16"],
     "context 16 must be longer than decode_tokens (16)"),
    (["--max_iters=5"], "--max_iters=5: a train.py setting that bench.py does not use"),
    (["--resume"], "--resume: a train.py setting that bench.py does not use"),
])
def test_bad_bench_settings_are_one_line(monkeypatch, argv, message):
    monkeypatch.setattr(sys, "argv", ["bench.py", "--json_out=", *argv])
    with pytest.raises(SystemExit) as refused:
        configurator.run_main(bench.main)
    assert refused.value.code.startswith(f"error: {message}") and "\n" not in refused.value.code


def test_bench_help_fits_100_columns(capsys):
    for argv in (["--help"], [GPT2, "--contexts=128,256,512,1024,2048,4096,8192", "--help"]):
        with pytest.raises(SystemExit) as done:
            bench.main(argv)
        text = capsys.readouterr().out
        assert done.value.code == 0 and "--gpu_check" in text
        assert [line for line in text.splitlines() if len(line) > 100] == []


# ---- compare.py --plan ----

def test_the_gpu_class_plan_prints_its_16_runs_without_data(tmp_path, capsys):
    assert compare.main([GPU_CLASS, f"--dataset={tmp_path / 'nowhere'}", "--plan",
                         f"--out_dir={tmp_path / 'out'}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 16 == 5 * 3 + 1  # It is 5 variants x 3 seeds and the floor.
    assert sum("python -m lab.nudged " in line for line in lines) == 1
    assert sum(line.startswith("OMP_NUM_THREADS=1 python train.py ") for line in lines) == 15
    assert all(f"--dataset={tmp_path / 'nowhere'}" in line and " && OMP_NUM_THREADS=1 python -m "
               "lab.evaluate --out_dir=" in line for line in lines)
    assert not list((tmp_path / "out").glob("*/log.jsonl"))  # Nothing trained.
