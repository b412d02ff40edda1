# A demo for a class, 5-8 minutes on 2 cores: python compare.py config/demo.py
base = "compare.py"
# compare.py's preset (16 layers x 64 wide, byte-level plays, peak lr 8.5e-3) for half its steps
# (400) on one seed, four runs at once (on 2 cores they share): vanilla, the paper's lambda = 2
# mix (U = A (V_n + 2 V_1)), SVFormer, and value embeddings (what the GPT-2 speedrun replaced
# V_1 with). What to look for in out-demo/loss.png (redrawn every 30 s while they train): the
# lower panel, the gap to vanilla at each evaluation (below 0 = ahead of vanilla on the same
# seed), and where each curve leaves the early plateau (the triangles). How often each shows
# over seeds: README, "What a class will see". Paired statistics over three seeds (three times
# as long): --seeds=1337,1338,1339.
out_dir = "out-demo"
modes = "vanilla,resformer:lambda_1=2:lambda_2=1,svformer,value_embed"
lrs = "vanilla=8.5e-3,resformer:lambda_1=2:lambda_2=1=8.5e-3,svformer=8.5e-3,value_embed=1.69e-2"
seeds = "1337,"
jobs = 4
max_iters = 400
