"""Tests for model.py: the value modes' equations, GQA, the shared-value KV cache, generation.
Read next to model.py; run: python -m pytest -q test_model.py"""
import math

import pytest
import torch
import torch.nn.functional as F

import model as model_module
from model import GPT, VALUE_MODES, GPTConfig, KVCache

N_HEAD, C, HD = 4, 32, 8  # heads, width, head size of the tiny model
KV_HEADS = [N_HEAD, 1]  # every query head its own key/value head, and one shared by all (MQA)


def tiny(value_mode="vanilla", n_kv_head=N_HEAD, **kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**dict(block_size=16, vocab_size=37, n_layer=3, n_head=N_HEAD,
                                   n_kv_head=n_kv_head, n_embd=C, bias=False,
                                   value_mode=value_mode), **kw}))


def tokens(B=2, T=12, seed=1):
    return torch.randint(0, 37, (B, T), generator=torch.Generator().manual_seed(seed))


def attention_of(model, x, monkeypatch):
    """Each layer's (input, q, k, v, output) as the model computed them: q, k and v as it handed
    them to scaled_dot_product_attention. So these tests take the attention from the model itself,
    and a student's QK-norm or RoPE (which change q and k on the way) leaves them green while each
    mode's value formula stays checked."""
    seen, sdpa = [], F.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append({"q": q, "k": k, "v": v})
        return sdpa(q, k, v, **kw)
    monkeypatch.setattr(model_module.F, "scaled_dot_product_attention", spy)
    for n, block in enumerate(model.transformer.h):
        block.attn.register_forward_hook(
            lambda m, args, out, n=n: seen[n].update(input=args[0], output=out[0]))
    model(x)
    monkeypatch.undo()
    return seen


def values_of(layer, hidden):
    """A layer's own values V_n: its value projection (c_attn's last rows) of its input."""
    rows = layer.attn.c_attn.weight[C + layer.attn.kv_dim:]
    return layer.attn.heads(hidden @ rows.T, layer.attn.n_kv_head)


