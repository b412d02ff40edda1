"""One GPT, four value modes (Value Residual Learning, arXiv 2410.17897, and what came after).

    vanilla      U_n = A_n V_n
    resformer    U_n = A_n (lambda_1 V_1 + lambda_2 V_n)      for n >= 2 (official: 0.5, 0.5)
    svformer     U_n = A_n V_1                                for n >= 2 (no value projection)
    value_embed  U_n = A_n ((1 - lambda_n) V_n + lambda_n E_n[x])   every n (GPT-2 speedrun)

A_n: layer n's causal attention; V_n: its values (V_1: the first layer's); E_n[x]: layer n's
table row for token x (modded-nanogpt, 2024-12-04). The rest is nanoGPT's GPT-2 plus
grouped-query attention (`n_kv_head`) and a KV cache that stores SVFormer's one value once.
"""
import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

# The value modes. A mode of your own: its name here, its weights in CausalSelfAttention.__init__
# and its line in CausalSelfAttention.forward; every script takes it from there.
VALUE_MODES = ("vanilla", "resformer", "svformer", "value_embed")
# Learned weights that mix values, by attribute name: they step at lambda_lr_scale x the lr with
# no weight decay (decay would pull a mix toward 0), and the log shows them. Add yours here.
MIXING_WEIGHTS = ("value_lambdas", "value_lambda")


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 rounded up to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int = 0  # key/value heads for grouped-query attention; 0 means n_head (kv_heads)
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # in Linears and LayerNorms, like GPT-2; False is a bit better and faster
    value_mode: str = "vanilla"  # one of VALUE_MODES
    lambda_1: float = 0.5  # resformer's mix: the official code's 0.5 / 0.5
    lambda_2: float = 0.5  # the paper's sweep U_n = A_n (V_n + lambda V_1): lambda_2 = 1
    learnable_lambda: bool = False  # resformer: per-layer lambdas trained, starting from the above

    def __post_init__(self):
        """Every check of the model's settings, so that every script refuses the same mistakes."""
        if self.value_mode not in VALUE_MODES:
            raise ValueError(f"value_mode must be one of {', '.join(VALUE_MODES)}, "
                             f"got {self.value_mode!r}")
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_kv_head < 0 or self.n_head % self.kv_heads != 0:
            raise ValueError(f"n_head ({self.n_head}) must be a multiple of "
                             f"n_kv_head ({self.n_kv_head})")
        # ResFormer's mix; a mode of your own that uses these: add it to this check
        if self.value_mode != "resformer" and (self.learnable_lambda or
                                               (self.lambda_1, self.lambda_2) != (0.5, 0.5)):
            raise ValueError("lambda_1, lambda_2 and learnable_lambda only apply to "
                             "value_mode=resformer (model.py's GPTConfig checks it)")

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def kv_heads(self):
        return self.n_kv_head or self.n_head  # n_kv_head 0: one key/value head per query head

    def value_layer(self, layer):
        """The layer whose value `layer` attends to: its own, or for SVFormer the first's (V_1)."""
        return 0 if self.value_mode == "svformer" else layer

    @classmethod
    def from_dict(cls, d):
        names = {f.name for f in fields(cls)}  # d may hold other keys too (a training config)
        return cls(**{k: v for k, v in d.items() if k in names})


