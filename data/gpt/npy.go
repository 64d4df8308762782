package gpt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// npyMagic starts every .npy file.
const npyMagic = "\x93NUMPY"

// npyArray is a decoded little-endian integer .npy array, widened to int64.
type npyArray struct {
	descr string // '<i2', '<i4', '<u4', '<i8'
	shape []int
	data  []int64
}

// npyHeader renders numpy.save's version-1.0 header (numpy ≥ 1.23: 21
// digits of growth space for the first axis, padded to 64 bytes).
func npyHeader(descr string, shape []int) []byte {
	dims := make([]string, len(shape))
	for i, d := range shape {
		dims[i] = strconv.Itoa(d)
	}
	shp := "(" + strings.Join(dims, ", ")
	if len(shape) == 1 {
		shp += ","
	}
	shp += ")"
	h := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shp)
	if len(shape) > 0 {
		h += strings.Repeat(" ", max(0, 21-len(dims[0])))
	}
	pad := 64 - (len(npyMagic)+2+2+len(h)+1)%64
	h += strings.Repeat(" ", pad) + "\n"
	var b bytes.Buffer
	b.WriteString(npyMagic)
	b.Write([]byte{1, 0})
	_ = binary.Write(&b, binary.LittleEndian, uint16(len(h)))
	b.WriteString(h)
	return b.Bytes()
}

// writeNpy saves values with the given dtype and shape, like numpy.save.
func writeNpy(path, descr string, shape []int, values []int64) error {
	var size int
	switch descr {
	case "<i2":
		size = 2
	case "<i4", "<u4":
		size = 4
	case "<i8":
		size = 8
	default:
		return fmt.Errorf("gpt: writeNpy %s: unsupported dtype %s", path, descr)
	}
	buf := npyHeader(descr, shape)
	buf = append(make([]byte, 0, len(buf)+size*len(values)), buf...)
	le := binary.LittleEndian
	for _, v := range values {
		switch size {
		case 2:
			buf = le.AppendUint16(buf, uint16(v))
		case 4:
			buf = le.AppendUint32(buf, uint32(v))
		case 8:
			buf = le.AppendUint64(buf, uint64(v))
		}
	}
	return writeAtomic(path, buf)
}

// writeAtomic writes data to a uniquely named temporary file next to path
// and renames it into place, so readers never see a half-written file and
// ranks building the same cache at once cannot interleave their writes.
func writeAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("gpt: write cache: %w", err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("gpt: write cache: %w", err)
	}
	return nil
}

var (
	npyDescr = regexp.MustCompile(`'descr':\s*'([<|=]?[iu][1248])'`)
	npyShape = regexp.MustCompile(`'shape':\s*\(([0-9,\s]*)\)`)
	npyOrder = regexp.MustCompile(`'fortran_order':\s*(True|False)`)
)

// readNpy loads a little-endian integer .npy file written by numpy.save or
// writeNpy.
func readNpy(path string) (*npyArray, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gpt: read cache: %w", err)
	}
	bad := func(what string) error { return fmt.Errorf("gpt: cache file %s: %s", path, what) }
	if len(raw) < 10 || string(raw[:6]) != npyMagic {
		return nil, bad("not a .npy file (bad magic)")
	}
	var hlen, start int
	switch raw[6] {
	case 1:
		hlen, start = int(binary.LittleEndian.Uint16(raw[8:])), 10
	case 2, 3:
		if len(raw) < 12 {
			return nil, bad("truncated header")
		}
		hlen, start = int(binary.LittleEndian.Uint32(raw[8:])), 12
	default:
		return nil, bad(fmt.Sprintf("unsupported .npy version %d", raw[6]))
	}
	if start+hlen > len(raw) {
		return nil, bad("truncated header")
	}
	h := string(raw[start : start+hlen])
	d, s, o := npyDescr.FindStringSubmatch(h), npyShape.FindStringSubmatch(h), npyOrder.FindStringSubmatch(h)
	if d == nil || s == nil || o == nil || o[1] != "False" {
		return nil, bad(fmt.Sprintf("unsupported header %q (want a C-order little-endian integer array)", h))
	}
	a := &npyArray{descr: "<" + strings.TrimLeft(d[1], "<|="), shape: nil}
	n := 1
	for _, f := range strings.Split(s[1], ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil {
			return nil, bad("bad shape")
		}
		a.shape = append(a.shape, v)
		n *= v
	}
	size := int(a.descr[2] - '0')
	body := raw[start+hlen:]
	if len(body) != n*size {
		return nil, bad(fmt.Sprintf("%d data bytes, want %d for shape %v of %s", len(body), n*size, a.shape, a.descr))
	}
	a.data = make([]int64, n)
	le := binary.LittleEndian
	signed := a.descr[1] == 'i'
	for i := range a.data {
		switch size {
		case 1:
			a.data[i] = int64(body[i])
			if signed {
				a.data[i] = int64(int8(body[i]))
			}
		case 2:
			a.data[i] = int64(le.Uint16(body[2*i:]))
			if signed {
				a.data[i] = int64(int16(le.Uint16(body[2*i:])))
			}
		case 4:
			a.data[i] = int64(le.Uint32(body[4*i:]))
			if signed {
				a.data[i] = int64(int32(le.Uint32(body[4*i:])))
			}
		case 8:
			a.data[i] = int64(le.Uint64(body[8*i:]))
		}
	}
	return a, nil
}
