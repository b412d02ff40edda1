"""Tests for model.py: the value modes, GQA, the shared-value KV cache, value embeddings.
Run: python -m pytest -q"""
import math

import pytest
import torch

import model as model_module

from model import GPT, GPTConfig, KVCache, sample_next

MODES = ["vanilla", "resformer", "svformer", "value_embed"]
N_HEAD = 4
KV_HEADS = [N_HEAD, N_HEAD // 2, 1]


def tiny(value_mode="vanilla", n_kv_head=N_HEAD, **kw):
    args = dict(block_size=16, vocab_size=37, n_layer=3, n_head=N_HEAD, n_kv_head=n_kv_head,
                n_embd=32, dropout=0.0, bias=False, value_mode=value_mode)
    args.update(kw)
    torch.manual_seed(0)
    return GPT(GPTConfig(**args))


def tokens(B=2, T=12, vocab=37, seed=1):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n_kv_head", KV_HEADS)
def test_shapes_loss_and_overfit(mode, n_kv_head):
    model = tiny(mode, n_kv_head)
    x, y = tokens(), tokens(seed=2)
    logits, loss = model(x, y)
    assert logits.shape == (2, 12, 37) and torch.isfinite(loss)
    assert abs(loss.item() - math.log(37)) < 0.5  # a fresh model is near uniform
    last, no_loss = model(x)
    assert last.shape == (2, 1, 37) and no_loss is None
    assert model(x, all_logits=True)[0].shape == (2, 12, 37)
    opt = model.configure_optimizers(0.0, 3e-3, (0.9, 0.95))
    first = loss.item()
    for _ in range(60):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3 * first, f"{mode}/{n_kv_head}: loss {first:.3f} -> {loss.item():.3f}"


def test_bad_config_is_a_clear_error():
    with pytest.raises(ValueError, match="value_mode must be one of"):
        GPTConfig(value_mode="resformr")
    with pytest.raises(ValueError, match="multiple of n_kv_head"):
        GPTConfig(n_head=4, n_kv_head=3, n_embd=32)
    with pytest.raises(ValueError, match="learnable_lambda"):
        GPTConfig(value_mode="svformer", learnable_lambda=True)
    with pytest.raises(ValueError, match="lambda_1, lambda_2 and learnable_lambda only apply"):
        GPTConfig(value_mode="vanilla", lambda_1=2.0)
    config = GPTConfig(n_head=4, n_embd=32)
    assert config.kv_heads == 4 and config.n_kv_head == 0  # 0 means n_head, and stays 0


@pytest.mark.parametrize("n_kv_head,lambdas", [(k, (0.5, 0.5)) for k in KV_HEADS] +
                         [(N_HEAD, (1.0, 1.0)), (2, (2.0, 1.0))])
def test_resformer_layer2_matches_the_formula(n_kv_head, lambdas):
    """Recompute layer 2's attention output by hand: U_2 = A_2 (lambda_1 V_1 + lambda_2 V_2);
    the official 0.5/0.5 and the paper's sweep form V_n + lambda V_1 (lambda 1 and 2)."""
    lambda_1, lambda_2 = lambdas
    model = tiny("resformer", n_kv_head, n_layer=2, bias=True,
                 lambda_1=lambda_1, lambda_2=lambda_2).eval()
    x = tokens(B=2, T=10)
    captured, first = {}, {}
    model.transformer.h[0].attn.register_forward_hook(lambda m, inp, out: first.update(inp=inp))
    model.transformer.h[1].attn.register_forward_hook(
        lambda m, inp, out: captured.update(inp=inp, out=out))
    model(x)
    hidden = captured["inp"][0]  # layer 2's normalised input H_1 (and layer 1's, H_0, below)
    layer1 = model.transformer.h[0].attn
    C, kv = 32, n_kv_head * 8
    W1, b1 = layer1.c_attn.weight, layer1.c_attn.bias
    V1 = first["inp"][0] @ W1[C + kv:].T + b1[C + kv:]
    layer2 = model.transformer.h[1].attn
    W2, b2 = layer2.c_attn.weight, layer2.c_attn.bias
    Q, K, V2 = ((hidden @ W2[:C].T + b2[:C]), (hidden @ W2[C:C + kv].T + b2[C:C + kv]),
                (hidden @ W2[C + kv:].T + b2[C + kv:]))
    heads = lambda t, n: t.view(2, 10, n, 8).transpose(1, 2)
    group = N_HEAD // n_kv_head
    Q, K = heads(Q, N_HEAD), heads(K, n_kv_head).repeat_interleave(group, dim=1)
    V = heads(lambda_1 * V1 + lambda_2 * V2, n_kv_head).repeat_interleave(group, dim=1)
    A = (Q @ K.transpose(-1, -2) / math.sqrt(8)).masked_fill(torch.ones(10, 10).triu(1).bool(),
                                                              float("-inf")).softmax(-1)
    U = (A @ V).transpose(1, 2).reshape(2, 10, C)
    expected = layer2.c_proj(U)
    assert torch.allclose(captured["out"][0], expected, atol=1e-5)
    # and vanilla's layer 2 does not equal it (the test can tell the modes apart)
    assert not torch.allclose((A @ heads(V2, n_kv_head).repeat_interleave(group, 1))
                              .transpose(1, 2).reshape(2, 10, C), U, atol=1e-3)


def test_learnable_lambdas_start_at_half_and_get_gradients():
    model = tiny("resformer", learnable_lambda=True)
    lambdas = [b.attn.value_lambdas for b in model.transformer.h[1:]]
    assert all(isinstance(p, torch.nn.Parameter) and p.tolist() == [0.5, 0.5] for p in lambdas)
    assert not hasattr(model.transformer.h[0].attn, "value_lambdas")
    _, loss = model(tokens(), tokens(seed=2))
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lambdas)
    started = tiny("resformer", learnable_lambda=True, lambda_1=2.0, lambda_2=1.0)
    assert all(b.attn.value_lambdas.tolist() == [2.0, 1.0] for b in started.transformer.h[1:])
    fixed = tiny("resformer")
    assert all(not isinstance(b.attn.value_lambdas, torch.nn.Parameter)
               for b in fixed.transformer.h[1:])
    assert fixed.num_params() == model.num_params() - 2 * (3 - 1)


