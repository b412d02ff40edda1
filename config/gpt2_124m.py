# GPT-2 small (124M) on FineWeb-Edu GPT-2 shards, one GPU, bf16, torch.compile, flash attention
# (SDPA):
#   python -m lab.fineweb --train_shards=99   # all of sample-10BT, already in GPT-2 tokens
#   python train.py config/gpt2_124m.py --value_mode=resformer
# Schedule of llm.c's GPT-2 124M run: 2**19 = 524,288 tokens per step (32 x 1024 x 16 micro-
# steps), 19,073 steps = 10B tokens (FineWeb-Edu sample-10BT), peak lr 6e-4 after 700 warmup
# steps, cosine to 6e-5 (nanoGPT's min_lr), AdamW (0.9, 0.95), weight decay 0.1, clip 1.0.
# gradient_accumulation_steps is the total per step: under torchrun with N GPUs each rank does
# 16/N (N must divide 16), so a step stays 524,288 tokens:
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2_124m.py
# Memory (python -m lab.memory config/gpt2_124m.py; estimates until measured on the GPU, which
# bench.py --gpu_check compares): train.py halves batch_size and doubles the micro-steps until a
# step fits, the same 524,288 tokens a step. batch_size x micro-steps (GiB a step):
#   GPU                          vanilla (124M)      value_embed (587M)
#   T4 (16 GB)                   8 x 64 (9.3)        4 x 128 (12.7)
#   24 GB (L4, A10G, RTX 3090)   16 x 32 (16.4)      8 x 64 (16.5)
#   A100 40 GB                   32 x 16 (30.8)      16 x 32 (23.9)
#   80 GB (A100, H100)           32 x 16 (30.8)      32 x 16 (38.8)
out_dir = "out-gpt2"
dataset = "fineweb_edu_gpt2"
batch_size = 32
block_size = 1024
gradient_accumulation_steps = 16
n_layer = 12
n_head = 12
n_embd = 768
bias = True
learning_rate = 6e-4
min_lr = 6e-5
warmup_iters = 700
max_iters = 19073
lr_decay_iters = 19073
weight_decay = 0.1
eval_interval = 250
eval_iters = 20
log_interval = 10
compile = True
