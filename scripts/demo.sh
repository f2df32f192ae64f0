#!/usr/bin/env bash
# The main job: build, tokenize the bundled tinyshakespeare (byte level), train the demo GPT-2 on all
# cores for a fixed time budget, report val loss (nats per byte) and print a sample.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh demo
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSL_BUILD_TESTS=OFF >/dev/null
cmake --build build
./build/suanli data prepare --input data/tinyshakespeare.txt --output-prefix out/shakespeare-byte --tokenizer-type byte
# a fresh run refuses a --save that holds an earlier run: the demo replaces its own previous one
rm -rf out/demo
./build/suanli train --config configs/demo.json --data-path out/shakespeare-byte --save out/demo
./build/suanli plot out/demo --title "suanli demo: GPT-2 on tinyshakespeare (byte level)"
echo "loss curves: $(pwd)/out/demo/loss.svg (train loss, val loss, tokens/s, learning rate)"