@pytest.mark.parametrize("n_kv_head", KV_HEADS)
def test_svformer_has_no_value_projection_beyond_layer_1(n_kv_head):
    for n_layer in (2, 5):
        vanilla = tiny("vanilla", n_kv_head, n_layer=n_layer)
        sv = tiny("svformer", n_kv_head, n_layer=n_layer)
        saved = (n_layer - 1) * 32 * (n_kv_head * 8)
        assert vanilla.num_params() - sv.num_params() == saved
        assert tiny("resformer", n_kv_head, n_layer=n_layer).num_params() == vanilla.num_params()


@pytest.mark.parametrize("mode,reaches", [("vanilla", False), ("resformer", True),
                                         ("svformer", True), ("value_embed", False)])
def test_gradient_from_last_layer_reaches_layer1_value_projection(mode, reaches):
    """V_1 is not detached: the last layer's attention output alone sends gradient
    to layer 1's W_V."""
    model = tiny(mode, n_layer=4)
    last = model.transformer.h[-1].attn
    # cut the residual stream into the last layer, so only its first_value argument
    # links it to layer 1
    last.register_forward_pre_hook(lambda m, args: (args[0].detach(),) + args[1:])
    captured = {}
    last.register_forward_hook(lambda m, args, out: captured.update(out=out[0]))
    model(tokens())
    captured["out"].pow(2).sum().backward()
    grad = model.transformer.h[0].attn.c_attn.weight.grad
    value_rows = grad[32 + 32:] if grad is not None else None  # rows of W_V inside the fused c_attn
    got = value_rows is not None and value_rows.abs().sum().item() > 0
    assert got == reaches


