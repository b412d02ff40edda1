# A 5-minute demo for a class: python compare.py config/demo.py
# compare's default for half its steps (400) on one seed: vanilla, the official ResFormer
# (0.5 / 0.5), the paper's lambda = 2 mix and SVFormer, the same preset (16 layers x 64 wide,
# byte-level plays, peak lr 8.5e-3), four runs at once (on 2 cores they share). What to look
# for in out-demo/loss.png: the lower panel, the gap to vanilla at each evaluation (below 0 =
# ahead of vanilla on the same seed), and where each curve leaves the early plateau (the
# triangles). How often each shows over seeds: README, "What a class will see". More seeds:
# --seeds=3 (paired statistics with an interval; three times as long).
out_dir = "out-demo"
modes = "vanilla,resformer,resformer:lambda_1=2:lambda_2=1,svformer"
seeds = "1"
jobs = 4
less_data = 0.0
dataset = "shakespeare_byte"
batch_size = 32
block_size = 64
n_layer = 16
n_head = 4
n_embd = 64
learning_rate = 8.5e-3
min_lr = 8.5e-4
max_iters = 400
lr_decay_iters = 0
warmup_iters = 50
eval_interval = 20
eval_iters = 4
log_interval = 50
lrs = "vanilla=8.5e-3,resformer=8.5e-3,resformer:lambda_1=2:lambda_2=1=8.5e-3,svformer=8.5e-3"
