// Package ckpt saves and loads gotron training checkpoints (format v1,
// single process) in Megatron-LM's directory layout:
//
//	<save>/latest_checkpointed_iteration.txt   "100"
//	<save>/iter_0000100/checkpoint.json        metadata, file sizes and CRC-32Cs
//	<save>/iter_0000100/model.safetensors      one safetensors file per tensor group
//	<save>/iter_0000100/optimizer.safetensors
//
// A Checkpoint is named tensor groups (Groups["model"], Groups["optimizer"],
// ...) plus Meta: iteration, consumed samples and the caller's opaque JSON
// for args, RNG and scheduler state. The package knows nothing about models.
//
// Save is crash-safe: it writes everything under a temporary directory in
// the same parent, fsyncs every file and the directory, renames it into
// place, and only then replaces the tracker file (temp file, fsync, rename,
// fsync). Killed at any instant, the save directory still holds the previous
// checkpoint, loadable, and never a half-written one under a final name.
// Leftover temporary directories are ignored by Load and removed by the next
// Save. A single process may save into a directory at a time.
//
// Load verifies what it reads (format version, every listed file present
// with the recorded size and CRC-32C, every header valid), and
// Checkpoint.Expect compares the tensors with what the caller's model
// expects, naming each mismatching tensor, its shape and dtype.
package ckpt
