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
