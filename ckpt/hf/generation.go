package hf

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// GenerationConfigFile is transformers' generation defaults file.
const GenerationConfigFile = "generation_config.json"

// WriteGenerationConfig writes dir/generation_config.json as transformers'
// GenerationConfig.from_model_config does for a model without one: the
// begin- and end-of-sequence ids (bos < 0: none; eos < 0: none), mode 0644.
func WriteGenerationConfig(dir string, bos, eos int) error {
	gc := map[string]any{"_from_model_config": true}
	if bos >= 0 {
		gc["bos_token_id"] = bos
	}
	if eos >= 0 {
		gc["eos_token_id"] = eos
	}
	b, err := json.MarshalIndent(gc, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, GenerationConfigFile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	return nil
}
