# The CPU quickstart, spelled out: these are train.py's defaults (test_train.py keeps them equal).
# Byte-level Shakespeare (python prepare.py), a deep, narrow model, ~5 minutes on 2 CPU cores.
# Copy this file to start your own experiment: python train.py config/my_experiment.py
out_dir = "out"
dataset = "shakespeare_byte"
batch_size = 32
block_size = 128
n_layer = 12
n_head = 4
n_embd = 128
value_mode = "vanilla"  # or "resformer" / "svformer"
learning_rate = 2e-3
max_iters = 500
lr_decay_iters = 500
warmup_iters = 50
min_lr = 2e-4
eval_interval = 100
eval_iters = 20
compile = False