@pytest.mark.parametrize("mode", MODES + ["learnable"])
@pytest.mark.parametrize("n_kv_head", KV_HEADS)
def test_incremental_decoding_matches_full_forward(mode, n_kv_head):
    kw = (dict(value_mode="resformer", learnable_lambda=True) if mode == "learnable"
          else dict(value_mode=mode))
    model = tiny(n_kv_head=n_kv_head, **kw).eval()
    with torch.no_grad():  # make the learnable lambdas differ from 0.5 so they matter
        for _, p in model.parameter_groups()["mixing"]:  # learned lambdas, value_embed's
            p.uniform_(0.2, 0.9)
    x = tokens(B=2, T=16)
    full, _ = model(x, all_logits=True)
    cache = model.new_kv_cache(batch_size=2)
    with torch.no_grad():
        step_logits = [model(x[:, :5], kv_cache=cache, all_logits=True)[0]]  # prefill 5 tokens
        for t in range(5, 16):
            step_logits.append(model(x[:, t:t + 1], kv_cache=cache)[0])
    assert cache.length == 16
    assert torch.allclose(torch.cat(step_logits, dim=1), full, atol=1e-4)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n_kv_head", KV_HEADS)
def test_greedy_generate_same_with_and_without_cache_past_block_size(mode, n_kv_head):
    model = tiny(mode, n_kv_head).eval()
    prompt = tokens(B=2, T=3)
    cached = model.generate(prompt, 40, temperature=0)  # block_size 16: refills
    plain = model.generate(prompt, 40, temperature=0, kv_cache=False)
    assert cached.shape == (2, 43)
    assert torch.equal(cached, plain)
    long_prompt = tokens(B=1, T=30)  # longer than block_size from the start
    assert torch.equal(model.generate(long_prompt, 5, temperature=0),
                       model.generate(long_prompt, 5, temperature=0, kv_cache=False))


def test_cache_overflow_and_multi_token_steps_are_clear_errors():
    model = tiny().eval()
    cache = model.new_kv_cache(1)
    model(tokens(B=1, T=4), kv_cache=cache)
    with pytest.raises(ValueError, match="prefill"):
        model(tokens(B=1, T=2), kv_cache=cache)
    with pytest.raises(ValueError, match="exceeds block_size"):
        model(tokens(B=1, T=17))


def test_the_cache_writes_when_asked_and_the_model_advances_it(monkeypatch):
    """The cache no longer advances when 'the last layer' stores: the model advances it once per
    forward pass, so a model whose layers run in another order (or skip one) keeps its positions.
    Its own limit, max_len, is checked where it is; generate refills at the smaller of max_len and
    block_size, and refuses a cache the caller already filled instead of emptying it quietly."""
    model = tiny("svformer").eval()
    x = tokens(B=1, T=10)
    # a student's reordering: layer 1 (the V_1 layer) still first, then layer 3, then layer 2...
    monkeypatch.setattr(model.transformer, "h", torch.nn.ModuleList(
        [model.transformer.h[0], model.transformer.h[2], model.transformer.h[1]]))
    full, _ = model(x, all_logits=True)
    cache = model.new_kv_cache(1)
    with torch.no_grad():
        steps = [model(x[:, :4], kv_cache=cache, all_logits=True)[0]]
        steps += [model(x[:, t:t + 1], kv_cache=cache)[0] for t in range(4, 10)]
    assert cache.length == 10  # ...and the positions stay right
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-4)
    short = model.new_kv_cache(1, max_len=6)
    with pytest.raises(ValueError, match="KVCache holds 6 tokens; 10 do not fit"):
        model(x, kv_cache=short)
    again = model.generate(x[:, :2], 3, temperature=0, kv_cache=cache)  # a used cache: refilled
    assert torch.equal(again, model.generate(x[:, :2], 3, temperature=0))
    model = tiny("vanilla").eval()
    out = model.generate(x[:, :3], 12, temperature=0, kv_cache=model.new_kv_cache(1, max_len=8))
    plain = model.generate(x[:, :3], 12, temperature=0, kv_cache=False)
    assert out.shape == (1, 15)  # it runs to the end, refilling at 8 tokens...
    assert torch.equal(out[:, :9], plain[:, :9])  # ...and agrees while the contexts are alike


