package tensorboard

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// The test decoder below is written from the TFRecord and event.proto
// definitions, independently of the writer: its own CRC masking, its own
// framing checks, a field-by-field protowire parse that rejects anything
// unexpected.

// testMask is TFRecord's CRC mask, spelled out separately from MaskedCRC.
func testMask(b []byte) uint32 {
	crc := crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli))
	return (crc>>15 | crc<<17) + 0xa282ead8
}

// readTFRecords splits an event file into record payloads, verifying both
// CRCs of every record.
func readTFRecords(b []byte) ([][]byte, error) {
	var out [][]byte
	for off := 0; off < len(b); {
		if len(b)-off < 12 {
			return nil, fmt.Errorf("offset %d: %d bytes left, want a 12-byte header", off, len(b)-off)
		}
		n := binary.LittleEndian.Uint64(b[off:])
		if got, want := binary.LittleEndian.Uint32(b[off+8:]), testMask(b[off:off+8]); got != want {
			return nil, fmt.Errorf("offset %d: length CRC %#x, want %#x", off, got, want)
		}
		off += 12
		if n > uint64(len(b)-off-4) || len(b)-off < 4 {
			return nil, fmt.Errorf("offset %d: record of %d bytes overruns the file", off, n)
		}
		data := b[off : off+int(n)]
		off += int(n)
		if got, want := binary.LittleEndian.Uint32(b[off:]), testMask(data); got != want {
			return nil, fmt.Errorf("offset %d: data CRC %#x, want %#x", off, got, want)
		}
		off += 4
		out = append(out, data)
	}
	return out, nil
}

// testEvent is the part of tensorflow.Event the writer produces.
type testEvent struct {
	wallTime    float64
	step        int64
	fileVersion string
	tags        []string
	values      []float32
}

// parseEvent decodes an Event, rejecting unknown fields and wrong wire types.
func parseEvent(b []byte) (testEvent, error) {
	var ev testEvent
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ev, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.Fixed64Type:
			v, n := protowire.ConsumeFixed64(b)
			if n < 0 {
				return ev, protowire.ParseError(n)
			}
			ev.wallTime, b = math.Float64frombits(v), b[n:]
		case num == 2 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return ev, protowire.ParseError(n)
			}
			ev.step, b = int64(v), b[n:]
		case num == 3 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return ev, protowire.ParseError(n)
			}
			ev.fileVersion, b = string(v), b[n:]
		case num == 5 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return ev, protowire.ParseError(n)
			}
			if err := parseSummary(v, &ev); err != nil {
				return ev, err
			}
			b = b[n:]
		default:
			return ev, fmt.Errorf("unexpected Event field %d (wire type %d)", num, typ)
		}
	}
	return ev, nil
}

// parseSummary decodes Summary{repeated Value value = 1} with Value{string
// tag = 1; float simple_value = 2}.
func parseSummary(b []byte, ev *testEvent) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num != 1 || typ != protowire.BytesType {
			return fmt.Errorf("unexpected Summary field %d (wire type %d)", num, typ)
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return protowire.ParseError(m)
		}
		b = b[n+m:]
		var tag string
		var val float32
		for len(v) > 0 {
			num, typ, n := protowire.ConsumeTag(v)
			if n < 0 {
				return protowire.ParseError(n)
			}
			v = v[n:]
			switch {
			case num == 1 && typ == protowire.BytesType:
				s, n := protowire.ConsumeBytes(v)
				if n < 0 {
					return protowire.ParseError(n)
				}
				tag, v = string(s), v[n:]
			case num == 2 && typ == protowire.Fixed32Type:
				x, n := protowire.ConsumeFixed32(v)
				if n < 0 {
					return protowire.ParseError(n)
				}
				val, v = math.Float32frombits(x), v[n:]
			default:
				return fmt.Errorf("unexpected Summary.Value field %d (wire type %d)", num, typ)
			}
		}
		ev.tags, ev.values = append(ev.tags, tag), append(ev.values, val)
	}
	return nil
}

