"""
One GPT, four value modes: Value Residual Learning (arXiv 2410.17897) and what came
after it. Layers are n = 1..L as in the paper (layer_idx = n - 1 in the code):

    vanilla      U_n = A_n V_n
    resformer    U_n = A_n (lambda_1 V_1 + lambda_2 V_n)    for n >= 2
    svformer     U_n = A_n V_1                              for n >= 2
    value_embed  U_n = A_n ((1 - lambda_n) V_n + lambda_n E_n[x])

A_n is layer n's causal attention, V_n its values and E_n[x] a row of layer n's own
table for the token x (the GPT-2 speedrun's value embeddings). The rest is nanoGPT's
GPT-2, plus grouped-query attention and a KV cache that stores SVFormer's V_1 once.
"""
import math
from dataclasses import dataclass, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

# The value modes. A mode of your own needs its name here, its weights in
# CausalSelfAttention.__init__ and its line in CausalSelfAttention.forward.
VALUE_MODES = ("vanilla", "resformer", "svformer", "value_embed")
# Learned weights that mix values, by attribute name, and what the eval line calls
# their numbers. They train at lambda_lr_scale times the lr, and without weight
# decay, which would pull a mix towards 0.
MIXING_WEIGHTS = {"value_lambdas": ("lambda_1", "lambda_2"), "value_lambda": ("lambda_n",)}


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257, padded to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int = 0  # key/value heads for grouped-query attention; 0 means n_head
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # in Linears and LayerNorms, like GPT-2 (False: a bit faster)
    value_mode: str = "vanilla"  # one of VALUE_MODES
    lambda_1: float = 0.5  # resformer's mix: the official code's 0.5 and 0.5, or
    lambda_2: float = 0.5  # the paper's best, A_n (V_n + 2 V_1): lambda_1 2, lambda_2 1
    learnable_lambda: bool = False  # resformer: learn them per layer, from these

    def __post_init__(self):
        # Checked here, so that every script refuses the same settings.
        if self.value_mode not in VALUE_MODES:
            raise ValueError(f"value_mode {self.value_mode!r}: use {', '.join(VALUE_MODES)}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_kv_head < 0 or self.n_head % self.kv_heads != 0:
            raise ValueError(f"n_kv_head ({self.n_kv_head}) must divide n_head ({self.n_head})")
        # A mode of your own that uses the lambdas: add it to this check.
        lambdas = (self.lambda_1, self.lambda_2, self.learnable_lambda)
        if self.value_mode != "resformer" and lambdas != (0.5, 0.5, False):
            raise ValueError("lambda_1, lambda_2 and learnable_lambda are resformer's alone")

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def kv_heads(self):
        return self.n_kv_head or self.n_head

    def value_layer(self, layer_idx):
        # The layer whose values this layer attends to: its own, or SVFormer's first.
        return 0 if self.value_mode == "svformer" else layer_idx

    @classmethod
    def from_dict(cls, d):  # d may hold other settings too: the fields' values alone
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


class KVCache:
    """The keys of every layer and the values of the layers attended to. A layer that
    uses another layer's values stores none, so SVFormer's cache holds L + 1 tensors
    where vanilla's holds 2L. Layers store(); GPT.hidden_states advances length."""

    def __init__(self, config, batch_size, max_len, device, dtype):
        shape = (batch_size, config.kv_heads, max_len, config.head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.value_layer = [config.value_layer(i) for i in range(config.n_layer)]
        self.values = {i: torch.zeros(shape, device=device, dtype=dtype)
                       for i in set(self.value_layer)}  # by layer_idx: SVFormer's 0 alone
        self.max_len, self.length = max_len, 0  # tokens stored so far

    def store(self, layer_idx, k, v):
        # Append k (and v, unless None); return the keys and values this layer sees.
        start, end = self.length, self.length + k.size(2)
        assert end <= self.max_len, f"KVCache holds {self.max_len} tokens; {end} do not fit"
        self.keys[layer_idx][:, :, start:end] = k
        if v is not None:
            self.values[layer_idx][:, :, start:end] = v
        v_all = self.values[self.value_layer[layer_idx]]  # SVFormer's: layer 1's, always
        return self.keys[layer_idx][:, :, :end], v_all[:, :, :end]

    def nbytes(self):  # the cache's size, as sample.py and bench.py report it
        return sum(t.nbytes for t in self.keys + list(self.values.values()))


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx, self.value_mode = layer_idx, config.value_mode
        self.n_head, self.n_kv_head = config.n_head, config.kv_heads
        self.head_dim, self.kv_dim = config.head_dim, config.kv_heads * config.head_dim
        # SVFormer's layers after the first use V_1: they have no value projection.
        self.owns_value = config.value_layer(layer_idx) == layer_idx
        # One matmul makes q, k and v: n_embd outputs for q, kv_dim each for k and v.
        self.split_sizes = [config.n_embd, self.kv_dim] + ([self.kv_dim] if self.owns_value else [])
        self.c_attn = nn.Linear(config.n_embd, sum(self.split_sizes), bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        if config.value_mode == "resformer" and layer_idx > 0:
            lambdas = torch.tensor([config.lambda_1, config.lambda_2])
            if config.learnable_lambda:
                self.value_lambdas = nn.Parameter(lambdas)
            else:
                self.register_buffer("value_lambdas", lambdas)
        if config.value_mode == "value_embed":  # a table of values, and a mix
            self.value_embed = nn.Embedding(config.vocab_size, self.kv_dim)
            self.value_lambda = nn.Parameter(torch.tensor(0.5))

    def heads(self, t, n_heads):  # (B, T, n_heads * hd) -> (B, n_heads, T, hd)
        return t.view(*t.shape[:2], n_heads, self.head_dim).transpose(1, 2)

    def forward(self, x, idx, first_value, kv_cache=None):
        # x is (B, T, C), idx the tokens (B, T) and first_value V_1 (None in the
        # first layer). Returns the output and this layer's value.
        B, T, C = x.size()
        parts = self.c_attn(x).split(self.split_sizes, dim=2)
        q, k = self.heads(parts[0], self.n_head), self.heads(parts[1], self.n_kv_head)
        v = self.heads(parts[2], self.n_kv_head) if self.owns_value else None

        # The value modes, one line each. The first layer (layer_idx 0) has no V_1
        # before it, so the modes that mix in V_1 start at the second layer.
        if self.value_mode == "value_embed":
            lam, e = self.value_lambda, self.heads(self.value_embed(idx), self.n_kv_head)
            value = (1 - lam) * v + lam * e.to(v.dtype)  # U_n = A_n ((1 - l) V_n + l E_n[x])
        elif self.layer_idx == 0 or self.value_mode == "vanilla":
            value = v  # U_n = A_n V_n
        elif self.value_mode == "resformer":
            lambda_1, lambda_2 = self.value_lambdas
            value = lambda_1 * first_value + lambda_2 * v  # U_n = A_n (l1 V_1 + l2 V_n)
        elif self.value_mode == "svformer":
            value = first_value  # U_n = A_n V_1
        else:
            raise NotImplementedError(f"value_mode {self.value_mode!r} has no line here")

        k_all, v_all = k, value  # the keys and values attended to: with a cache, all so far
        if kv_cache is not None:  # a layer without a value projection stores none
            k_all, v_all = kv_cache.store(self.layer_idx, k, value if self.owns_value else None)
        # Decoding one token (T == 1) attends to the whole cache: it needs no mask.
        # With fewer key/value heads than query heads (GQA), each serves a group.
        y = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=T > 1,
                                           dropout_p=self.dropout if self.training else 0.0,
                                           enable_gqa=self.n_kv_head != self.n_head)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # the heads side by side
        return self.resid_dropout(self.c_proj(y)), value


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, idx, first_value, kv_cache=None):
        attn_out, value = self.attn(self.ln_1(x), idx, first_value, kv_cache)
        x = x + attn_out
        x = x + self.mlp(self.ln_2(x))
        return x, value


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        rng = torch.get_rng_state()  # where this model's random draws start
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),  # GPT-2's learned positions
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying (GPT-2's)
        self.apply(self._init_weights)
        # GPT-2 scales the residual projections by 1/sqrt(2 * n_layer), so that the
        # sum of every layer's output stays about the same size at any depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        if config.value_mode != "vanilla":
            self.start_like_vanilla(rng)

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def start_like_vanilla(self, rng):
        # Pairing: each weight this mode shares with vanilla starts at vanilla's
        # value for the same random state (SVFormer's c_attn: vanilla's query and
        # key rows). Else a mode's extra or missing weights would shift every later
        # draw, and a difference between modes on one seed would be partly chance.
        torch.set_rng_state(rng)
        vanilla = GPT(replace(self.config, value_mode="vanilla", lambda_1=0.5, lambda_2=0.5,
                              learnable_lambda=False))
        shared = dict(vanilla.named_parameters())
        with torch.no_grad():  # a tensor of fewer rows (SVFormer's c_attn) takes the first
            for name, p in self.named_parameters():
                if name in shared and p.dim() and p.shape[1:] == shared[name].shape[1:]:
                    p.copy_(shared[name][:len(p)])

    def num_params(self):
        # nanoGPT's count: without the position table (the token table is the head).
        positions = self.transformer["wpe"].weight.numel() if "wpe" in self.transformer else 0
        return sum(p.numel() for p in self.parameters()) - positions

    def flops_per_token(self, seq_len):
        # Training FLOPs per token as nanoGPT's estimate_mfu counts (from PaLM): 6
        # per weight that multiplies, plus attention's 12 L C T. A lookup table
        # multiplies nothing, but the token table does, as the head.
        tables = sum(m.weight.numel() for name, m in self.named_modules()
                     if isinstance(m, nn.Embedding) and name != "transformer.wte")
        c = self.config
        return (6 * (sum(p.numel() for p in self.parameters()) - tables)
                + 12 * c.n_layer * c.n_embd * seq_len)

    @classmethod
    def from_checkpoint(cls, ckpt, device="cpu"):
        """The model train.py saved in ckpt, on device, in eval mode."""
        model = cls(GPTConfig.from_dict(ckpt["model_args"]))
        model.load_weights(ckpt["model"])
        return model.to(device).eval()

    def load_weights(self, state):
        # As load_state_dict, but weights of another model.py are one line naming them.
        mine = self.state_dict()
        differ = sorted(set(mine) ^ set(state)) + [k for k in mine if k in state and
                                                   mine[k].shape != state[k].shape]
        if differ:
            raise ValueError(f"it does not fit today's model.py ({', '.join(differ[:3])}"
                             f"{', ...' if len(differ) > 3 else ''}): other code trained it")
        self.load_state_dict(state)

    def hidden_states(self, idx, kv_cache=None):
        """The last layer's output, normalised (B, T, n_embd): lm_head's input."""
        T = idx.size(1)
        start = kv_cache.length if kv_cache is not None else 0
        # SDPA's causal mask needs the queries and the keys to start together.
        assert start == 0 or T == 1, "KVCache: only the first step may feed several tokens"
        assert start + T <= self.config.block_size, f"{start + T} tokens > block_size"
        pos = torch.arange(start, start + T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        first_value = None
        for block in self.transformer.h:
            x, value = block(x, idx, first_value, kv_cache)
            if first_value is None:
                first_value = value  # V_1: every later layer's gradient reaches it
        if kv_cache is not None:
            kv_cache.length += T  # every layer has stored these T tokens
        return self.transformer.ln_f(x)

    def forward(self, idx, targets=None, kv_cache=None):
        x = self.hidden_states(idx, kv_cache)
        if targets is None:  # generating: only the last position's logits are needed
            return self.lm_head(x[:, -1:, :]), None
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)

    def new_kv_cache(self, batch_size, max_len=None, dtype=None):
        # An empty cache on the model's device, by default in autocast's dtype.
        device = self.lm_head.weight.device
        if dtype is None:
            on = torch.is_autocast_enabled(device.type)
            dtype = torch.get_autocast_dtype(device.type) if on else self.lm_head.weight.dtype
        return KVCache(self.config, batch_size, max_len or self.config.block_size, device, dtype)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
        # idx (B, T) and max_new_tokens sampled after it (temperature 0: the
        # likeliest). With the cache each step feeds the newest token alone; without
        # it (nanoGPT's way) each step runs the whole context, cropped to block_size.
        cache = self.new_kv_cache(idx.size(0)) if use_cache else None
        for _ in range(max_new_tokens):
            if cache is not None and cache.length == self.config.block_size:
                cache.length = 0  # full: filled again from the cropped context
            cached = cache is not None and cache.length > 0
            logits, _ = self(idx[:, -1:] if cached else idx[:, -self.config.block_size:],
                             kv_cache=cache)
            logits = logits[:, -1, :].float()
            if temperature == 0:
                idx_next = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k:  # only the k likeliest tokens stay candidates
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("Inf")
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx

    def mixing_weights(self):
        # The learned mixing weights, for the log (more than two numbers: the mean).
        return {name if p.numel() <= 2 else f"{name}:mean":
                p.tolist() if p.numel() <= 2 else p.mean().item()
                for name, p in self.named_parameters()
                if name.rpartition(".")[2] in MIXING_WEIGHTS}

    def configure_optimizers(self, weight_decay, learning_rate, betas, lambda_lr_scale=1.0):
        # AdamW with nanoGPT's rule: matrices decay, vectors do not. Mixing weights
        # train without decay at lambda_lr_scale times the lr (train.py's lr_scale).
        decay, no_decay, mixing = [], [], []
        for name, p in self.named_parameters():
            if name.rpartition(".")[2] in MIXING_WEIGHTS:
                mixing.append(p)
            elif p.dim() >= 2:
                decay.append(p)
            else:
                no_decay.append(p)
        groups = [{"params": decay, "weight_decay": weight_decay, "lr_scale": 1.0},
                  {"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0}]
        if mixing:
            groups.append({"params": mixing, "weight_decay": 0.0, "lr_scale": lambda_lr_scale})
        fused = self.lm_head.weight.is_cuda or None  # one kernel on a GPU; else the default
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)
