#!/usr/bin/env bash
# Recreate every generated graph committed in graphs/ (the paper's workloads). Run from anywhere; needs ho-plan
# installed (pip install -e .). Generation is deterministic: the same command gives the same file.
set -euo pipefail
cd "$(dirname "$0")"
ho-plan generate llama3-8b-no1 -o llama3-8b-no1.json
ho-plan generate llama3-8b-no2 --layers 4 -o llama3-8b-no2-4layers.json
ho-plan generate deepseek-v3-paper -o deepseek-v3-paper.json
ho-plan generate deepseek-v3-nsa-64k --first-layer 3 --layers 1 -o deepseek-v3-nsa-64k-L3-1layer.json
ho-plan generate deepseek-v3-nsa-128k --first-layer 3 --layers 1 -o deepseek-v3-nsa-128k-L3-1layer.json
