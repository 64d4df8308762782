package indexed

import "fmt"

// FormatError reports a corrupt, truncated or inconsistent .idx/.bin file:
// which file, the byte offset where reading went wrong, and what was expected
// there.
type FormatError struct {
	File   string // path of the offending file
	Offset int64  // byte offset of the offending field
	Want   string // what the format requires at Offset
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("indexed: %s: at byte %d: want %s", e.File, e.Offset, e.Want)
}
