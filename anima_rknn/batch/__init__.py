"""`anima-rknn batch`: many jobs (prompts x seeds) into one folder, resumable, locally or over a Ray cluster.

jobs (the jobs file, job ids) -> a runner (local: one warm worker in this process; ray_runner: one actor per
worker slot) -> worker (a loaded pipeline: PNG bytes and the result record) -> results (the folder, written by
the driver alone).
"""
