# The demo for a class, about 4 minutes on 2 CPU cores: python compare.py config/demo.py
# compare.py's default setting (config/compare.py: 16 layers x 64 wide, byte-level plays, 250
# steps, each variant at its own tuned peak lr) on one seed: vanilla, ResFormer lambda_1 = 2
# (lambda_2 = 1: U = A (V_n + 2 V_1)) and SVFormer, and vanilla once more with its initial
# weights nudged one float32 rounding step (what another CPU does). Four runs at once (on 2 cores
# they share); compare.py says what each is doing every 30 s, the final evaluation too. One
# seed is one draw: beside each difference, out-demo/loss.png draws where the same difference
# fell on the 20 seeds of the calibration below (their runs are committed with the commands that
# made them), and results.md says what held on every seed, and whether this seed fell inside.
# The settings below the first four are config/compare.py's (tests/test_style.py keeps them so).
out_dir = "out-demo"
seeds = "1337"
jobs = 4
calibration = "docs/results/demo_calibration,docs/results/demo_heldout"
dataset = "shakespeare_byte"
batch_size = 32
block_size = 64
n_layer = 16
n_head = 4
n_embd = 64
learning_rate = 8.5e-3
min_lr = 8.5e-4
lrs = "vanilla=8.5e-3,resformer=8.5e-3,resformer:lambda_1=2:lambda_2=1=8.5e-3,svformer=8.5e-3,value_embed=1.69e-2"
max_iters = 250
lr_decay_iters = 0
warmup_iters = 50
eval_interval = 20
eval_iters = 4
log_interval = 50
