# A 5-minute demo for a class on 2 CPU cores: python compare.py config/demo.py
base = "compare.py"
# compare.py's preset (16 layers x 64 wide, byte-level plays, every variant at peak lr 8.5e-3)
# for 250 steps on one seed: vanilla, the paper's lambda = 2 mix (U = A (V_n + 2 V_1)) and
# SVFormer, and vanilla once more with its initial weights nudged one float32 rounding step: how
# far rounding alone moves a run (the grey band), so the class sees which gaps are more than
# that. Four runs at once (on 2 cores they share). What to look for in out-demo/loss.png, redrawn
# every 30 s while they train: the lower panel, each variant's gap to vanilla on the same seed,
# against the grey band; and where each curve leaves the early plateau (the triangles). One seed
# is one draw: the demo claims no loss difference (another seed moves them more than the band:
# README, "What a class will see"); --seeds=1337,1338,1339 gives an interval, 3 times as long.
out_dir = "out-demo"
modes = "vanilla,resformer:lambda_1=2:lambda_2=1,svformer"
lrs = "vanilla=8.5e-3,resformer:lambda_1=2:lambda_2=1=8.5e-3,svformer=8.5e-3"
seeds = "1337"
jobs = 4
max_iters = 250
