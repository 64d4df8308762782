package gpt

import (
	"fmt"
	"strings"
)

// The string settings of Config are typed enums: parsed once where flags,
// YAML, Hugging Face configs or Megatron checkpoint args are read, compared
// as values everywhere else. Each marshals as Megatron's spelling (the
// spelling checkpoints record), and each zero value is Megatron's default.

// Activation is the MLP's activation function.
type Activation uint8

const (
	GELU        Activation = iota // exact (erf) GELU, Megatron's default
	GELUTanh                      // tanh-approximated GELU (--openai-gelu, GPT-2's)
	SwiGLU                        // --swiglu: fc1 outputs [gate; up], 2·FFNHiddenSize rows
	SquaredReLU                   // --squared-relu: relu(x)² (Megatron's squared_relu)
)

var activationNames = []string{GELU: "gelu", GELUTanh: "gelu_tanh", SwiGLU: "swiglu", SquaredReLU: "squared_relu"}

// ParseActivation parses "gelu", "gelu_tanh", "swiglu" or "squared_relu".
func ParseActivation(s string) (Activation, error) {
	i, err := parseEnum(activationNames, s)
	if err != nil {
		return 0, fmt.Errorf("activation %q: %v (set by --swiglu, --openai-gelu or --squared-relu)", s, err)
	}
	return Activation(i), nil
}

// String returns Megatron's spelling.
func (a Activation) String() string { return enumString("Activation", activationNames, a) }
func (a Activation) valid() bool    { return int(a) < len(activationNames) }

// MarshalText writes String's spelling; a value outside the enum is an error.
func (a Activation) MarshalText() ([]byte, error) {
	return marshalEnum("activation", activationNames, a)
}

// UnmarshalText parses ParseActivation's spellings; empty text is the zero
// value (configs saved before the field had a default).
func (a *Activation) UnmarshalText(b []byte) error {
	return unmarshalEnum(a, b, ParseActivation)
}

// Normalization is the layer norm (--normalization).
type Normalization uint8

const (
	LayerNorm Normalization = iota // Megatron's default
	RMSNorm
)

var normalizationNames = []string{LayerNorm: "LayerNorm", RMSNorm: "RMSNorm"}

// ParseNormalization parses --normalization: "LayerNorm" or "RMSNorm".
func ParseNormalization(s string) (Normalization, error) {
	i, err := parseEnum(normalizationNames, s)
	if err != nil {
		return 0, fmt.Errorf("--normalization=%q: %v", s, err)
	}
	return Normalization(i), nil
}

// String returns Megatron's spelling.
func (n Normalization) String() string { return enumString("Normalization", normalizationNames, n) }
func (n Normalization) valid() bool    { return int(n) < len(normalizationNames) }

// MarshalText writes String's spelling; a value outside the enum is an error.
func (n Normalization) MarshalText() ([]byte, error) {
	return marshalEnum("--normalization", normalizationNames, n)
}

// UnmarshalText parses ParseNormalization's spellings; empty text is the
// zero value.
func (n *Normalization) UnmarshalText(b []byte) error {
	return unmarshalEnum(n, b, ParseNormalization)
}

// Set makes *Normalization a flag.Value (--normalization); the flag
// package names the flag in its error.
func (n *Normalization) Set(s string) error {
	i, err := parseEnum(normalizationNames, s)
	if err == nil {
		*n = Normalization(i)
	}
	return err
}

// PositionEmbeddingType is --position-embedding-type.
type PositionEmbeddingType uint8

const (
	LearnedAbsolute     PositionEmbeddingType = iota // a learned table, Megatron's default
	RoPE                                             // rotary embeddings
	NoPositionEmbedding                              // "none"
)

var positionEmbeddingNames = []string{LearnedAbsolute: "learned_absolute", RoPE: "rope", NoPositionEmbedding: "none"}

// ParsePositionEmbeddingType parses --position-embedding-type:
// "learned_absolute", "rope" or "none".
func ParsePositionEmbeddingType(s string) (PositionEmbeddingType, error) {
	i, err := parseEnum(positionEmbeddingNames, s)
	if err != nil {
		return 0, fmt.Errorf("--position-embedding-type=%q: %v", s, err)
	}
	return PositionEmbeddingType(i), nil
}

// String returns Megatron's spelling.
func (p PositionEmbeddingType) String() string {
	return enumString("PositionEmbeddingType", positionEmbeddingNames, p)
}

func (p PositionEmbeddingType) valid() bool { return int(p) < len(positionEmbeddingNames) }

// MarshalText writes String's spelling; a value outside the enum is an error.
func (p PositionEmbeddingType) MarshalText() ([]byte, error) {
	return marshalEnum("--position-embedding-type", positionEmbeddingNames, p)
}

// UnmarshalText parses ParsePositionEmbeddingType's spellings; empty text
// is the zero value.
func (p *PositionEmbeddingType) UnmarshalText(b []byte) error {
	return unmarshalEnum(p, b, ParsePositionEmbeddingType)
}

// Set makes *PositionEmbeddingType a flag.Value (--position-embedding-type).
func (p *PositionEmbeddingType) Set(s string) error {
	i, err := parseEnum(positionEmbeddingNames, s)
	if err == nil {
		*p = PositionEmbeddingType(i)
	}
	return err
}

// RopeType is multi-latent attention's --rope-type.
type RopeType uint8

const (
	Yarn      RopeType = iota // YaRN rotary embeddings, MLA's default
	PlainRoPE                 // "rope": rotary embeddings without YaRN
)

var ropeTypeNames = []string{Yarn: "yarn", PlainRoPE: "rope"}

// ParseRopeType parses --rope-type: "yarn" or "rope".
func ParseRopeType(s string) (RopeType, error) {
	i, err := parseEnum(ropeTypeNames, s)
	if err != nil {
		return 0, fmt.Errorf("--rope-type=%q: %v", s, err)
	}
	return RopeType(i), nil
}

// String returns Megatron's spelling.
func (r RopeType) String() string { return enumString("RopeType", ropeTypeNames, r) }
func (r RopeType) valid() bool    { return int(r) < len(ropeTypeNames) }

// MarshalText writes String's spelling; a value outside the enum is an error.
func (r RopeType) MarshalText() ([]byte, error) {
	return marshalEnum("--rope-type", ropeTypeNames, r)
}

// UnmarshalText parses ParseRopeType's spellings; empty text is the zero
// value.
func (r *RopeType) UnmarshalText(b []byte) error {
	return unmarshalEnum(r, b, ParseRopeType)
}

// parseEnum finds s among names; the error lists the names, for the
// caller to prefix with the flag and s.
func parseEnum(names []string, s string) (int, error) {
	for i, n := range names {
		if n == s {
			return i, nil
		}
	}
	list := strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
	return 0, fmt.Errorf("want %s", list)
}

func enumString[E ~uint8](typ string, names []string, v E) string {
	if int(v) < len(names) {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, v)
}

func marshalEnum[E ~uint8](flag string, names []string, v E) ([]byte, error) {
	if int(v) >= len(names) {
		return nil, fmt.Errorf("gpt: %s: invalid value %d", flag, v)
	}
	return []byte(names[v]), nil
}

func unmarshalEnum[E ~uint8](v *E, b []byte, parse func(string) (E, error)) error {
	if len(b) == 0 {
		*v = 0
		return nil
	}
	x, err := parse(string(b))
	if err != nil {
		return fmt.Errorf("gpt: %w", err)
	}
	*v = x
	return nil
}
