package tensorboard

import (
	"encoding/binary"
	"hash/crc32"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// FileVersion is the file_version of an event file's first Event.
const FileVersion = "brain.Event:2"

// crcMaskDelta is TFRecord's masking constant.
const crcMaskDelta = 0xa282ead8

// MaskedCRC is TFRecord's masked CRC-32C (Castagnoli) of b: the CRC rotated
// right by 15 bits plus 0xa282ead8.
func MaskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli))
	return ((c >> 15) | (c << 17)) + crcMaskDelta
}

// appendRecord appends data framed as one TFRecord to dst.
func appendRecord(dst, data []byte) []byte {
	var head [12]byte
	binary.LittleEndian.PutUint64(head[:8], uint64(len(data)))
	binary.LittleEndian.PutUint32(head[8:], MaskedCRC(head[:8]))
	dst = append(dst, head[:]...)
	dst = append(dst, data...)
	return binary.LittleEndian.AppendUint32(dst, MaskedCRC(data))
}

// Event field numbers (tensorflow/core/util/event.proto).
const (
	eventWallTime    protowire.Number = 1 // double
	eventStep        protowire.Number = 2 // int64
	eventFileVersion protowire.Number = 3 // string
	eventSummary     protowire.Number = 5 // Summary
	summaryValue     protowire.Number = 1 // repeated Summary.Value
	valueTag         protowire.Number = 1 // string
	valueSimpleValue protowire.Number = 2 // float
)

// appendFileVersionEvent appends the first Event of a file:
// {wall_time, file_version: "brain.Event:2"}.
func appendFileVersionEvent(dst []byte, wallTime float64) []byte {
	dst = protowire.AppendTag(dst, eventWallTime, protowire.Fixed64Type)
	dst = protowire.AppendFixed64(dst, math.Float64bits(wallTime))
	dst = protowire.AppendTag(dst, eventFileVersion, protowire.BytesType)
	return protowire.AppendString(dst, FileVersion)
}

// appendScalarEvent appends an Event holding one scalar summary value. As a
// proto3 encoder, it leaves out a zero step.
func appendScalarEvent(dst []byte, wallTime float64, step int64, tag string, value float32) []byte {
	var v []byte // Summary.Value
	v = protowire.AppendTag(v, valueTag, protowire.BytesType)
	v = protowire.AppendString(v, tag)
	v = protowire.AppendTag(v, valueSimpleValue, protowire.Fixed32Type)
	v = protowire.AppendFixed32(v, math.Float32bits(value))

	dst = protowire.AppendTag(dst, eventWallTime, protowire.Fixed64Type)
	dst = protowire.AppendFixed64(dst, math.Float64bits(wallTime))
	if step != 0 {
		dst = protowire.AppendTag(dst, eventStep, protowire.VarintType)
		dst = protowire.AppendVarint(dst, uint64(step))
	}
	dst = protowire.AppendTag(dst, eventSummary, protowire.BytesType)
	// Summary{value: [v]}: one length-delimited field around v.
	dst = protowire.AppendVarint(dst, uint64(protowire.SizeTag(summaryValue)+protowire.SizeBytes(len(v))))
	dst = protowire.AppendTag(dst, summaryValue, protowire.BytesType)
	return protowire.AppendBytes(dst, v)
}
