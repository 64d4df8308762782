package tokenizer

import (
	"encoding/binary"
	"fmt"
	"math"

	"google.golang.org/protobuf/encoding/protowire"
)

// SentencePiece piece types (sentencepiece_model.proto).
const (
	spNormal      = 1
	spUnknown     = 2
	spControl     = 3
	spUserDefined = 4
	spUnused      = 5
	spByte        = 6
)

// SentencePiece model types (TrainerSpec.ModelType).
const (
	spUnigram = 1
	spBPE     = 2
)

// spPiece is one vocabulary entry of a .model file.
type spPiece struct {
	piece string
	score float32
	typ   int
}

// spModel is the part of a SentencePiece ModelProto the encoder needs,
// with the proto's defaults.
type spModel struct {
	pieces       []spPiece
	modelType    int
	byteFallback bool
	unkID        int
	bosID        int
	eosID        int
	padID        int
	unkSurface   string
	treatWSAsSuf bool
	// NormalizerSpec
	charsmap        []byte
	addDummyPrefix  bool
	removeExtraWS   bool
	escapeWS        bool
	normalizerName  string
	hasDenormalizer bool
}

// parseSPModel decodes a serialized sentencepiece ModelProto.
func parseSPModel(b []byte) (*spModel, error) {
	m := &spModel{modelType: spUnigram, unkID: 0, bosID: 1, eosID: 2, padID: -1,
		unkSurface: " \u2047 ", addDummyPrefix: true, removeExtraWS: true, escapeWS: true}
	err := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch num {
		case 1:
			p := spPiece{typ: spNormal}
			if err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch num {
				case 1:
					p.piece = string(v)
				case 2:
					p.score = math.Float32frombits(uint32(x))
				case 3:
					p.typ = int(x)
				}
				return nil
			}); err != nil {
				return fmt.Errorf("piece %d: %w", len(m.pieces), err)
			}
			m.pieces = append(m.pieces, p)
		case 2:
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch num {
				case 3:
					m.modelType = int(x)
				case 24:
					m.treatWSAsSuf = x != 0
				case 35:
					m.byteFallback = x != 0
				case 40:
					m.unkID = int(int32(x))
				case 41:
					m.bosID = int(int32(x))
				case 42:
					m.eosID = int(int32(x))
				case 43:
					m.padID = int(int32(x))
				case 44:
					m.unkSurface = string(v)
				}
				return nil
			})
		case 3:
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch num {
				case 1:
					m.normalizerName = string(v)
				case 2:
					m.charsmap = v
				case 3:
					m.addDummyPrefix = x != 0
				case 4:
					m.removeExtraWS = x != 0
				case 5:
					m.escapeWS = x != 0
				}
				return nil
			})
		case 5:
			m.hasDenormalizer = len(v) > 0
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(m.pieces) == 0 {
		return nil, fmt.Errorf("no pieces (is this a SentencePiece .model file?)")
	}
	return m, nil
}

// eachField calls f for every field of a protobuf message: v holds the bytes
// of length-delimited fields, x the value of varint and fixed fields.
func eachField(b []byte, f func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("bad protobuf tag: %w", protowire.ParseError(n))
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var x32 uint32
			x32, n = protowire.ConsumeFixed32(b)
			x = uint64(x32)
		case protowire.Fixed64Type:
			x, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := f(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}

// charsmap is sentencepiece's precompiled normalization map: a Darts-clone
// double-array trie over input bytes whose values index NUL-terminated
// replacement strings.
type charsmap struct {
	units []uint32
	norm  []byte
}

func parseCharsmap(b []byte) (*charsmap, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) < 4 {
		return nil, fmt.Errorf("precompiled_charsmap: %d bytes, want ≥ 4", len(b))
	}
	size := int(binary.LittleEndian.Uint32(b))
	if size%4 != 0 || 4+size > len(b) {
		return nil, fmt.Errorf("precompiled_charsmap: trie size %d does not fit in %d bytes", size, len(b))
	}
	c := &charsmap{units: make([]uint32, size/4), norm: b[4+size:]}
	for i := range c.units {
		c.units[i] = binary.LittleEndian.Uint32(b[4+4*i:])
	}
	return c, nil
}

// longest returns the replacement for the longest rule matching a prefix of
// s and the rule's length in bytes, or n = 0.
func (c *charsmap) longest(s string) (repl string, n int) {
	u := c.units
	offset := func(x uint32) uint32 { return (x >> 10) << ((x & (1 << 9)) >> 6) }
	if len(u) == 0 {
		return "", 0
	}
	pos := offset(u[0])
	for i := 0; i < len(s); i++ {
		pos ^= uint32(s[i])
		if int(pos) >= len(u) {
			break
		}
		x := u[pos]
		if x&((1<<31)|0xFF) != uint32(s[i]) { // label
			break
		}
		pos ^= offset(x)
		if (x>>8)&1 != 0 && int(pos) < len(u) { // has leaf
			v := int(u[pos] & (1<<31 - 1))
			if v < len(c.norm) {
				end := v
				for end < len(c.norm) && c.norm[end] != 0 {
					end++
				}
				repl, n = string(c.norm[v:end]), i+1
			}
		}
	}
	return repl, n
}