// readEventFile decodes a whole event file.
func readEventFile(t *testing.T, path string) []testEvent {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := readTFRecords(raw)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	evs := make([]testEvent, len(recs))
	for i, r := range recs {
		if evs[i], err = parseEvent(r); err != nil {
			t.Fatalf("%s: record %d: %v", path, i, err)
		}
	}
	return evs
}

// fixedClock ticks one second per call from a fixed start.
func fixedClock() func() time.Time {
	t := time.Unix(1700000000, 250_000_000)
	return func() time.Time {
		t = t.Add(time.Second)
		return t
	}
}

// TestScalarsReadBack writes Megatron's scalars and reads them back with the
// independent decoder: the file_version record first, then one Event per
// AddScalar with its wall time, step, tag and float32 value.
func TestScalarsReadBack(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tb", "run1") // created by New
	w, err := New(dir, WithClock(fixedClock()), WithHostname("node7"))
	if err != nil {
		t.Fatal(err)
	}
	wantName := fmt.Sprintf(`^events\.out\.tfevents\.1700000001\.node7\.%d$`, os.Getpid())
	if !regexp.MustCompile(wantName).MatchString(filepath.Base(w.Path())) {
		t.Errorf("file name %s, want %s", filepath.Base(w.Path()), wantName)
	}
	type scalar struct {
		tag   string
		value float64
		step  int64
	}
	in := []scalar{
		{TagLMLoss, 10.881470680236816, 1},
		{VsSamples(TagLMLoss), 10.881470680236816, 8},
		{TagLearningRate, 5e-4, 1},
		{TagGradNorm, 0.737, 2},
		{TagLossScale, 65536, 2},
		{TagLMLossValidation, 4.850419, 300},
		{TagLMLossValidationPPL, math.Exp(4.850419), 300},
		{"step zero", -1.5, 0},
		{"huge step", math.Inf(1), 1 << 40},
	}
	for _, s := range in {
		if err := w.AddScalar(s.tag, s.value, s.step); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	evs := readEventFile(t, w.Path())
	if len(evs) != len(in)+1 {
		t.Fatalf("%d events, want %d", len(evs), len(in)+1)
	}
	if first := evs[0]; first.fileVersion != "brain.Event:2" || first.wallTime != 1700000001.25 || len(first.tags) != 0 {
		t.Errorf("first event %+v, want file_version brain.Event:2 at 1700000001.25", first)
	}
	for i, s := range in {
		ev := evs[i+1]
		if len(ev.tags) != 1 || ev.tags[0] != s.tag || ev.values[0] != float32(s.value) || ev.step != s.step || ev.fileVersion != "" {
			t.Errorf("event %d: %+v, want tag %q value %g step %d", i+1, ev, s.tag, float32(s.value), s.step)
		}
		if want := 1700000002.25 + float64(i); ev.wallTime != want {
			t.Errorf("event %d: wall time %f, want %f", i+1, ev.wallTime, want)
		}
	}
}

// TestDecoderDetectsEveryCorruptedByte flips one bit in each byte of a
// written file in turn; the test decoder must refuse each (a CRC or framing
// error), so the round trip above proves the framing rather than assuming it.
func TestDecoderDetectsEveryCorruptedByte(t *testing.T) {
	w, err := New(t.TempDir(), WithClock(fixedClock()), WithHostname("h"))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddScalar(TagLMLoss, 3.25, 7); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(w.Path())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readTFRecords(raw); err != nil {
		t.Fatalf("intact file refused: %v", err)
	}
	for i := range raw {
		bad := append([]byte(nil), raw...)
		bad[i] ^= 0x10
		if _, err := readTFRecords(bad); err == nil {
			t.Errorf("byte %d corrupted: not detected", i)
		}
	}
	if _, err := readTFRecords(raw[:len(raw)-1]); err == nil {
		t.Error("truncated file: not detected")
	}
}

// TestMaskedCRCCheckValue anchors the CRC to CRC-32C's published check value
// (0xE3069283 for "123456789") and the TFRecord mask.
func TestMaskedCRCCheckValue(t *testing.T) {
	const crc = 0xE3069283
	if got := crc32.Checksum([]byte("123456789"), crc32.MakeTable(crc32.Castagnoli)); got != crc {
		t.Fatalf("CRC-32C check value %#x, want %#x", got, crc)
	}
	want := uint32((crc>>15|crc<<17)&0xffffffff) + 0xa282ead8
	if got := MaskedCRC([]byte("123456789")); got != want {
		t.Errorf("MaskedCRC %#x, want %#x", got, want)
	}
}

// TestFlushPublishesRecords checks the write-then-flush contract: scalars
// reach the file at Flush, not at AddScalar.
func TestFlushPublishesRecords(t *testing.T) {
	w, err := New(t.TempDir(), WithClock(fixedClock()), WithHostname("h"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if n := len(readEventFile(t, w.Path())); n != 1 {
		t.Fatalf("new file: %d records, want the file_version record only", n)
	}
	if err := w.AddScalar(TagBatchSize, 8, 1); err != nil {
		t.Fatal(err)
	}
	if n := len(readEventFile(t, w.Path())); n != 1 {
		t.Errorf("before Flush: %d records on disk, want 1", n)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := len(readEventFile(t, w.Path())); n != 2 {
		t.Errorf("after Flush: %d records on disk, want 2", n)
	}
}

// TestErrorsNameTheFile checks the error paths: an unusable directory, an
// empty tag, use after Close, and a second writer in the same second.
func TestErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "not-a-dir")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(file); err == nil || !strings.Contains(err.Error(), file) {
		t.Errorf("New on a file: error %v, want one naming %s", err, file)
	}
	w, err := New(dir, WithClock(fixedClock()), WithHostname("h"))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddScalar("", 1, 1); err == nil || !strings.Contains(err.Error(), w.Path()) {
		t.Errorf("empty tag: error %v, want one naming %s", err, w.Path())
	}
	// Same clock and host: the second file gets a ".1" suffix.
	w2, err := New(dir, WithClock(fixedClock()), WithHostname("h"))
	if err != nil {
		t.Fatal(err)
	}
	if w2.Path() != w.Path()+".1" {
		t.Errorf("second writer: %s, want %s.1", w2.Path(), w.Path())
	}
	for _, x := range []*Writer{w, w2} {
		if err := x.Close(); err != nil {
			t.Fatal(err)
		}
		if err := x.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		err := x.AddScalar(TagLMLoss, 1, 1)
		if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), x.Path()) {
			t.Errorf("AddScalar after Close: %v, want ErrClosed naming %s", err, x.Path())
		}
		if err := x.Flush(); !errors.Is(err, ErrClosed) {
			t.Errorf("Flush after Close: %v, want ErrClosed", err)
		}
	}
}

// TestMegatronTagNames checks the tag helpers against the strings
// training.py builds: key + " vs samples", "<key> validation[-set][ ppl]".
func TestMegatronTagNames(t *testing.T) {
	cases := []struct{ got, want string }{
		{VsSamples(TagLMLoss), "lm loss vs samples"},
		{VsSamples(TagLearningRate), "learning-rate vs samples"},
		{ValidationTag("lm loss", ""), TagLMLossValidation},
		{ValidationPPLTag("lm loss", ""), TagLMLossValidationPPL},
		{ValidationTag("lm loss", "wiki"), "lm loss validation-wiki"},
		{VsSamples(ValidationPPLTag("lm loss", "")), "lm loss validation ppl vs samples"},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%q, want %q", c.got, c.want)
		}
	}
	seen := map[string]bool{}
	for _, tag := range MegatronTags() {
		if tag == "" || seen[tag] {
			t.Errorf("MegatronTags: empty or repeated tag %q", tag)
		}
		seen[tag] = true
	}
}
