# vanilla, ResFormer lambda_1 = 2 and SVFormer, 16 x 64 on the plays, 250 steps, 8 seeds (34 min)
# compare.py's default: a deep, narrow byte-level model on Shakespeare's plays (python prepare.py),
# 250 steps on 8 seeds: vanilla, ResFormer lambda_1 = 2 (U = A (V_n + 2 V_1)) and SVFormer,
# each at its own best peak lr (8.5e-3 for all three: a search on four seeds used for nothing
# else, its best inside the grid; docs/RESULTS.md), 34 minutes on 2 cores. Short runs on many
# seeds, not long ones on few: on three seeds a t-interval turned one seed's rounding into the
# opposite verdict on another CPU; on these 8 each verdict held at 1 and 2 threads, on its seeds
# and on 8 new ones (docs/RESULTS.md, "The default comparison, checked"). Whether a gain
# lasts: --max_iters=2400 (docs/results/size_curve). ResFormer lambda_1 = lambda_2 = 0.5, the
# official mix: --modes=vanilla,resformer.
# The variants and seeds are compare.py's own defaults; this preset holds the setting they train
# in, and each variant's own peak lr.
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
# dense curves (13 points) for the gap along the run and the plateau's exit: a cheap 4-batch
# estimate; the final number is the whole validation split
eval_interval = 20
eval_iters = 4
log_interval = 50