def causal_attention(q, k, v):
    """U = A V with A = softmax(q k^T / sqrt(d) + causal mask), k and v shared by query groups."""
    group = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    T = q.size(2)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))).masked_fill(
        torch.ones(T, T).triu(1).bool(), float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("mode", VALUE_MODES)
@pytest.mark.parametrize("n_kv_head", KV_HEADS)
def test_shapes_loss_and_overfit(mode, n_kv_head):
    model = tiny(mode, n_kv_head)
    x, y = tokens(), tokens(seed=2)
    logits, loss = model(x, y)
    assert logits.shape == (2, 12, 37) and abs(loss.item() - math.log(37)) < 0.5  # near uniform
    last, no_loss = model(x)
    assert last.shape == (2, 1, 37) and no_loss is None
    opt, first = model.configure_optimizers(0.0, 3e-3, (0.9, 0.95)), loss.item()
    for _ in range(60):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3 * first, f"{mode}/{n_kv_head}: loss {first:.3f} -> {loss.item():.3f}"


def test_bad_config_is_a_clear_error():
    with pytest.raises(ValueError, match="value_mode 'resformr': use vanilla, resformer, "):
        GPTConfig(value_mode="resformr")
    with pytest.raises(ValueError, match=r"n_kv_head \(3\) must divide n_head \(4\)"):
        GPTConfig(n_head=4, n_kv_head=3, n_embd=32)
    with pytest.raises(ValueError, match="lambda_1, lambda_2 and learnable_lambda are resfor"):
        GPTConfig(value_mode="vanilla", lambda_1=2.0)
    with pytest.raises(ValueError, match="learnable_lambda"):
        GPTConfig(value_mode="svformer", learnable_lambda=True)
    assert GPTConfig(n_head=4, n_embd=32).kv_heads == 4  # n_kv_head 0 means n_head


@pytest.mark.parametrize("mode,lambdas", [("vanilla", None), ("resformer", (0.5, 0.5)),
                                          ("resformer", (2.0, 1.0)), ("svformer", None),
                                          ("value_embed", None)])
@pytest.mark.parametrize("n_kv_head", KV_HEADS)
def test_each_layers_value_is_its_modes_formula(mode, lambdas, n_kv_head, monkeypatch):
    """In every layer n, the value attended to is the mode's, from the layer's own input:
    vanilla V_n; ResFormer lambda_1 V_1 + lambda_2 V_n from layer 2 on (the official 0.5/0.5 and
    the paper's V_n + 2 V_1); SVFormer V_1; value embeddings (1 - l_n) V_n + l_n E_n[x] in every
    layer. And the layer's output is c_proj(A_n value), A_n from the model's own q and k."""
    kw = dict(lambda_1=lambdas[0], lambda_2=lambdas[1]) if lambdas else {}
    model, x = tiny(mode, n_kv_head, **kw).eval(), tokens(T=10)
    if mode == "value_embed":
        with torch.no_grad():
            model.transformer.h[1].attn.value_lambda.fill_(0.3)  # each layer its own l_n
    layers = attention_of(model, x, monkeypatch)
    V1 = values_of(model.transformer.h[0], layers[0]["input"])
    for n, (block, seen) in enumerate(zip(model.transformer.h, layers)):
        own = values_of(block, seen["input"]) if block.attn.owns_value else None
        if mode == "value_embed":
            lam, table = block.attn.value_lambda, block.attn.value_embed.weight[x]
            expected = (1 - lam) * own + lam * block.attn.heads(table, n_kv_head)
        elif n == 0 or mode == "vanilla":
            expected = own
        elif mode == "resformer":
            expected = lambdas[0] * V1 + lambdas[1] * own
        else:  # svformer: no value projection of its own past layer 1
            expected = V1
            assert own is None
        assert torch.allclose(seen["v"], expected, atol=1e-5), (mode, n)
        if n == 1 and mode in ("resformer", "value_embed"):  # not vanilla's: the test can tell
            assert not torch.allclose(expected, own, atol=1e-3)
        U = causal_attention(seen["q"], seen["k"], seen["v"]).transpose(1, 2).reshape(2, 10, C)
        assert torch.allclose(seen["output"], block.attn.c_proj(U), atol=1e-5), (mode, n)


def test_learnable_lambdas_start_where_set_and_get_gradients():
    model = tiny("resformer", learnable_lambda=True)
    lambdas = [b.attn.value_lambdas for b in model.transformer.h[1:]]
    assert all(isinstance(p, torch.nn.Parameter) and p.tolist() == [0.5, 0.5] for p in lambdas)
    assert not hasattr(model.transformer.h[0].attn, "value_lambdas")
    model(tokens(), tokens(seed=2))[1].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lambdas)
    started = tiny("resformer", learnable_lambda=True, lambda_1=2.0, lambda_2=1.0)
    assert all(b.attn.value_lambdas.tolist() == [2.0, 1.0] for b in started.transformer.h[1:])
    fixed = tiny("resformer")  # fixed lambdas: buffers, not parameters
    assert fixed.num_params() == model.num_params() - 2 * (3 - 1)


@pytest.mark.parametrize("n_kv_head", KV_HEADS)
def test_svformer_has_no_value_projection_beyond_layer_1(n_kv_head):
    for n_layer in (2, 5):
        vanilla, sv = tiny("vanilla", n_kv_head, n_layer=n_layer), tiny("svformer", n_kv_head,
                                                                        n_layer=n_layer)
        assert vanilla.num_params() - sv.num_params() == (n_layer - 1) * C * n_kv_head * HD
        assert tiny("resformer", n_kv_head, n_layer=n_layer).num_params() == vanilla.num_params()


@pytest.mark.parametrize("mode,reaches", [("vanilla", False), ("resformer", True),
                                         ("svformer", True), ("value_embed", False)])
