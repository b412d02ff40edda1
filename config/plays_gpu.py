# A first GPU run on the embedded plays, nothing to download: about 3 minutes on an A100-class
# card (an estimate: nanoGPT's shakespeare_char, the same model, batch and steps on characters,
# takes about 3 there). python prepare.py && python train.py config/plays_gpu.py
# 6 layers x 384, windows of 256 bytes, 64 a step, 5,000 steps (82M tokens, 18 passes over the
# 4.5M bytes of the training plays: dropout 0.2 keeps it from memorising them), ResFormer.
out_dir = "out-plays-gpu"
dataset = "shakespeare_byte"
batch_size = 64
block_size = 256
n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2
value_mode = "resformer"
learning_rate = 1e-3
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100
max_iters = 5000
lr_decay_iters = 5000
eval_interval = 250
eval_iters = 200
log_interval = 10
compile = True
