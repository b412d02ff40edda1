# The demo for a class, 3 to 5 minutes on 2 CPU cores: python compare.py config/demo.py
base = "compare.py"
# compare.py's default (16 layers x 64 wide, byte-level plays, 250 steps, each variant at its own
# tuned peak lr) on one seed: vanilla, the paper's lambda = 2 mix (U = A (V_n + 2 V_1)) and
# SVFormer, and vanilla once more with its initial weights nudged one float32 rounding step (what
# another CPU does). Four runs at once (on 2 cores they share). One seed is one draw: beside each
# difference, out-demo/loss.png draws where the same difference fell on the 20 seeds of the
# calibration below (their runs are committed with the commands that made them), and results.md
# says what held on every seed, and whether this seed fell inside.
out_dir = "out-demo"
seeds = "1337"
jobs = 4
calibration = "docs/results/demo_calibration,docs/results/demo_heldout"