@pytest.mark.parametrize("n_layer", [2, 3, 12])
def test_cache_bytes_svformer_vs_vanilla(n_layer):
    live = {}
    for mode in MODES:
        for n_kv_head in KV_HEADS:
            model = tiny(mode, n_kv_head, n_layer=n_layer).eval()
            cache = model.new_kv_cache(batch_size=2)
            model.generate(tokens(B=2, T=3), 4, temperature=0, kv_cache=cache)
            assert cache.length == 6  # the last new token is never fed back
            nbytes = sum(t.numel() * t.element_size()
                         for t in cache.keys + list(cache.values.values()))
            tensors = n_layer + (1 if mode == "svformer" else n_layer)  # keys, then values
            assert cache.nbytes() == nbytes == tensors * 2 * n_kv_head * 16 * 8 * 4
            live[mode, n_kv_head] = nbytes
    for n_kv_head in KV_HEADS:
        assert (live["svformer", n_kv_head] * 2 * n_layer
                == live["vanilla", n_kv_head] * (n_layer + 1))
        assert live["resformer", n_kv_head] == live["vanilla", n_kv_head]
        assert live["value_embed", n_kv_head] == live["vanilla", n_kv_head]  # the mixed V
        for mode in MODES:  # bytes scale with n_kv_head / n_head
            assert live[mode, n_kv_head] * N_HEAD == live[mode, N_HEAD] * n_kv_head
    sv_cache = tiny("svformer", n_layer=n_layer).new_kv_cache(1)
    assert len(sv_cache.keys) == n_layer and len(sv_cache.values) == 1  # one value tensor, really


def test_cache_dtype_and_bytes():
    model = tiny("svformer")
    cache = model.new_kv_cache(3, max_len=10, dtype=torch.bfloat16)
    assert (cache.keys[0].dtype == torch.bfloat16
            and cache.nbytes() == (3 + 1) * 3 * N_HEAD * 10 * 8 * 2)
    assert isinstance(cache, KVCache) and model.new_kv_cache(1).keys[0].dtype == torch.float32


def test_sampling_filters():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9]])
    assert sample_next(logits, temperature=0).item() == 1
    torch.manual_seed(0)
    assert {sample_next(logits, top_k=1).item() for _ in range(20)} == {1}
    assert {sample_next(logits, top_k=2).item() for _ in range(50)} == {1, 3}


def test_sampling_draws_from_the_softmax():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).expand(4000, 4)
    torch.manual_seed(0)
    counts = torch.bincount(sample_next(logits).flatten(), minlength=4).float() / 4000
    assert torch.allclose(counts, logits[0].softmax(-1), atol=0.02)  # 3 sigma is about 0.02


def test_decoding_never_reads_a_tensor_on_the_host(monkeypatch):
    """On a GPU any .item() / bool() / multinomial would wait for the device once per token."""
    model = tiny("svformer").eval()

    def no_host_read(*args, **kw):
        raise AssertionError("decoding read a tensor on the host (a GPU sync per token)")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, no_host_read)
    monkeypatch.setattr(torch, "multinomial", no_host_read)
    for kw in (dict(temperature=0), dict(temperature=0.8, top_k=5)):
        for kv_cache in (None, False):
            out = model.generate(tokens(B=2, T=3), 20, kv_cache=kv_cache, **kw)  # refills past 16
    monkeypatch.undo()
    assert out.shape == (2, 23)


def test_seeded_sampling_is_deterministic():
    model = tiny("svformer").eval()
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append(model.generate(tokens(B=1, T=2), 20, temperature=1.0, top_k=10))
    assert torch.equal(*runs)


def test_optimizer_groups_and_flops():
    model = tiny("resformer", learnable_lambda=True)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), lambda_lr_scale=0.1)
    decay, no_decay, lambdas = opt.param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() == 1 for p in no_decay["params"])
    # one (lambda_1, lambda_2) per layer after the first, no decay, their own lr multiple
    assert lambdas["weight_decay"] == 0.0 and lambdas["lr_scale"] == 0.1
    assert [p.numel() for p in lambdas["params"]] == [2] * (model.config.n_layer - 1)
    assert decay["lr_scale"] == no_decay["lr_scale"] == 1.0
    n_total = sum(p.numel() for group in opt.param_groups for p in group["params"])
    assert n_total == model.num_params(non_embedding=False)
    assert len(tiny("resformer").configure_optimizers(0.1, 1e-3, (0.9, 0.95))
               .param_groups) == 2  # fixed lambdas: buffers, not trained


