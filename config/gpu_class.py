# vanilla, lambda = 2, learned lambdas, SVFormer, value embeddings on 3 seeds, on FineWeb-Edu
# One GPU: those five and the noise floor (16 runs), in GPT-2 tokens of FineWeb-Edu:
#   python -m lab.fineweb config/gpu_class.py   # 1 train shard (100M tokens), the val tokens
#   python compare.py config/gpu_class.py
# 6 layers x 384 wide (10.6M parameters beside 19.3M of token embedding; value embeddings add 6
# tables, 116M more), windows of 512 tokens, 16 x 512 x 4 micro-steps = 32,768 tokens a step,
# 1,500 steps = 49M tokens a run (none seen twice). All variants at one peak lr, untuned: the
# paper's protocol (a fair comparison first runs --tune). Memory (python -m lab.memory
# config/gpu_class.py): 16 x 4 fits a 16 GB T4 with room to spare (value embeddings: about 7.8
# GiB a step); on a 40 or 80 GB card 64 x 1 runs faster, the same tokens a step.
# Time, all in (estimates until a GPU measures them; the README's "On a GPU"): 1.7e17 FLOPs with
# the loss estimates and whole-split passes, at an assumed 25% MFU, and 26 minutes of starts,
# compiles and 240 checkpoints: 38 min on an H100 (a class period), 62 on an A100, 1.6 hours on
# an RTX 4090, 3.1 on an RTX 3090 or A10G, 3.3 on a T4.
dataset = "fineweb_edu_gpt2_1shard"  # lab.fineweb's dataset of its one train shard
out_dir = "out-gpu-class"
modes = "vanilla,resformer:lambda_1=2:lambda_2=1,resformer_learnable,svformer,value_embed"
seeds = "1,2,3"
batch_size = 16
gradient_accumulation_steps = 4
block_size = 512
n_layer = 6
n_head = 6
n_embd = 384
learning_rate = 1e-3
min_lr = 1e-4
lrs = ""
warmup_iters = 100
max_iters = 1500
lr_decay_iters = 0
eval_interval = 100
eval_iters = 20
log_interval = 50
escape_loss = 0.0
analysis_samples = 16
compile = True
