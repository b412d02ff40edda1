# GPT-2 small (124M) on FineWeb-Edu in GPT-2 tokens, one GPU, bf16, torch.compile, SDPA:
#   python -m lab.fineweb config/gpt2_124m.py   # the 99 train shards it reads (about 20 GB)
#   python train.py config/gpt2_124m.py --value_mode=resformer
# Schedule of llm.c's GPT-2 124M run: 2**19 = 524,288 tokens per step (32 x 1024 x 16 micro-
# steps), 19,073 steps = 10B tokens (FineWeb-Edu sample-10BT: 99 shards hold 9.9B, so the run
# sees them 1.01 times), peak lr 6e-4 after 700 warmup steps, cosine to 6e-5 (nanoGPT's min_lr),
# AdamW (0.9, 0.95), weight decay 0.1, clip 1.0. gradient_accumulation_steps is the total per
# step: under torchrun with N GPUs each rank does 16/N (N must divide 16), so a step stays
# 524,288 tokens:
#   torchrun --standalone --nproc_per_node=8 train.py config/gpt2_124m.py
# As written, 32 x 16 fits an 80 GB card (and a 40 GB one for vanilla). On a smaller card give
# the batch that fits, the same tokens a step (python -m lab.memory config/gpt2_124m.py prints
# these estimates; bench.py --gpu_check measures a step's peak against them); a resume keeps its
# batch. batch_size x gradient_accumulation_steps (GiB a training step):
#   GPU                          vanilla (124M)      value_embed (587M)
#   16 GB (T4)                   8 x 64 (9.6)        4 x 128 (10.9)
#   24 GB (L4, A10G, RTX 3090)   16 x 32 (17.5)      8 x 64 (15.0)
#   40 GB (A100)                 32 x 16 (33.4)      16 x 32 (23.3)
#   80 GB (A100, H100)           32 x 16 (33.4)      32 x 16 (39.7)
# Time: 8.6e18 FLOPs at 40% MFU, with 8 minutes of start, compile, evaluations and 77
# checkpoints: about 6 hours on an H100, 19 on an A100, 36 on an RTX 4090 (estimates).
out_dir = "out-gpt2"
dataset = "fineweb_edu_gpt2_99shards"  # lab.fineweb's dataset of all 99
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