def test_value_embed_matches_the_formula_in_every_layer():
    """U_n = A_n ((1 - l_n) V_n + l_n E_n[x]) with l_n learned from 0.5, in layer 1 too: the
    attention output of each layer, recomputed by hand from its input, its table and its l."""
    model = tiny("value_embed", 2, n_layer=2).eval()
    x = tokens(B=2, T=10)
    with torch.no_grad():
        model.transformer.h[1].attn.value_lambda.fill_(0.3)
    for layer in (0, 1):
        captured = {}
        attn = model.transformer.h[layer].attn
        attn.register_forward_hook(lambda m, inp, out: captured.update(inp=inp, out=out))
        model(x)
        hidden, (C, kv) = captured["inp"][0], (32, 2 * 8)
        W = attn.c_attn.weight
        Q, K, V = hidden @ W[:C].T, hidden @ W[C:C + kv].T, hidden @ W[C + kv:].T
        lam = attn.value_lambda
        assert lam.item() == pytest.approx(0.5 if layer == 0 else 0.3)
        mixed = (1 - lam) * V + lam * attn.value_embed.weight[x]  # the token's row alone
        heads = lambda t, n: t.view(2, 10, n, 8).transpose(1, 2).repeat_interleave(4 // n, 1)
        A = (heads(Q, 4) @ heads(K, 2).transpose(-1, -2) / math.sqrt(8)).masked_fill(
            torch.ones(10, 10).triu(1).bool(), float("-inf")).softmax(-1)
        expected = attn.c_proj((A @ heads(mixed, 2)).transpose(1, 2).reshape(2, 10, C))
        assert torch.allclose(captured["out"][0], expected, atol=1e-5)
        assert torch.equal(captured["out"][1], mixed.view(2, 10, 2, 8).transpose(1, 2))


def test_value_embed_parameters_are_counted_and_grouped():
    """A table of vocab x kv_dim per layer: all of it counts in num_params, one row of it per
    token in active_params, none of it in the FLOPs (a lookup multiplies nothing). The tables
    are decayed like every embedding; each layer's l is a mixing weight: no decay, logged."""
    from lab.analysis import sizes
    vanilla, ve = tiny("vanilla", 2), tiny("value_embed", 2)
    tables = 3 * 37 * 16  # layers x vocab x kv_dim
    assert ve.num_params() == vanilla.num_params() + tables + 3
    assert sizes(ve, 16)["active_params"] == vanilla.num_params() + 3 * 16 + 3
    assert sizes(ve, 16)["flops_per_token"] == sizes(vanilla, 16)["flops_per_token"] + 6 * 3
    groups = {k: [name for name, _ in v] for k, v in ve.parameter_groups().items()}
    assert all(f"transformer.h.{i}.attn.value_embed.weight" in groups["decay"] for i in range(3))
    assert groups["mixing"] == [f"transformer.h.{i}.attn.value_lambda" for i in range(3)]
    assert list(ve.mixing_weights().values()) == [0.5, 0.5, 0.5]
    cache = ve.new_kv_cache(1)  # a value tensor per layer, as vanilla's: the mixed value
    assert len(cache.values) == 3 and cache.nbytes() == vanilla.new_kv_cache(1).nbytes()


def test_mixing_weights_are_named_and_a_students_norm_is_not_one(monkeypatch):
    """Mixing weights are those MIXING_WEIGHTS names: a student's gate, once named there, gets
    no decay, its own lr and the log (a tensor of more than 2 numbers as its mean). A student who
    swaps LayerNorm for RMSNorm gets nanoGPT's rule: its vector does not decay, keeps the lr and
    stays out of the log (it used to be taken for a mixing weight)."""
    model = tiny("resformer")
    model.transformer.h[1].attn.gate = torch.nn.Parameter(torch.ones(N_HEAD))  # one per head
    for block in model.transformer.h:
        block.ln_1 = torch.nn.RMSNorm(32)
    groups = model.parameter_groups()
    assert groups["mixing"] == [] and model.mixing_weights() == {}  # not named: no mixing weight
    assert {"transformer.h.0.ln_1.weight", "transformer.h.1.attn.gate"} <= {
        n for n, _ in groups["no_decay"]}
    assert all(p.dim() == 2 for _, p in groups["decay"])
    monkeypatch.setattr(model_module, "MIXING_WEIGHTS", {**model_module.MIXING_WEIGHTS,
                                                         "gate": "gate"})
    groups = model.parameter_groups()
    assert [n for n, _ in groups["mixing"]] == ["transformer.h.1.attn.gate"]
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), lambda_lr_scale=0.5)
    assert opt.param_groups[2]["weight_decay"] == 0.0 and opt.param_groups[2]["lr_scale"] == 0.5
    assert model.mixing_weights() == {"transformer.h.1.attn.gate:mean": 1.0}
    learned = tiny("resformer", learnable_lambda=True)
    assert learned.mixing_weights()["transformer.h.1.attn.value_lambdas"] == [0.5, 0.5]


