# compare.py's default: a deep, narrow byte-level model on Shakespeare's plays (python
# prepare.py), 800 steps on a 2-core CPU. Its learning rate (2e-3) is below both variants' best:
# `python compare.py --tune` finds each one's best and compares there (README "Results").
out_dir = "out-compare"
dataset = "shakespeare_byte"
batch_size = 32
block_size = 64
n_layer = 16
n_head = 4
n_embd = 64
learning_rate = 2e-3
min_lr = 2e-4
max_iters = 800
lr_decay_iters = 0
warmup_iters = 50
# dense curves (41 points) for the in-run crossing: a cheap 4-batch estimate; the final
# number is the whole validation split
eval_interval = 20
eval_iters = 4
log_interval = 50