def test_gradient_from_the_last_layer_reaches_layer_1s_value_projection(mode, reaches):
    """V_1 is not detached: the last layer's attention output alone sends gradient to W_V of
    layer 1 in the modes that use V_1."""
    model = tiny(mode, n_layer=4)
    last, captured = model.transformer.h[-1].attn, {}
    # the residual stream into the last layer cut: only first_value links it to layer 1
    last.register_forward_pre_hook(lambda m, args: (args[0].detach(),) + args[1:])
    last.register_forward_hook(lambda m, args, out: captured.update(out=out[0]))
    model(tokens())
    captured["out"].pow(2).sum().backward()
    grad = model.transformer.h[0].attn.c_attn.weight.grad
    assert (grad is not None and grad[2 * C:].abs().sum().item() > 0) == reaches


@pytest.mark.parametrize("mode", [*VALUE_MODES, "learnable"])
@pytest.mark.parametrize("n_kv_head", KV_HEADS)
def test_cached_decoding_gives_the_full_forwards_logits(mode, n_kv_head):
    kw = (dict(value_mode="resformer", learnable_lambda=True) if mode == "learnable"
          else dict(value_mode=mode))
    model = tiny(n_kv_head=n_kv_head, **kw).eval()
    with torch.no_grad():  # learned mixes away from 0.5, so that they matter
        for name, p in model.named_parameters():
            if name.rpartition(".")[2] in model_module.MIXING_WEIGHTS:
                p.uniform_(0.2, 0.9)
        x = tokens(T=16)
        full = model.lm_head(model.hidden_states(x))
        cache = model.new_kv_cache(batch_size=2)
        steps = [model.lm_head(model.hidden_states(x[:, :5], cache))]  # prefill 5 tokens
        steps += [model(x[:, t:t + 1], kv_cache=cache)[0] for t in range(5, 16)]
    assert cache.length == 16
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-4)


@pytest.mark.parametrize("mode", VALUE_MODES)
@pytest.mark.parametrize("n_kv_head", KV_HEADS)
def test_greedy_generation_with_and_without_the_cache_agrees_past_block_size(mode, n_kv_head):
    model = tiny(mode, n_kv_head).eval()
    cached = model.generate(tokens(T=3), 40, temperature=0)  # block_size 16: refilled
    assert cached.shape == (2, 43)
    assert torch.equal(cached, model.generate(tokens(T=3), 40, temperature=0, use_cache=False))
    long_prompt = tokens(B=1, T=30)  # longer than block_size from the start
    assert torch.equal(model.generate(long_prompt, 5, temperature=0),
                       model.generate(long_prompt, 5, temperature=0, use_cache=False))


def test_the_cache_refuses_what_it_cannot_hold():
    model = tiny().eval()
    cache = model.new_kv_cache(1)
    model(tokens(B=1, T=4), kv_cache=cache)
    with pytest.raises(AssertionError, match="only the first step may feed several tokens"):
        model(tokens(B=1, T=2), kv_cache=cache)
    with pytest.raises(AssertionError, match="17 tokens > block_size"):
        model(tokens(B=1, T=17))
    with pytest.raises(AssertionError, match="KVCache holds 6 tokens; 10 do not fit"):
        model(tokens(B=1, T=10), kv_cache=model.new_kv_cache(1, max_len=6))