def test_a_mode_starts_from_vanillas_values_for_every_tensor_they_share():
    """The pairing (train.start_like_vanilla, done where train.py builds the model): with the same
    seed, SVFormer and value embeddings start from vanilla's draw of every parameter they share
    (SVFormer's c_attn: vanilla's query and key rows), ResFormer from all of vanilla's; a mode's
    own tables keep draws of their own, and GPT() alone builds one model and pairs nothing."""
    from train import start_like_vanilla
    vanilla = tiny("vanilla").state_dict()
    for mode in MODES:
        model = tiny(mode)
        unpaired = {k: v.clone() for k, v in model.state_dict().items()}
        start_like_vanilla(model, 0)
        mine = model.state_dict()
        shared = [k for k in mine if k in vanilla]
        assert len(shared) == len(vanilla)  # every vanilla tensor has its counterpart
        for k in shared:
            assert torch.equal(mine[k], vanilla[k][:len(mine[k])]), (mode, k)
        if mode in ("svformer", "value_embed"):  # GPT() alone: its own draws, shifted
            assert not torch.equal(unpaired["transformer.h.1.attn.c_proj.weight"],
                                   vanilla["transformer.h.1.attn.c_proj.weight"])
    table = tiny("value_embed").transformer.h[0].attn.value_embed.weight
    assert table.std().item() == pytest.approx(0.02, rel=0.2)  # drawn, as an embedding is
    # a student's buffer (RoPE's angles, say) is not a parameter: it is left as its mode made it
    model = tiny("svformer")
    model.register_buffer("angles", torch.full((3,), 7.0))
    start_like_vanilla(model, 0)
    assert model.angles.tolist() == [7.0] * 3


def test_grouped_query_attention_repeats_keys_and_values_where_flash_does_not_run():
    """Off flash attention (here: the CPU), k and v are repeated per query head; the output is
    what SDPA gives for the grouped k and v as they are."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    grouped = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                               enable_gqa=True)
    model = tiny("vanilla", 2).eval()
    attn, seen = model.transformer.h[0].attn, {}
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.update(heads=k.size(1), gqa=kw["enable_gqa"])
        return real(q, k, v, **kw)
    model_module.F.scaled_dot_product_attention = spy
    try:
        attn(torch.randn(1, 5, 32), tokens(B=1, T=5), None)
    finally:
        model_module.F.scaled_dot_product_attention = real
    assert seen == {"heads": 4, "gqa": False}  # repeated to the 4 query heads
    repeated = real(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
    assert torch.allclose(grouped, repeated, atol=1e-6)


def test_a_checkpoint_of_other_code_is_one_line_that_says_what_differs():
    model = tiny("vanilla")
    ckpt = {"model_args": vars(model.config), "model": {**model.state_dict(),
                                                        "transformer.extra.weight": torch.ones(2)}}
    with pytest.raises(ValueError, match=r"^it does not fit today's model.py \(transformer.extra"
                                         r".weight\): other code trained it$"):
        GPT.from_checkpoint(ckpt)
    ckpt["model"].pop("transformer.extra.weight")
    assert GPT.from_checkpoint(ckpt).training is False
