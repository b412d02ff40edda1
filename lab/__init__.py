"""The lab: what compare.py needs beyond the lesson. runs (train.py per variant and seed, side by
side, reused or resumed), analysis (the measures), tables (results.md/json), plots (pictures)."""
