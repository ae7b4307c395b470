import os

# Compiled DaCe programs use OpenMP; tests run in parallel workers (pytest -n 2), so keep one thread each.
os.environ["OMP_NUM_THREADS"] = "1"