@pytest.mark.parametrize("n_layer", [2, 3, 16])
def test_svformers_cache_holds_one_value_tensor_l_plus_1_over_2l_of_vanillas(n_layer):
    """SVFormer's cache: keys for every layer and one value tensor, (L+1)/(2L) of vanilla's bytes
    (17/32 at the demo's 16 layers), with any number of key/value heads; the other modes store
    a value per layer (value embeddings and ResFormer: the mixed one)."""
    nbytes = {}
    for mode in VALUE_MODES:
        for n_kv_head in (N_HEAD, 2, 1):
            model = tiny(mode, n_kv_head, n_layer=n_layer).eval()
            cache = model.new_kv_cache(batch_size=2)
            model.generate(tokens(T=3), 4, temperature=0)
            tensors = n_layer + (1 if mode == "svformer" else n_layer)
            assert len(cache.keys) + len(cache.values) == tensors
            assert cache.nbytes() == tensors * 2 * n_kv_head * 16 * HD * 4  # float32
            nbytes[mode, n_kv_head] = cache.nbytes()
    for n_kv_head in (N_HEAD, 2, 1):
        assert nbytes["svformer", n_kv_head] * 2 * n_layer == (
            nbytes["vanilla", n_kv_head] * (n_layer + 1))
        assert nbytes["resformer", n_kv_head] == nbytes["value_embed", n_kv_head] == nbytes[
            "vanilla", n_kv_head]


def test_the_cache_takes_the_dtype_asked_or_autocasts():
    model = tiny("svformer")
    cache = model.new_kv_cache(3, max_len=10, dtype=torch.bfloat16)
    assert cache.keys[0].dtype == torch.bfloat16 and cache.nbytes() == 4 * 3 * N_HEAD * 10 * HD * 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.new_kv_cache(1).keys[0].dtype == torch.bfloat16
    assert isinstance(cache, KVCache) and model.new_kv_cache(1).keys[0].dtype == torch.float32


def test_sampling_keeps_the_top_k_and_is_repeatable():
    model = tiny("svformer").eval()
    prompt = tokens(B=1, T=4)
    with torch.no_grad():
        two = set(torch.topk(model(prompt)[0][0, -1], 2).indices.tolist())
    torch.manual_seed(0)
    drawn = {model.generate(prompt, 1, temperature=1.5, top_k=2)[0, -1].item() for _ in range(60)}
    assert drawn == two  # both, and nothing else
    assert torch.equal(model.generate(prompt, 6, top_k=1), model.generate(prompt, 6, temperature=0))
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append(model.generate(prompt, 20, temperature=1.0, top_k=10))
    assert torch.equal(*runs)


def test_optimizer_groups_and_flops():
    model = tiny("resformer", learnable_lambda=True)
    decay, no_decay, lambdas = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95),
                                                          lambda_lr_scale=0.1).param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() == 1 for p in no_decay["params"])
    assert lambdas["weight_decay"] == 0.0 and lambdas["lr_scale"] == 0.1  # the mixing weights
    assert [p.numel() for p in lambdas["params"]] == [2] * 2 and decay["lr_scale"] == 1.0
    assert sum(p.numel() for g in (decay, no_decay, lambdas) for p in g["params"]) == \
        sum(p.numel() for p in model.parameters())
    assert len(tiny("resformer").configure_optimizers(0.1, 1e-3, (0.9, 0.95)).param_groups) == 2
    # PaLM's count, nanoGPT's: 6 per multiplying weight (the positions are a lookup), 12 L C T
    vanilla = tiny()
    assert vanilla.flops_per_token(16) == 6 * vanilla.num_params() + 12 * 3 * C * 16


def test_value_embeddings_are_counted_and_grouped_but_multiply_nothing():
    """A table of vocab x kv_dim per layer: all of it in num_params, none in the FLOPs (a lookup
    multiplies nothing); decayed like every embedding; each layer's l a mixing weight, logged."""
    vanilla, ve = tiny("vanilla", 2), tiny("value_embed", 2)
    tables = 3 * 37 * 2 * HD
    assert ve.num_params() == vanilla.num_params() + tables + 3
    assert ve.flops_per_token(16) == vanilla.flops_per_token(16) + 6 * 3
    opt = ve.configure_optimizers(0.1, 1e-3, (0.9, 0.95))
    assert any(p is ve.transformer.h[0].attn.value_embed.weight
               for p in opt.param_groups[0]["params"])
    assert list(ve.mixing_weights()) == [f"transformer.h.{i}.attn.value_lambda" for i in range(3)]
    assert list(ve.mixing_weights().values()) == [0.5] * 3


