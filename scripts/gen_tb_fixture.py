#!/usr/bin/env python3
"""TensorBoard fixture for issue 20 item 7 (tests/e2e/test_tb_plot.c): runs a tiny fixed-seed
`suanli train --tensorboard-dir` and reads the event file back with the `tensorboard` package's
EventAccumulator (the reader TensorBoard itself uses), so the fixture says what TensorBoard sees.

    pip install tensorboard
    python3 scripts/gen_tb_fixture.py build/suanli      # writes tests/fixtures/tb/scalars.json

The run (recorded in the fixture; the C test repeats it from there): the first CORPUS_BYTES bytes of
data/tinyshakespeare.txt, byte tokenizer, ARGS below, one thread and SUANLI_ISA=avx2, so the float32 values
are the same on AVX2 and AVX-512 hosts. scalars: tag -> [[step, value], ...] for the deterministic tags
('lm loss', 'lm loss validation', 'learning-rate', 'grad-norm'); 'tokens-per-sec' is wall-clock, so the
fixture only lists it among the tags TensorBoard found (all_tags).
"""
import json
import os
import subprocess
import sys
import tempfile

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(HERE, "..")
OUT = os.path.join(REPO, "tests", "fixtures", "tb", "scalars.json")
CORPUS_BYTES = 20000
ARGS = ("--num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --micro-batch-size 2 "
        "--train-iters 8 --eval-interval 4 --eval-iters 2 --lr-warmup-iters 2 --seed 1234 --threads 1")
ENV = {"SUANLI_ISA": "avx2", "OMP_NUM_THREADS": "1"}
DETERMINISTIC = ["lm loss", "lm loss validation", "learning-rate", "grad-norm"]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_tb_fixture.py PATH/TO/suanli")
    cli = os.path.abspath(sys.argv[1])
    env = dict(os.environ, **ENV)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(REPO, "data", "tinyshakespeare.txt"), "rb") as f:
            corpus = f.read(CORPUS_BYTES)
        with open(os.path.join(tmp, "small.txt"), "wb") as f:
            f.write(corpus)
        data, tb = os.path.join(tmp, "data"), os.path.join(tmp, "tb")
        subprocess.run([cli, "data", "prepare", "--input", os.path.join(tmp, "small.txt"), "--output-prefix",
                        data, "--tokenizer-type", "byte"], check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run([cli, "train", "--data-path", data, *ARGS.split(), "--tensorboard-dir", tb], check=True,
                       env=env, stdout=subprocess.DEVNULL)
        acc = EventAccumulator(tb, size_guidance={"scalars": 0})
        acc.Reload()
        tags = sorted(acc.Tags()["scalars"])
        scalars = {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in DETERMINISTIC}
    fixture = {"corpus_bytes": CORPUS_BYTES, "args": ARGS, "env": ENV, "all_tags": tags, "scalars": scalars}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        # repr of a Python float of a float32 value round-trips exactly through strtod + (float)
        head = {k: v for k, v in fixture.items() if k != "scalars"}
        f.write(json.dumps(head, indent=1)[:-2] + ',\n "scalars": {\n')
        f.write(",\n".join(f"  {json.dumps(t)}: {json.dumps(v)}" for t, v in scalars.items()))
        f.write("\n }\n}\n")
    print(f"wrote {OUT}: {', '.join(f'{t} ({len(v)})' for t, v in scalars.items())}; all tags: {tags}")


if __name__ == "__main__":
    main()
