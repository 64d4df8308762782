#!/bin/sh
# Builds, on a machine without a GPU, everything tools/gpu/check.sh runs on
# one: the gotron binary and the test binaries of the GPU tests, static
# (CGO_ENABLED=0, stripped, gzipped) into .gpu/, which the device tool
# carries.
set -eu
cd "$(dirname "$0")/../.."
out=.gpu
rm -rf "$out"
mkdir -p "$out"
export CGO_ENABLED=0
flags='-ldflags=-s -w'
go build "$flags" -o "$out/gotron" ./cmd/gotron
for pkg in internal/cuda comm/nccl tensor/backendtest model/gpt train infer; do
	name=$(echo "$pkg" | tr / _)
	go test -c "$flags" -o "$out/$name.test" "./$pkg"
done
# The device tool carries at most 64 MiB: the binaries travel gzipped
# (about 80 MiB as built, a third of it compressed) and check.sh unpacks
# them on the GPU machine.
gzip -9 "$out/gotron" "$out"/*.test
cp tools/gpu/check.sh tools/gpu/peer_gpt2.py tools/gpu/peer_attn.py "$out/"
du -sh "$out"/*
du -sh "$out"
