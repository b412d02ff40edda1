# The CPU quickstart, spelled out: these are train.py's defaults (test_train.py keeps them equal).
# Byte-level Shakespeare (python prepare.py), a small ResFormer: about 4 minutes on 2 quiet cores.
# Copy this file to start your own experiment: python train.py config/my_experiment.py
out_dir = "out"
dataset = "shakespeare_byte"
batch_size = 12
block_size = 64
n_layer = 4
n_head = 4
n_embd = 128
value_mode = "resformer"  # or "vanilla" / "svformer"
learning_rate = 3e-3  # the best of 3e-3, 4e-3, 5e-3 at 6000 steps (docs/RESULTS.md)
max_iters = 6000
lr_decay_iters = 0  # 0: the cosine ends at max_iters
warmup_iters = 100
min_lr = 3e-4
eval_interval = 500
eval_iters = 20
log_interval = 100
compile = False
