# pytest settings for every test file. The test models are tiny: one CPU thread runs them as fast
# as several, and avoids the thread thrashing that makes a busy 2-core machine many times slower.
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported; subprocesses inherit it

import torch  # noqa: E402

torch.set_num_threads(1)
