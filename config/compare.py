# compare.py's default: a model and schedule where the value residual's effect shows beyond seed
# noise on a 2-core CPU (chosen by a measured search, see README "Results"). Deep and narrow: the
# gain grows with depth. Byte-level Shakespeare (python prepare.py).
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
eval_interval = 200
eval_iters = 20
log_interval = 50