def test_mixing_weights_are_those_named_and_a_students_norm_is_not_one(monkeypatch):
    """A mixing weight is one MIXING_WEIGHTS names: a student's scale, once named there, gets
    no decay, its own lr and the log (more than 2 numbers: its mean). A student's RMSNorm for
    LayerNorm gets nanoGPT's rule: a vector, no decay, the lr, not in the log."""
    model = tiny("resformer")
    model.transformer.h[1].attn.scale = torch.nn.Parameter(torch.ones(N_HEAD))
    for block in model.transformer.h:
        block.ln_1 = torch.nn.RMSNorm(C)
    groups = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95)).param_groups
    assert len(groups) == 2 and model.mixing_weights() == {}
    assert any(p is model.transformer.h[1].attn.scale for p in groups[1]["params"])
    monkeypatch.setattr(model_module, "MIXING_WEIGHTS",
                        {**model_module.MIXING_WEIGHTS, "scale": ("scale",)})
    groups = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), lambda_lr_scale=0.5).param_groups
    assert groups[2]["params"] == [model.transformer.h[1].attn.scale]
    assert groups[2]["weight_decay"] == 0.0 and groups[2]["lr_scale"] == 0.5
    assert model.mixing_weights() == {"transformer.h.1.attn.scale:mean": 1.0}


def test_a_mode_starts_from_vanillas_values_for_every_tensor_they_share(monkeypatch):
    """The pairing (GPT.start_like_vanilla): with the same seed, each mode starts from vanilla's
    draw of every parameter it shares with vanilla (SVFormer's c_attn: vanilla's query and key
    rows); a mode's own tables keep their draws. Without the pairing, a mode's extra or missing
    tensors shift vanilla's draws."""
    vanilla = tiny("vanilla").state_dict()
    for mode in VALUE_MODES:
        mine = tiny(mode).state_dict()
        assert all(k in mine for k in vanilla)  # every vanilla tensor has its counterpart
        for k in vanilla:
            assert torch.equal(mine[k], vanilla[k][:len(mine[k])]), (mode, k)
    table = tiny("value_embed").transformer.h[0].attn.value_embed.weight
    assert table.std().item() == pytest.approx(0.02, rel=0.2)  # drawn, as an embedding is
    monkeypatch.setattr(GPT, "start_like_vanilla", lambda self, rng: None)
    for mode in ("svformer", "value_embed"):  # unpaired: its own draws, shifted
        unpaired = tiny(mode).transformer.h[1].attn.c_proj.weight
        assert not torch.equal(unpaired, vanilla["transformer.h.1.attn.c_proj.weight"])


def test_grouped_keys_and_values_go_to_sdpa_grouped(monkeypatch):
    """With fewer key/value heads than query heads, SDPA gets k and v as they are, with
    enable_gqa (on the CPU it runs its math kernel), and computes what repeated heads give."""
    model = tiny("vanilla", 2).eval()
    layers = attention_of(model, tokens(B=1, T=5), monkeypatch)
    assert layers[0]["k"].size(1) == 2 and layers[0]["q"].size(1) == N_HEAD
    q, k, v = (layers[0][t] for t in "qkv")
    grouped = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.allclose(grouped, causal_attention(q, k, v), atol=1e-6)


def test_a_checkpoint_of_other_code_is_one_line_that_says_what_differs():
    model = tiny("vanilla")
    ckpt = {"model_args": vars(model.config), "model": {**model.state_dict(),
                                                        "transformer.extra.weight": torch.ones(2)}}
    with pytest.raises(ValueError, match=r"^it does not fit today's model.py \(transformer.extra"
                                         r".weight\): other code trained it$"):
        GPT.from_checkpoint(ckpt)
    ckpt["model"].pop("transformer.extra.weight")
    assert GPT.from_checkpoint(ckpt).training is False
