# The demo for a class, 3 to 5 minutes on 2 CPU cores: python compare.py config/demo.py
base = "compare.py"
# compare.py's preset (16 layers x 64 wide, byte-level plays, each variant at its own tuned peak
# lr, the preset's lrs) for 250 steps on one seed: vanilla, the paper's lambda = 2 mix
# (U = A (V_n + 2 V_1)) and SVFormer, and vanilla once more with its initial weights nudged one
# float32 rounding step (what another CPU does: the grey band). Four runs at once (on 2 cores
# they share). One seed is one draw: beside each difference, out-demo/loss.png draws where the
# same difference fell on the 10 seeds of the calibration below (their runs are committed; the
# command that made them is in its results.md), and results.md says what held on every seed.
out_dir = "out-demo"
modes = "vanilla,resformer:lambda_1=2:lambda_2=1,svformer"
lrs = "vanilla=8.5e-3,resformer:lambda_1=2:lambda_2=1=8.5e-3,svformer=8.5e-3"
seeds = "1337"
jobs = 4
max_iters = 250
calibration = "docs/results/demo_calibration"