class KVCache:
    """Preallocated keys for every layer and values for the layers attended to (value_layer), so
    SVFormer's cache really holds L+1 tensors, not 2L. Layers store(); GPT.forward advances it."""

    def __init__(self, config, batch_size, max_len, device, dtype):
        shape = (batch_size, config.kv_heads, max_len, config.head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(config.n_layer)]
        self.value_layer = [config.value_layer(n) for n in range(config.n_layer)]
        self.values = {n: torch.zeros(shape, device=device, dtype=dtype)
                       for n in set(self.value_layer)}
        self.max_len, self.length = max_len, 0  # tokens stored so far, in every layer

    def store(self, layer, k, v):
        """Append k (and v, unless None); return all the keys and values this layer attends to."""
        start, end = self.length, self.length + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KVCache holds {self.max_len} tokens; {end} do not fit")
        self.keys[layer][:, :, start:end] = k
        if v is not None:
            self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[self.value_layer[layer]][:, :, :end]

    def nbytes(self):  # the one count of a cache's size (sample.py, bench.py, the lab)
        return sum(t.numel() * t.element_size() for t in self.keys + list(self.values.values()))


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx, self.value_mode = layer_idx, config.value_mode
        self.n_head, self.n_kv_head = config.n_head, config.kv_heads
        self.head_dim, self.kv_dim = config.head_dim, config.kv_heads * config.head_dim
        self.owns_value = config.value_layer(layer_idx) == layer_idx  # svformer: layer 1 alone
        # one matmul for q, k (and v): output sizes n_embd + kv_dim (+ kv_dim)
        self.split_sizes = [config.n_embd, self.kv_dim] + ([self.kv_dim] if self.owns_value else [])
        self.c_attn = nn.Linear(config.n_embd, sum(self.split_sizes), bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.dropout = config.dropout
        if config.value_mode == "resformer" and layer_idx > 0:
            lambdas = torch.tensor([config.lambda_1, config.lambda_2])
            if config.learnable_lambda:  # a mixing weight (MIXING_WEIGHTS)
                self.value_lambdas = nn.Parameter(lambdas)
            else:
                self.register_buffer("value_lambdas", lambdas)
        if config.value_mode == "value_embed":  # per layer: a table of values, and its mix
            self.value_embed = nn.Embedding(config.vocab_size, self.kv_dim)
            self.value_lambda = nn.Parameter(torch.tensor(0.5))

    def heads(self, t, n_heads):
        return t.view(*t.shape[:2], n_heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)

    def forward(self, x, idx, first_value, kv_cache=None):
        """x (B, T, C), tokens idx (B, T), V_1 (None in layer 1) -> (output, this layer's value)."""
        B, T, C = x.size()
        parts = self.c_attn(x).split(self.split_sizes, dim=2)  # q: n_head heads, k and v: n_kv_head
        q, k = self.heads(parts[0], self.n_head), self.heads(parts[1], self.n_kv_head)
        v = self.heads(parts[2], self.n_kv_head) if self.owns_value else None  # None: no W_V here

        # The value modes, in key/value-head space (values get no positional signal). Layer 1
        # has no V_1 before it, so a mode that mixes in V_1 starts at layer 2 (the second branch).
        if self.value_mode == "value_embed":  # every layer, the first one too
            lam, table = self.value_lambda, self.heads(self.value_embed(idx), self.n_kv_head)
            value = (1 - lam) * v + lam * table.to(v.dtype)  # U_n = A_n ((1 - l) V_n + l E_n[x])
        elif self.layer_idx == 0 or self.value_mode == "vanilla":
            value = v  # U_n = A_n V_n
        elif self.value_mode == "resformer":
            lambda_1, lambda_2 = self.value_lambdas
            value = lambda_1 * first_value + lambda_2 * v  # U_n = A_n (l1 V_1 + l2 V_n)
        elif self.value_mode == "svformer":
            value = first_value  # U_n = A_n V_1
        else:
            raise NotImplementedError(f"value_mode {self.value_mode!r} has no line here yet")

        attended_value = value
        if kv_cache is not None:  # only a layer that owns its value stores it (svformer: V_1)
            k, attended_value = kv_cache.store(self.layer_idx, k,
                                               value if self.owns_value else None)
        # T == 1 decoding attends to the whole cache, so no mask; otherwise causal. With fewer
        # key/value heads than query heads (GQA) SDPA shares each among its group of queries.
        y = F.scaled_dot_product_attention(q, k, attended_value, is_causal=T > 1,
                                           dropout_p=self.dropout if self.training else 0.0,
                                           enable_gqa=self.n_kv_head != self.n_head)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
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
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),  # positions: used in forward only
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as GPT-2
        self.apply(self._init_weights)
        # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer) so the stream stays O(1)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def num_params(self, non_embedding=True):
        """Parameters, by default without the learned positions (the token table is the head)."""
        n = sum(p.numel() for p in self.parameters())
        wpe = self.transformer["wpe"] if "wpe" in self.transformer else None  # (RoPE has none)
        return n - wpe.weight.numel() if non_embedding and wpe is not None else n

    def flops_per_token(self, seq_len):
        """Training FLOPs per token, PaLM's count as nanoGPT's estimate_mfu: 6 per weight that
        multiplies, plus attention's 12 L C T. A lookup table (positions, value embeddings)
        multiplies nothing; the token table does, as the output head."""
        tables = sum(m.weight.numel() for name, m in self.named_modules()
                     if isinstance(m, nn.Embedding) and name != "transformer.wte")
        c = self.config
        return (6 * (sum(p.numel() for p in self.parameters()) - tables)
                + 12 * c.n_layer * c.n_embd * seq_len)

    @classmethod
    def from_checkpoint(cls, ckpt, device="cpu"):
        """A trained model from train.py's checkpoint, in eval mode."""
        model = cls(GPTConfig.from_dict(ckpt["model_args"]))
        model.load_weights(ckpt["model"])
        return model.to(device).eval()

    def load_weights(self, state):
        """load_state_dict; the weights of another model.py: one line naming what differs."""
        mine = self.state_dict()
        differ = sorted(set(mine) ^ set(state)) + [k for k in mine if k in state and
                                                   mine[k].shape != state[k].shape]
        if differ:
            raise ValueError(f"it does not fit today's model.py ({', '.join(differ[:3])}"
                             f"{', ...' if len(differ) > 3 else ''}): other code trained it")
        self.load_state_dict(state)

    def hidden_states(self, idx, kv_cache=None):
        """The last layer's normalised output (B, T, n_embd): what lm_head turns into logits."""
        B, T = idx.size()
        start = kv_cache.length if kv_cache is not None else 0
        if start > 0 and T > 1:  # SDPA's causal mask assumes queries and keys start together
            raise ValueError("KVCache: only the first (prefill) step may feed several tokens")
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens exceeds "
                             f"block_size {self.config.block_size}")
        # Learned positions, GPT-2's: a vector per position added to each token's. (RoPE instead
        # rotates q and k in every layer: the README's recipe replaces this line and wpe.)
        pos = torch.arange(start, start + T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        first_value = None
        for block in self.transformer.h:
            x, value = block(x, idx, first_value, kv_cache)
            if first_value is None:
                first_value = value  # V_1, not detached: all layers' gradients reach layer 1's W_V
        if kv_cache is not None:
            kv_cache.length += T  # once every layer has stored these T tokens
        return self.transformer.ln_f(x)

    def forward(self, idx, targets=None, kv_cache=None):
        """(logits, loss) given targets; without, (the last position's logits, None)."""
        x = self.hidden_states(idx, kv_cache)
        if targets is None:  # generating: only the next token's logits are needed
            return self.lm_head(x[:, -1:, :]), None
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)

    def new_kv_cache(self, batch_size, max_len=None, dtype=None):
        """An empty cache on the model's device; dtype defaults to the model's (or autocast's)."""
        param = self.lm_head.weight
        if dtype is None:
            on_autocast = torch.is_autocast_enabled(param.device.type)
            dtype = torch.get_autocast_dtype(param.device.type) if on_autocast else param.dtype
        return KVCache(self.config, batch_size, max_len or self.config.block_size,
                       param.device, dtype)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
        """idx (B, T) followed by max_new_tokens sampled tokens (temperature 0: the likeliest).
        With the cache a step feeds only the newest token and attends to the stored keys and
        values; without it (nanoGPT's way) every step runs the whole context again. Past
        block_size the context is cropped, and the cache refilled from it."""
        cache = self.new_kv_cache(idx.size(0)) if use_cache else None
        for _ in range(max_new_tokens):
            if cache is not None and 0 < cache.length < self.config.block_size:
                logits, _ = self(idx[:, -1:], kv_cache=cache)
            else:
                if cache is not None:
                    cache.length = 0  # (re)filled from the cropped context
                logits, _ = self(idx[:, -self.config.block_size:], kv_cache=cache)
            logits = logits[:, -1, :].float()
            if temperature == 0:
                idx_next = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:  # only the k likeliest tokens stay candidates
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("Inf")
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx

    def mixing_weights(self):
        """{name: value} of the learned mixing weights, for the log (more than 2 numbers: mean)."""
        return {name if p.numel() <= 2 else f"{name}:mean":
                p.tolist() if p.numel() <= 2 else p.mean().item()
                for name, p in self.named_parameters() if name.rpartition(".")[2] in MIXING_WEIGHTS}

    def configure_optimizers(self, weight_decay, learning_rate, betas, lambda_lr_scale=1.0):
        """AdamW in groups, each with its "lr_scale" (train.py multiplies the lr by it): matrices
        decay (nanoGPT's rule), vectors do not, and a mixing weight steps at lambda_lr_scale x lr
        without decay: it scales a layer's values, and Adam moves a scalar about lr a step."""
        groups = {"decay": [], "no_decay": [], "mixing": []}
        for name, p in self.named_parameters():
            groups["mixing" if name.rpartition(".")[2] in MIXING_WEIGHTS else
                   "decay" if p.dim() >= 2 else "no_decay"].append(p)
        settings = {"decay": (weight_decay, 1.0), "no_decay": (0.0, 1.0),
                    "mixing": (0.0, lambda_lr_scale)}
        return torch.optim.AdamW([{"params": groups[kind], "weight_decay": decay, "lr_scale": scale}
                                  for kind, (decay, scale) in settings.items()
                                  if groups[kind] or kind != "mixing"],
                                 lr=learning_rate, betas=betas,
                                 fused=self.lm_head.weight.is_cuda or None)  # one kernel on GPUs
