// Package tensorboard writes TensorBoard event files, the scalars Megatron's
// --tensorboard-dir gets from torch.utils.tensorboard.SummaryWriter.
//
// An event file is a sequence of TFRecords, each framing one serialized
// tensorflow.Event protocol buffer:
//
//	uint64 length (little endian)
//	uint32 masked CRC-32C of the 8 length bytes
//	length bytes of data (the Event)
//	uint32 masked CRC-32C of the data
//
// where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (uint32 arithmetic)
// and CRC-32C is the Castagnoli polynomial. The first record is an Event
// with wall_time and file_version "brain.Event:2"; every scalar is an Event
// with wall_time (field 1, double), step (field 2, int64) and summary
// (field 5) holding one Summary.Value (tag, field 1; simple_value, field 2,
// float), as SummaryWriter.add_scalar writes it. The protocol buffers are
// encoded by hand with protowire: no generated code.
//
// The tag names Megatron's training loop writes are the Tag* constants; see
// each for when Megatron writes it.
package tensorboard
