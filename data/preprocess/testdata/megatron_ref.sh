#!/bin/sh
# Regenerates the mg_* goldens by running Megatron-LM's own
# tools/preprocess_data.py (d98e8a6) with a byte tokenizer stub. CI never
# runs it. Usage: sh megatron_ref.sh MEGATRON_CHECKOUT
# Needs /usr/bin/python3 with numpy and torch. Only indexed_dataset.py (and
# two modules it imports) and preprocess_data.py come from Megatron; the
# tokenizer and argument helpers are replaced by stub/ (see stub/README).
set -eu
MLM=$1
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
mkdir -p "$WORK/megatron/core/datasets" "$WORK/tools"
cp -r "$HERE/stub/megatron" "$WORK/"
cp "$MLM/megatron/core/datasets/indexed_dataset.py" "$MLM/megatron/core/datasets/object_storage_utils.py" "$WORK/megatron/core/datasets/"
cp "$MLM/megatron/core/msc_utils.py" "$WORK/megatron/core/"
cp "$MLM/tools/preprocess_data.py" "$WORK/tools/"
cp "$HERE/input.jsonl" "$WORK/"
cd "$WORK"
run() { /usr/bin/python3 tools/preprocess_data.py --tokenizer-type ByteStub "$@" >/dev/null 2>&1; }
run --input input.jsonl --output-prefix mg_plain --workers 2 --json-keys text
run --input input.jsonl --output-prefix mg_eod --workers 3 --json-keys text title --append-eod
# Megatron reuses existing partition files (<input>_0.jsonl ...), so each
# partitioned run gets its own copy of the input.
cp input.jsonl part.jsonl
run --input part.jsonl --output-prefix mg_part --workers 2 --partitions 2 --append-eod
cp input.jsonl seq.jsonl
run --input seq.jsonl --output-prefix mg_seq --workers 2 --partitions 2 --keep-sequential-samples --append-eod
for f in mg_*_document.bin mg_*_document.idx; do
  case $f in *_[0-9]_*) ;; *) cp "$f" "$HERE/" ;; esac
done
rm -rf "$WORK"
