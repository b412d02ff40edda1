# compare.py's default: the model and schedule with the largest ResFormer gain in a measured search
# on a 2-core CPU. Deep and narrow, byte-level Shakespeare (python prepare.py). README "Results":
# ResFormer wins on every seed, but 3 seeds do not put the 95% interval below 0, and lr 2e-3 is
# below vanilla's best (at 6e-3 both modes are better and the gain is gone).
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
