package tokenizer

import (
	"encoding/json"
	"testing"
)

// TestNormalizationForms: NFC, NFD, NFKC and NFKD equal Python's
// unicodedata on every decomposable code point (in runs of 64), Hangul,
// stacked and reordered combining marks and composition exclusions.
func TestNormalizationForms(t *testing.T) {
	var cases []map[string]string
	if err := json.Unmarshal(readTestdata(t, "norm.json.gz"), &cases); err != nil {
		t.Fatal(err)
	}
	forms := map[string]func(string) string{"NFC": normNFC, "NFD": normNFD, "NFKC": normNFKC, "NFKD": normNFKD}
	bad := 0
	for _, c := range cases {
		for name, f := range forms {
			if got := f(c["in"]); got != c[name] {
				if bad++; bad <= 5 {
					t.Errorf("%s(%+q) = %+q, want %+q", name, c["in"], got, c[name])
				}
			}
		}
	}
	if len(cases) < 300 {
		t.Fatalf("only %d cases", len(cases))
	}
	if got := normNFC("a\xffe\u0301"); got != "a\xff\u00e9" {
		t.Errorf("invalid byte: %+q", got)
	}
	if got := stripAccents("Café Ångström"); got != "Cafe Angstrom" {
		t.Errorf("stripAccents = %q", got)
	}
}
