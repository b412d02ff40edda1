# One GPU, one class period: vanilla, ResFormer (lambda = 2, and learnable lambdas), SVFormer and
# value embeddings on 3 seeds, plus the noise floor (16 runs), on GPT-2 tokens of FineWeb-Edu:
#   python -m lab.fineweb     # 100M train tokens and 10M val tokens (about 220 MB): minutes
#   python compare.py config/gpu_class.py
# 6 layers x 384 wide: 10.6M
# parameters beside 19.3M of token embedding (value embeddings add 6 tables: 116M more), windows
# of 512 tokens, 64 x 512 = 32,768 tokens a step, 1,500 steps = 49M tokens a run (100M train
# tokens: none seen twice). All variants at one peak lr, untuned: the paper's protocol (a fair
# comparison first runs --tune). TARGETS, not yet measured (no GPU in our CI): about 2 minutes a
# run (bf16, compiled, about 600k tokens/s) and 30 minutes in all on one A100-class GPU; one
# train.py run on a T4 (float16) in about 10 minutes. Memory (python -m lab.memory
# config/gpu_class.py): about 22 GiB at 64 x 512, so on a T4 or a 24 GB card train.py runs
# 32 x 2 micro-steps, the same tokens a step. Checked end to end on the CPU at a reduced size:
# tests/test_gpu_ready.py.
dataset = "fineweb_edu_gpt2"
out_dir = "out-gpu-class"
modes = "vanilla,resformer:lambda_1=2:lambda_2=1,resformer_learnable,svformer,value_embed"
seeds = "1,2,3"
batch_size = 64
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
